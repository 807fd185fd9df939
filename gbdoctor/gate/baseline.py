"""The baseline file: built from scans, merged, written (byte-stable, under a lock) and read
back (strictly, schema versions 1 to 3).

A baseline keeps, per spec and block kind, the numbers of ONE representative block (for each
key the worst block of the kind; every layer of a kind is identical when the scan deduplicates),
so adding layers of a known kind is not a regression while a new break in the kind is.
Each break entry keeps its cause, gb_type, gb id, user location and checkpoint flag (never the
message text): the comparison matches a break by cause + gb_type wherever its line moved, and
by cause + location + checkpoint flag when torch renamed its gb_type (``compare.py``), so a
baseline survives torch upgrades and unrelated edits. Layout (byte-stable JSON)::

    {
      "schema_version": 3,
      "simulated": [],
      "specs": {
        "fixtures/llama4_debug.toml": {
          "moe": {
            "breaks": [
              {"cause": "fsdp-hook", "count": 1, "gb_id": "GB0007",
               "gb_type": "Attempted to call function marked as skipped",
               "in_checkpoint": false, "location": "gbdoctor/models/moe.py:257"}
            ],
            "error": false,
            "events": {"region_eager": 1},
            "graph_count": 3,
            "layers": 2
          }
        }
      },
      "torch_version": "2.13.0"
    }

Baselines of schema 1 (no recompile counts) are still read: their steady count is taken as 0
and their total as unknown. Schemas 1 and 2 key breaks ``{"<cause>|<gb_type>": count}``: read
with location and checkpoint flag unknown, they are matched by cause and gb_type (and by the
rename table, ``causes/renames.py``). ``simulated`` lists the specs recorded from simulated scans (the
comparison refuses to compare a real scan with a simulated entry).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gbdoctor.errors import BaselineError
from gbdoctor.gate.counts import kind_counts, sorted_kinds, spec_key
from gbdoctor.gate.pins import current_pins
from gbdoctor.records import (
    BASELINE_SCHEMA_VERSION,
    Baseline,
    BreakCount,
    KindCounts,
    ScanReport,
)
from gbdoctor.records.atomic_write import check_writable, locked, write_atomic
from gbdoctor.records.gate import READABLE_BASELINE_VERSIONS
from gbdoctor.records.io import check_schema_version, parse_json_object, read_text


def baseline_from_reports(
    reports: Iterable[ScanReport], pins: tuple[tuple[str, Any], ...] | None = None
) -> Baseline:
    """The baseline that accepts exactly these scans (``--update-baseline``), pinning the
    Dynamo settings they ran under (``pins``; default: this torch's current values)."""
    reports = list(reports)
    specs: dict[str, dict[str, KindCounts]] = {}
    for report in reports:
        key = spec_key(report.spec)
        if key in specs:
            raise BaselineError(f"two scans for spec {key!r}: a baseline holds one scan per spec")
        specs[key] = kind_counts(report)
    torch_version = reports[0].torch_version if reports else ""
    return Baseline(
        torch_version=torch_version,
        specs=tuple(sorted((k, sorted_kinds(v)) for k, v in specs.items())),
        dynamo_config=current_pins() if pins is None else pins,
        simulated=tuple(sorted(spec_key(r.spec) for r in reports if r.setup.simulated)),
    )


def merge_baselines(old: Baseline | None, new: Baseline) -> Baseline:
    """``old`` with the specs of ``new`` replaced or added (other specs are kept)."""
    if old is None:
        return new
    specs = dict(old.specs)
    specs.update(dict(new.specs))
    replaced = {key for key, _ in new.specs}
    simulated = {k for k in old.simulated or () if k not in replaced} | set(new.simulated or ())
    return Baseline(
        torch_version=new.torch_version,
        specs=tuple(sorted(specs.items())),
        dynamo_config=new.dynamo_config,
        simulated=tuple(sorted(simulated)),
    )


def _break_data(brk: BreakCount) -> dict[str, Any]:
    return {
        "cause": brk.cause,
        "gb_type": brk.gb_type,
        "gb_id": brk.gb_id,
        "location": brk.location,
        # null: carried over from a schema-1/2 baseline by a merge (not known).
        "in_checkpoint": brk.in_checkpoint,
        "count": brk.count,
    }


def _baseline_data(baseline: Baseline) -> dict[str, Any]:
    pins = {"dynamo_config": dict(baseline.dynamo_config)} if baseline.dynamo_config else {}
    simulated = {} if baseline.simulated is None else {"simulated": list(baseline.simulated)}
    return {
        "schema_version": baseline.schema_version,
        "torch_version": baseline.torch_version,
        **pins,
        **simulated,
        "specs": {
            spec: {
                kind: {
                    "layers": c.layers,
                    "graph_count": c.graph_count,
                    "breaks": [_break_data(b) for b in sorted(c.breaks, key=lambda b: b.order)],
                    "events": dict(c.events),
                    "error": c.error,
                }
                # Scans without the recompile probe leave the counts unknown (keys omitted).
                | (
                    {}
                    if c.recompiles is None
                    else {
                        "recompiles": c.recompiles,
                        "steady_recompiles": c.steady_recompiles or 0,
                    }
                )
                for kind, c in kinds
            }
            for spec, kinds in baseline.specs
        },
    }


def dump_baseline(baseline: Baseline) -> str:
    """Byte-stable JSON text (sorted keys, 2-space indent, trailing newline, no timestamps)."""
    return json.dumps(_baseline_data(baseline), sort_keys=True, indent=2, ensure_ascii=True) + "\n"


_REGENERATE = "regenerate it with --update-baseline"


def _expect(cond: bool, name: str, where: str, what: str) -> None:
    if not cond:
        raise BaselineError(f"{name}: {where}: {what}", hint=_REGENERATE)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _counts(value: Any, name: str, where: str, *, pipe: bool) -> tuple[tuple[str, int], ...]:
    _expect(isinstance(value, dict), name, where, "expected an object of counts")
    for key, n in value.items():
        _expect(_is_int(n), name, f"{where}.{key}", "expected a non-negative integer")
        _expect(
            not pipe or "|" in key, name, f"{where}.{key}", "expected a '<cause>|<gb_type>' key"
        )
    return tuple(sorted(value.items()))


_BREAK_KEYS = {"cause", "gb_type", "gb_id", "location", "in_checkpoint", "count"}


def _breaks(value: Any, name: str, where: str, version: int) -> tuple[BreakCount, ...]:
    if version < 3:
        # Schemas 1 and 2: {"<cause>|<gb_type>": count}, no location or checkpoint flag.
        return tuple(
            BreakCount(cause=key.partition("|")[0], gb_type=key.partition("|")[2], count=n)
            for key, n in _counts(value, name, where, pipe=True)
        )
    _expect(isinstance(value, list), name, where, "expected a list of break entries")
    out = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        _expect(isinstance(entry, dict), name, at, "expected an object")
        missing, unknown = sorted(_BREAK_KEYS - set(entry)), sorted(set(entry) - _BREAK_KEYS)
        _expect(not missing, name, at, f"missing key(s) {missing}")
        _expect(not unknown, name, at, f"unknown key(s) {unknown}")
        for key in ("cause", "gb_type"):
            _expect(isinstance(entry[key], str), name, f"{at}.{key}", "expected a string")
        for key in ("gb_id", "location"):
            _expect(
                entry[key] is None or isinstance(entry[key], str),
                name,
                f"{at}.{key}",
                "expected a string or null",
            )
        _expect(
            entry["in_checkpoint"] is None or isinstance(entry["in_checkpoint"], bool),
            name,
            f"{at}.in_checkpoint",
            "expected true, false or null",
        )
        _expect(_is_int(entry["count"]), name, f"{at}.count", "expected a non-negative integer")
        out.append(BreakCount(**entry))
    return tuple(sorted(out, key=lambda b: b.order))


_KIND_KEYS_V1 = {"layers", "graph_count", "breaks", "events", "error"}
_KIND_KEYS = _KIND_KEYS_V1 | {"recompiles", "steady_recompiles"}


def _kind(value: Any, name: str, where: str, version: int = BASELINE_SCHEMA_VERSION) -> KindCounts:
    _expect(isinstance(value, dict), name, where, "expected an object")
    # Version 2 may omit both recompile counts (the scans ran without the recompile probe).
    counted = version >= 2 and ("recompiles" in value or "steady_recompiles" in value)
    keys = _KIND_KEYS if counted else _KIND_KEYS_V1
    allowed = _KIND_KEYS if version >= 2 else _KIND_KEYS_V1
    missing, unknown = sorted(keys - set(value)), sorted(set(value) - allowed)
    _expect(not missing, name, where, f"missing key(s) {missing}")
    _expect(not unknown, name, where, f"unknown key(s) {unknown}")
    _expect(_is_int(value["layers"]), name, f"{where}.layers", "expected a non-negative integer")
    _expect(
        _is_int(value["graph_count"]),
        name,
        f"{where}.graph_count",
        "expected a non-negative integer",
    )
    _expect(isinstance(value["error"], bool), name, f"{where}.error", "expected true or false")
    for key in ("recompiles", "steady_recompiles"):
        if key in value:
            _expect(_is_int(value[key]), name, f"{where}.{key}", "expected a non-negative integer")
    return KindCounts(
        layers=value["layers"],
        graph_count=value["graph_count"],
        breaks=_breaks(value["breaks"], name, f"{where}.breaks", version),
        events=_counts(value["events"], name, f"{where}.events", pipe=False),
        error=value["error"],
        recompiles=value.get("recompiles"),
        steady_recompiles=value.get("steady_recompiles"),
    )


def parse_baseline(text: str, name: str = "baseline") -> Baseline:
    """A :class:`Baseline` from JSON text; :class:`BaselineError` naming what is wrong."""
    data = parse_json_object(text, name, hint=_REGENERATE)
    if "blocks" in data and "specs" not in data:
        raise BaselineError(
            f"{name}: this is a scan report, not a baseline",
            hint="create a baseline with `gbdoctor gate SPEC --baseline FILE --update-baseline`",
        )
    check_schema_version(data, READABLE_BASELINE_VERSIONS, name, "baseline", hint=_REGENERATE)
    version = data["schema_version"]
    unknown = sorted(
        set(data) - {"schema_version", "torch_version", "dynamo_config", "specs", "simulated"}
    )
    _expect(not unknown, name, "$", f"unknown key(s) {unknown}")
    _expect("specs" in data, name, "$", "missing key 'specs'")
    _expect(
        isinstance(data.get("torch_version", ""), str), name, "$.torch_version", "expected a string"
    )
    _expect(isinstance(data["specs"], dict), name, "$.specs", "expected an object of specs")
    specs = []
    for spec, kinds in sorted(data["specs"].items()):
        where = f"$.specs[{spec!r}]"
        _expect(isinstance(kinds, dict), name, where, "expected an object of block kinds")
        specs.append(
            (
                spec,
                tuple(
                    (kind, _kind(v, name, f"{where}[{kind!r}]", version))
                    for kind, v in sorted(kinds.items())
                ),
            )
        )
    pins = data.get("dynamo_config", {})
    _expect(
        isinstance(pins, dict)
        and all(isinstance(v, (bool, int, float, str, type(None))) for v in pins.values()),
        name,
        "$.dynamo_config",
        "expected an object of Dynamo setting -> scalar value",
    )
    simulated = data.get("simulated")
    _expect(
        simulated is None
        or (isinstance(simulated, list) and all(isinstance(k, str) for k in simulated)),
        name,
        "$.simulated",
        "expected a list of spec keys",
    )
    return Baseline(
        torch_version=data.get("torch_version", ""),
        specs=tuple(specs),
        dynamo_config=tuple(sorted(pins.items())),
        simulated=None if simulated is None else tuple(sorted(simulated)),
    )


def load_baseline(path: str | Path) -> Baseline:
    """Read a baseline file; :class:`BaselineError` (exit 2) for a missing, unreadable or malformed file."""
    hint = "create it with `gbdoctor gate SPEC --baseline FILE --update-baseline`"
    return parse_baseline(read_text(path, "baseline", hint), str(path))


def open_baseline(path: Path, *, update: bool) -> Baseline | None:
    """The ``--baseline`` file's contents, read before any scan starts so that a bad file costs
    no scan: required when checking; when updating it may not exist yet (None), but its
    location must be writable."""
    if not update:
        return load_baseline(path)
    check_writable(path, "baseline")
    return load_baseline(path) if path.exists() else None


def record_baseline(
    path: Path, reports: Iterable[ScanReport], pins: tuple[tuple[str, Any], ...]
) -> Baseline:
    """Merge these scans into the baseline file (its other specs are kept) and write it.

    Read-merge-write under the file's lock: a concurrent update must not lose an entry."""
    with locked(path):
        old = load_baseline(path) if path.exists() else None
        merged = merge_baselines(old, baseline_from_reports(reports, pins))
        write_atomic(path, dump_baseline(merged), "baseline")
    return merged
