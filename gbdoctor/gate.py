"""The pre-merge check: compare scans against a recorded baseline. Pure logic, no torch.

A baseline keeps, per spec and block kind, the numbers of ONE representative block (for each
key the worst block of the kind; every layer of a kind is identical when the scan deduplicates),
so adding layers of a known kind is not a regression while a new break in the kind is.
Breaks are keyed by ``"<cause>|<gb_type>"``: never the message text or a line number, so
a baseline survives torch upgrades and unrelated edits. Layout (byte-stable JSON)::

    {
      "schema_version": 2,
      "simulated": [],
      "specs": {
        "fixtures/llama4_debug.toml": {
          "moe": {
            "breaks": {"fsdp-hook|Skip calling `torch.compiler.disable()`d function": 2},
            "error": false,
            "events": {"region_eager": 1},
            "graph_count": 3,
            "layers": 2
          }
        }
      },
      "torch_version": "2.13.0"
    }

The gate fails (exit 1) when, for any spec and kind, a break key's count rises, a cause or a
gb_type appears that the baseline lacked, a ``region_eager`` or ``frame_skipped`` event count
rises, a block that traced now errors, or a scanned spec is missing from the baseline.
With ``recompiles`` it also fails when a kind's block recompiles more in the scan's probe steps
(``scan/probe.py``: the block run again with changed inputs) than the baseline accepted, and
above all when it recompiles in the last probe step, i.e. on every training step
(``steady_recompiles``). Improvements are reported and fail only with ``strict_improvements``; a
torch version other than the baseline's is a warning. Baselines of schema 1 (no recompile
counts) are still read: their steady count is taken as 0 and their total as unknown.
``simulated`` lists the specs recorded from simulated scans: a real scan against a simulated
entry (or the other way round) is an error (exit 2), not a diff.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from gbdoctor.errors import BaselineError
from gbdoctor.records import (
    BASELINE_SCHEMA_VERSION,
    SEVERITIES,
    Baseline,
    Break,
    EventKind,
    Finding,
    GateResult,
    KindCounts,
    Location,
    ScanReport,
    Severity,
)
from gbdoctor.records.gate import READABLE_BASELINE_VERSIONS
from gbdoctor.records.io import check_schema_version, parse_json_object, read_text
from gbdoctor.summary import fix_hint, group_by_kind

__all__ = [
    "BASELINE_SCHEMA_VERSION",
    "FAILING_EVENTS",
    "SEVERITIES",
    "Baseline",
    "Finding",
    "GateResult",
    "KindCounts",
    "baseline_from_reports",
    "break_key",
    "check_gate",
    "diff_reports",
    "dump_baseline",
    "kind_counts",
    "load_baseline",
    "merge_baselines",
    "parse_baseline",
    "spec_key",
]

FAILING_EVENTS = (EventKind.REGION_EAGER, EventKind.FRAME_SKIPPED, EventKind.RECOMPILE_LIMIT)
"""Event kinds whose rising count fails the gate; other kinds (rank_divergence) warn."""

_EMPTY = KindCounts(layers=0, graph_count=0)
_UPDATE_HINT = "review the change, then accept it with --update-baseline"


# --------------------------------------------------------------------------- keys and counts


def spec_key(path: str, *, root: str | Path | None = None) -> str:
    """The spec path as recorded (scans record it relative to the spec's repository,
    ``Spec.key``), in POSIX form; an absolute path is made relative to ``root`` when given and
    under it. Never relative to the working directory."""
    text = posixpath.normpath(str(path).replace("\\", "/"))
    posix = PurePosixPath(text)
    if posix.is_absolute() and root is not None:
        base = PurePosixPath(Path(root).resolve().as_posix())
        try:
            return str(posix.relative_to(base))
        except ValueError:
            return text
    return text


def break_key(brk: Break) -> str:
    """``"<cause>|<gb_type>"``: how the baseline keys a break."""
    return f"{brk.cause}|{brk.gb_type}"


def kind_counts(report: ScanReport) -> dict[str, KindCounts]:
    """Kind -> counts of its representative block (for every key, the worst block of the kind)."""
    out = {}
    probed = report.setup.probed_recompiles  # else the counts are unknown, not 0
    for kind, blocks in group_by_kind(report).items():
        breaks: dict[str, int] = {}
        events: dict[str, int] = {}
        for block in blocks:
            per_block = Counter()
            for brk in block.breaks:
                per_block[break_key(brk)] += brk.count
            for key, n in per_block.items():
                breaks[key] = max(breaks.get(key, 0), n)
            for key, n in Counter(e.kind for e in block.events).items():
                events[key] = max(events.get(key, 0), n)
        out[kind] = KindCounts(
            layers=len(blocks),
            graph_count=max(block.graph_count for block in blocks),
            breaks=tuple(sorted(breaks.items())),
            events=tuple(sorted(events.items())),
            error=any(block.error is not None for block in blocks),
            recompiles=max(len(block.recompiles) for block in blocks) if probed else None,
            steady_recompiles=(
                max(sum(r.measured for r in block.recompiles) for block in blocks)
                if probed
                else None
            ),
        )
    return out


def _sorted_kinds(kinds: dict[str, KindCounts]) -> tuple[tuple[str, KindCounts], ...]:
    return tuple(sorted(kinds.items()))


# --------------------------------------------------------------------------- baseline files


PINNED_DYNAMO = ("nested_graph_breaks",)
"""Dynamo settings a baseline pins: their defaults move between torch releases and change
where and how often Dynamo breaks (``nested_graph_breaks`` turns a break in a nested call into
breaks in every enclosing frame or none), so counts are only comparable under the same value."""

PINS_ENV = "GBDOCTOR_DYNAMO_PINS"
"""JSON object of pinned Dynamo settings, inherited by spawned ranks (``setup.dist``)."""


def current_pins() -> tuple[tuple[str, Any], ...]:
    """This torch's values of the pinned settings it knows."""
    import torch._dynamo

    config = torch._dynamo.config
    return tuple(sorted((k, getattr(config, k)) for k in PINNED_DYNAMO if hasattr(config, k)))


