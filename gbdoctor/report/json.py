"""``--format json``: the scan report as byte-stable JSON, plus derived ``totals``; and its loader.

The document is ``serialize.to_jsonable(report)`` with one extra top-level key, ``totals``
(from :func:`gbdoctor.summary.summarize`). Keys are sorted, indentation is 2 spaces, there is a
trailing newline and no timestamp, so equal reports give identical bytes. ``load_scan_json``
reads it back (``totals`` is derived and ignored) for ``gbdoctor diff`` and the tests.
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

from gbdoctor.errors import BaselineError
from gbdoctor.records import SCHEMA_VERSION, ScanReport
from gbdoctor.report import serialize
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
    data = serialize.to_jsonable(report)
    data["totals"] = totals(summarize(report))
    return serialize.dumps(data)


class JsonFormat:
    """Formatter for ``--format json``."""

    def render(self, report: ScanReport) -> str:
        return render_json(report)


# --------------------------------------------------------------------------- loading


def _read(source: str | Path) -> tuple[str, str]:
    """(text, name for messages). A str that looks like a JSON document is the text itself."""
    if isinstance(source, str) and source.lstrip().startswith(("{", "[")):
        return source, "scan JSON"
    path = Path(source)
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except FileNotFoundError:
        raise BaselineError(f"{path}: no such scan file",
                            hint="write one with `gbdoctor scan SPEC --format json -o FILE`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{path}: cannot read scan file ({exc.__class__.__name__}: {exc})") from None


def _check(tp: Any, value: Any, where: str) -> None:
    """Type check of a rebuilt record against its annotations (from_dict does not check leaves)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _check(args[0], value, where)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            for i, item in enumerate(value):
                _check(args[0], item, f"{where}[{i}]")
            return
        if len(value) != len(args):
            raise BaselineError(f"{where}: expected {len(args)} items, got {len(value)}")
        for i, (arg, item) in enumerate(zip(args, value)):
            _check(arg, item, f"{where}[{i}]")
        return
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            _check(hints[f.name], getattr(value, f.name), f"{where}.{f.name}")
        return
    expected = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}.get(tp)
    if expected is None:
        return
    if not isinstance(value, expected) or (tp is not bool and isinstance(value, bool)):
        raise BaselineError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")


def load_scan_json(source: str | Path) -> ScanReport:
    """A :class:`ScanReport` from ``--format json`` output: a path, or the JSON text itself.

    Raises :class:`BaselineError` (exit 2) with a one-line message for an unreadable file,
    malformed JSON, a wrong ``schema_version``, and missing, unknown or mistyped keys.
    """
    text, name = _read(source)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{name}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise BaselineError(f"{name}: expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version is None:
        raise BaselineError(f"{name}: missing key 'schema_version' (not a gbdoctor scan?)")
    if version != SCHEMA_VERSION:
        raise BaselineError(
            f"{name}: scan schema_version {version!r}, this gbdoctor reads {SCHEMA_VERSION}",
            hint="re-run the scan with this gbdoctor version",
        )
    data = {k: v for k, v in data.items() if k not in DERIVED_KEYS}
    try:
        report = serialize.from_dict(ScanReport, data, "$")
        _check(ScanReport, report, "$")
    except BaselineError as exc:
        raise BaselineError(f"{name}: {exc.message}", hint=exc.hint) from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise BaselineError(f"{name}: malformed scan ({exc})") from None
    return report
