"""``--format json``: the scan report as byte-stable JSON, plus derived ``totals``; and its loader.

The document is ``records.io.to_jsonable(report)`` with one extra top-level key, ``totals``
(from :func:`gbdoctor.summary.summarize`). Keys are sorted, indentation is 2 spaces, there is a
trailing newline and no timestamp, so equal reports give identical bytes. ``load_scan_json``
reads it back (``totals`` is derived and ignored) for ``gbdoctor diff`` and the tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gbdoctor.records import READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION, ScanReport
from gbdoctor.records.io import (
    check_schema_version,
    dumps,
    load_record,
    parse_json_object,
    read_text,
    to_jsonable,
)
from gbdoctor.summary import ScanSummary, summarize

__all__ = ["JsonFormat", "load_scan_json", "render_json", "totals"]

DERIVED_KEYS = ("totals",)
"""Top-level keys added by :func:`render_json` and dropped by :func:`load_scan_json`."""


def totals(summary: ScanSummary) -> dict[str, Any]:
    """The ``totals`` object: breaks, breaks by cause, events by kind, errors, graphs."""
    return {
        "breaks": summary.breaks,
        "by_cause": dict(summary.by_cause),
        "errors": summary.errors,
        "events": dict(summary.events_by_kind),
        "graphs": summary.graphs,
    }


def render_json(report: ScanReport) -> str:
    """Byte-stable JSON text of the report plus its ``totals``."""
    data = to_jsonable(report)
    data["totals"] = totals(summarize(report))
    return dumps(data)


class JsonFormat:
    """Formatter for ``--format json``."""

    def render(self, report: ScanReport) -> str:
        return render_json(report)


# --------------------------------------------------------------------------- loading


def load_scan_json(source: str | Path) -> ScanReport:
    """A :class:`ScanReport` from ``--format json`` output: a path, or the JSON text itself.

    Raises :class:`BaselineError` (exit 2) with a one-line message for an unreadable file,
    malformed JSON, a wrong ``schema_version``, missing, unknown or mistyped keys, and
    impossible values (a negative count or line, a non-finite number).
    """
    if isinstance(source, str) and source.lstrip().startswith(("{", "[")):
        text, name = source, "scan JSON"
    else:
        text = read_text(
            source, "scan", hint="write one with `gbdoctor scan SPEC --format json -o FILE`"
        )
        name = str(source)
    data = parse_json_object(text, name)
    check_schema_version(
        data,
        READABLE_SCHEMA_VERSIONS,
        name,
        "scan",
        hint="re-run the scan with this gbdoctor version",
    )
    # Versions 1 and 2 lack what later versions added (with defaults): it is read as the current version.
    data = data | {"schema_version": SCHEMA_VERSION}
    return load_record(ScanReport, data, name, ignore=DERIVED_KEYS, counts=True)