@contextlib.contextmanager
def pinned_dynamo(pins: tuple[tuple[str, Any], ...]) -> Iterator[tuple[str, ...]]:
    """Scan under the baseline's pinned settings (here and in spawned ranks); yields the pinned
    names this torch does not know (the counts may then differ for that reason)."""
    import torch._dynamo

    known = {k: v for k, v in pins if hasattr(torch._dynamo.config, k)}
    unknown = tuple(k for k, _ in pins if k not in known)
    old_env = os.environ.get(PINS_ENV)
    os.environ[PINS_ENV] = json.dumps(known, sort_keys=True)
    try:
        with torch._dynamo.config.patch(**known):
            yield unknown
    finally:
        if old_env is None:
            os.environ.pop(PINS_ENV, None)
        else:
            os.environ[PINS_ENV] = old_env


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
        specs=tuple(sorted((k, _sorted_kinds(v)) for k, v in specs.items())),
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
                    "breaks": dict(c.breaks),
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
        breaks=_counts(value["breaks"], name, f"{where}.breaks", pipe=True),
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


# --------------------------------------------------------------------------- comparison


def _locations(
    report: ScanReport | None, kind: str, *, key: str | None = None, event: str | None = None
) -> tuple[Location, ...]:
    """Distinct file:line of the breaks (by key) or events (by kind) of a kind's blocks."""
    if report is None:
        return ()
    found: dict[Location, None] = {}
    for block in report.blocks:
        if block.kind != kind:
            continue
        if key is not None:
            found.update(
                (b.location, None) for b in block.breaks if b.location and break_key(b) == key
            )
        if event is not None:
            found.update((e.location, None) for e in block.events if e.location and e.kind == event)
    return tuple(sorted(found, key=lambda loc: (loc.file, loc.line, loc.function)))


