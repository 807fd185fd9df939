"""The result files an HTML report is made of: which command wrote a JSON file (scan, plan,
run or gate), read back into its record with the same checks as the command's own reader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gbdoctor.errors import BaselineError
from gbdoctor.records import (
    PLAN_SCHEMA_VERSION,
    READABLE_PLAN_SCHEMA_VERSIONS,
    READABLE_RUN_SCHEMA_VERSIONS,
    RUN_SCHEMA_VERSION,
    GateResult,
    Plan,
    RunReport,
    ScanReport,
)
from gbdoctor.records.io import check_schema_version, load_record, parse_json_object, read_text
from gbdoctor.report.json import load_scan_json

__all__ = ["Document", "DocumentKind", "load_document", "document_kind"]

DocumentKind = str
"""``scan``, ``plan``, ``run``, ``gate`` or ``timeline``."""

_GATE_DERIVED = ("passed", "exit_code", "counts")
"""Keys ``gate --format json`` adds from the result's own properties."""
_HINT = "give JSON written by `gbdoctor scan|run|gate --format json` or `plan --emit-config json`"


@dataclass(frozen=True)
class Document:
    """One result to show: its record, where it came from, its JSON text (the page's twin)."""

    kind: DocumentKind
    record: ScanReport | Plan | RunReport | GateResult | Any
    """``Any``: a timeline (``gbdoctor.records.timeline``, read where this gbdoctor has it)."""
    name: str
    """The file's name as given (or the command that made it)."""
    json_text: str
    emitted: tuple[tuple[str, str], ...] = ()
    """Plans: (emitter, config text) the plan emits, shown as they would be written."""


def document_kind(data: dict[str, Any]) -> DocumentKind | None:
    """Which command wrote ``data``, from the keys only that command's document has."""
    if "blocks" in data and "setup" in data:
        return "scan"
    if "kinds" in data and "baseline_strategy" in data:
        return "plan"
    if "modes" in data and "tokens_per_step" in data:
        return "run"
    if "findings" in data and "strict_improvements" in data:
        return "gate"
    if "steps" in data and "periods" in data and "frames" in data:
        return "timeline"
    return None


def load_document(path: str | Path) -> Document:
    """A result file as a :class:`Document`; :class:`BaselineError` (exit 2) with one line for a
    file that is not one of gbdoctor's results, or malformed."""
    name = str(path)
    text = read_text(path, "result", hint=_HINT)
    data = parse_json_object(text, name, hint=_HINT)
    kind = document_kind(data)
    record: Any
    if kind == "scan":
        record = load_scan_json(path)
    elif kind == "plan":
        check_schema_version(data, READABLE_PLAN_SCHEMA_VERSIONS, name, "plan", hint=_HINT)
        record = load_record(
            Plan, data | {"schema_version": PLAN_SCHEMA_VERSION}, name, counts=True
        )
    elif kind == "run":
        check_schema_version(data, READABLE_RUN_SCHEMA_VERSIONS, name, "run", hint=_HINT)
        record = load_record(RunReport, data | {"schema_version": RUN_SCHEMA_VERSION}, name)
    elif kind == "gate":
        record = load_record(GateResult, data, name, ignore=_GATE_DERIVED, counts=True)
    elif kind == "timeline":
        record = _load_timeline(data, name)
    else:
        raise BaselineError(f"{name}: not a gbdoctor scan, plan, run or gate result", hint=_HINT)
    return Document(kind, record, name, text)


def _load_timeline(data: dict[str, Any], name: str) -> Any:
    """A ``gbdoctor timeline`` result, by the records of the gbdoctor that wrote it."""
    import importlib

    try:
        timeline = importlib.import_module("gbdoctor.records.timeline")
    except ImportError:
        raise BaselineError(
            f"{name}: a timeline result, which this gbdoctor cannot read", hint=_HINT
        ) from None
    versions = timeline.READABLE_TIMELINE_SCHEMA_VERSIONS
    check_schema_version(data, versions, name, "timeline", hint=_HINT)
    return load_record(timeline.TimelineReport, data, name)