def _compare_kind(
    spec: str,
    kind: str,
    old: KindCounts,
    new: KindCounts,
    *,
    new_report: ScanReport | None,
    old_report: ScanReport | None,
    recompiles: bool,
) -> list[Finding]:
    out: list[Finding] = []

    def add(severity: str, what: str, **kw: Any) -> None:
        out.append(Finding(severity=severity, spec=spec, kind=kind, what=what, **kw))

    if old.layers and new.layers != old.layers:
        add(Severity.INFO, f"layers {old.layers} -> {new.layers}")
    if new.error and not old.error:
        add(Severity.REGRESSION, "block now errors", cause="error", hint=fix_hint("error"))
    elif old.error and not new.error:
        add(Severity.IMPROVEMENT, "block traces again", cause="error", hint=_UPDATE_HINT)
    if old.error or new.error:
        # No trustworthy break counts on the side that errored: the error finding says it all.
        if old.error and not new.error and new.break_count:
            add(Severity.INFO, f"break count (unknown) -> {new.break_count}")
        return out

    old_breaks, new_breaks = dict(old.breaks), dict(new.breaks)
    old_causes = old.causes
    for key in sorted(set(old_breaks) | set(new_breaks)):
        was, now = old_breaks.get(key, 0), new_breaks.get(key, 0)
        if was == now:
            continue
        cause, _, gb_type = key.partition("|")
        if now > was:
            if was == 0 and cause not in old_causes:
                what = f"new cause {cause} (breaks 0 -> {now})"
            elif was == 0:
                what = f"new gb_type {gb_type!r} (breaks 0 -> {now})"
            else:
                what = f"break count {was} -> {now}"
            add(
                Severity.REGRESSION,
                what,
                cause=cause,
                gb_type=gb_type,
                hint=fix_hint(cause),
                locations=_locations(new_report, kind, key=key),
            )
        else:
            what = (
                f"cause {cause} gone (breaks {was} -> 0)"
                if now == 0 and cause not in new.causes
                else f"break count {was} -> {now}"
            )
            add(
                Severity.IMPROVEMENT,
                what,
                cause=cause,
                gb_type=gb_type,
                hint=_UPDATE_HINT,
                locations=_locations(old_report, kind, key=key),
            )

    old_events, new_events = dict(old.events), dict(new.events)
    for name in sorted(set(old_events) | set(new_events)):
        was, now = old_events.get(name, 0), new_events.get(name, 0)
        if now > was:
            what = f"new event {name}" if was == 0 else f"event {name} count {was} -> {now}"
            add(
                Severity.REGRESSION if name in FAILING_EVENTS else Severity.WARNING,
                what,
                locations=_locations(new_report, kind, event=name),
                hint="a break inside the region sent it to eager; fix the breaks listed for this kind"
                if name in FAILING_EVENTS
                else "",
            )
        elif now < was:
            what = f"event {name} gone" if now == 0 else f"event {name} count {was} -> {now}"
            add(
                Severity.IMPROVEMENT,
                what,
                hint=_UPDATE_HINT,
                locations=_locations(old_report, kind, event=name),
            )

    if new.graph_count != old.graph_count and old.layers:
        add(Severity.INFO, f"graph count {old.graph_count} -> {new.graph_count}")
    _compare_recompiles(add, kind, old, new, new_report, recompiles)
    return out


def _recompile_locations(
    report: ScanReport | None, kind: str, *, steady: bool
) -> tuple[Location, ...]:
    found: dict[Location, None] = {}
    for block in report.blocks if report is not None else ():
        for rec in block.recompiles if block.kind == kind else ():
            if rec.location and (rec.measured or not steady):
                file, _, line = rec.location.rpartition(":")
                found[Location(file=file, line=int(line) if line.isdigit() else 0)] = None
    return tuple(sorted(found, key=lambda loc: (loc.file, loc.line)))


def _first_recompile(report: ScanReport | None, kind: str, *, steady: bool) -> str:
    for block in report.blocks if report is not None else ():
        for rec in block.recompiles if block.kind == kind else ():
            if rec.measured or not steady:
                where = f" at {rec.location}" if rec.location else ""
                return f" (first: {rec.reason}{where})"
    return ""


def _compare_recompiles(
    add: Any,
    kind: str,
    old: KindCounts,
    new: KindCounts,
    new_report: ScanReport | None,
    gate: bool,
) -> None:
    """Recompile findings via ``add``; regressions only with ``gate`` (``--recompiles``).
    Nothing when the new scan ran without the probe (``require_probe`` refuses that under
    ``--recompiles``)."""
    if new.recompiles is None:
        return
    severity = Severity.REGRESSION if gate else Severity.INFO
    was_steady, now_steady = old.steady_recompiles or 0, new.steady_recompiles or 0
    if now_steady > was_steady:
        add(
            severity,
            f"recompiles on every step ({was_steady} -> {now_steady} in the last probe step)"
            + _first_recompile(new_report, kind, steady=True),
            locations=_recompile_locations(new_report, kind, steady=True),
            hint="a guard fails on every training step; after recompile_limit (8) Dynamo runs the "
            "frame eagerly: make the changing value a tensor or stop the model from changing it",
        )
    elif now_steady < was_steady:
        add(
            Severity.IMPROVEMENT,
            f"steady recompiles {was_steady} -> {now_steady}",
            hint=_UPDATE_HINT,
        )
    now = new.recompiles or 0
    if old.recompiles is None:
        if now:
            add(
                Severity.INFO,
                f"recompiles with changed inputs: {now} (the baseline has no recompile counts; "
                "regenerate it with --update-baseline)",
            )
    elif now > old.recompiles and now_steady <= was_steady:
        add(
            severity,
            f"recompiles with changed inputs {old.recompiles} -> {now}"
            + _first_recompile(new_report, kind, steady=False),
            locations=_recompile_locations(new_report, kind, steady=False),
            hint="a new guard fails when the data or sequence length changes; each is a compile "
            "in training",
        )
    elif now < old.recompiles:
        add(
            Severity.IMPROVEMENT,
            f"recompiles with changed inputs {old.recompiles} -> {now}",
            hint=_UPDATE_HINT,
        )


def _compare_spec(
    spec: str,
    old: dict[str, KindCounts],
    new: dict[str, KindCounts],
    *,
    new_report: ScanReport | None = None,
    old_report: ScanReport | None = None,
    recompiles: bool = False,
) -> list[Finding]:
    out: list[Finding] = []
    for kind in new:
        if kind not in old:
            out.append(
                Finding(
                    severity=Severity.INFO,
                    spec=spec,
                    kind=kind,
                    what=f"new kind ({new[kind].layers} layer(s))",
                )
            )
        out += _compare_kind(
            spec,
            kind,
            old.get(kind, _EMPTY),
            new[kind],
            new_report=new_report,
            old_report=old_report,
            recompiles=recompiles,
        )
    for kind in old:
        if kind not in new:
            out.append(
                Finding(
                    severity=Severity.WARNING,
                    spec=spec,
                    kind=kind,
                    what=f"kind removed (baseline: {old[kind].layers} layer(s), "
                    f"{old[kind].break_count} break(s))",
                    hint="the block kinds changed (setup or model edit?); " + _UPDATE_HINT,
                )
            )
    return out


def _torch_warning(spec: str, baseline_torch: str, torch: str) -> list[Finding]:
    if not baseline_torch or baseline_torch == torch:
        return []
    return [
        Finding(
            severity=Severity.WARNING,
            spec=spec,
            kind="",
            what=f"torch version {baseline_torch} -> {torch}",
            hint="breaks may differ across torch versions; " + _UPDATE_HINT,
        )
    ]


def _order(f: Finding) -> tuple[Any, ...]:
    return (SEVERITIES.index(f.severity), f.spec, f.kind, f.cause, f.gb_type, f.what)


def _check_same_environment(key: str, report: ScanReport, baseline: Baseline) -> None:
    """A real scan is never compared with a simulated baseline entry, or the other way round:
    the two capture different things (simulation: one rank, no values, stand-ins)."""
    if baseline.simulated is None or baseline.kinds(key) is None:
        return
    recorded = key in baseline.simulated
    if recorded != report.setup.simulated:
        was, now = ("simulated", "real") if recorded else ("real", "simulated")
        how = "with --simulate" if recorded else "for real (on a machine that fits it)"
        raise BaselineError(
            f"baseline entry for {key} was recorded from a {was} scan, but this scan is {now}; "
            "real and simulated captures are not compared",
            hint=f"scan it {how}, or re-record it with --update-baseline",
        )


def require_probe(report: ScanReport, key: str) -> None:
    """BaselineError (exit 2) for a scan without recompile counts where recompiles are gated."""
    if not report.setup.probed_recompiles:
        raise BaselineError(
            f"{key}: the scan ran without the recompile probe, so it has no recompile counts "
            "to gate on",
            hint="scan with `gbdoctor scan SPEC --recompile-probe`, or let `gate SPEC "
            "--recompiles` scan it",
        )


def check_gate(
    reports: Iterable[ScanReport],
    baseline: Baseline,
    *,
    strict_improvements: bool = False,
    recompiles: bool = False,
) -> GateResult:
    """Compare scans with the baseline.

    ``recompiles=True`` also fails when a kind's block recompiles more over the scan's probe steps
    than the baseline accepted, or recompiles on every step; otherwise recompile changes are
    informational. Graph-count changes are informational.
    """
    findings: list[Finding] = []
    specs: list[str] = []
    kinds: set[tuple[str, str]] = set()
    for report in reports:
        key = spec_key(report.spec)
        if recompiles:
            require_probe(report, key)
        specs.append(key)
        kinds.update((key, block.kind) for block in report.blocks)
        findings += _torch_warning(key, baseline.torch_version, report.torch_version)
        old = baseline.kinds(key)
        _check_same_environment(key, report, baseline)
        if old is None:
            findings.append(
                Finding(
                    severity=Severity.REGRESSION,
                    spec=key,
                    kind="",
                    what="spec not in baseline (run --update-baseline)",
                    hint="record it with `gbdoctor gate SPEC --baseline FILE --update-baseline`",
                )
            )
            continue
        findings += _compare_spec(
            key, old, kind_counts(report), new_report=report, recompiles=recompiles
        )
    return GateResult(
        findings=tuple(sorted(findings, key=_order)),
        strict_improvements=strict_improvements,
        specs=tuple(specs),
        kinds=tuple(sorted(kinds)),
    )


def diff_reports(
    old: ScanReport, new: ScanReport, *, strict_improvements: bool = False, recompiles: bool = False
) -> GateResult:
    """The gate's rules with the old scan as the baseline (``gbdoctor diff OLD.json NEW.json``).

    Improvements carry the locations of the breaks that went away (from the old scan).
    """
    key = spec_key(new.spec)
    if recompiles:
        require_probe(new, key)
    findings = _torch_warning(key, old.torch_version, new.torch_version)
    if spec_key(old.spec) != key:
        findings.append(
            Finding(
                severity=Severity.INFO,
                spec=key,
                kind="",
                what=f"comparing with spec {spec_key(old.spec)}",
            )
        )
    findings += _compare_spec(
        key,
        kind_counts(old),
        kind_counts(new),
        new_report=new,
        old_report=old,
        recompiles=recompiles,
    )
    return GateResult(
        findings=tuple(sorted(findings, key=_order)),
        strict_improvements=strict_improvements,
        specs=(key,),
        kinds=tuple(sorted({(key, block.kind) for block in new.blocks})),
    )
