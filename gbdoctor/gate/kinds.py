"""One spec's block kinds against the baseline's (or an older scan's): break counts matched
across torch's gb_type renames, failing events, errors, graphs and layers, and the recompile
probe's counts; each difference a finding (``compare`` runs it per spec and decides the verdict)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gbdoctor.causes.renames import GbRename, renamed
from gbdoctor.gate.counts import block_key, break_key
from gbdoctor.records import (
    BreakCount,
    EventKind,
    Finding,
    KindCounts,
    Location,
    Recompile,
    ScanReport,
    Severity,
)
from gbdoctor.summary import fix_hint
from gbdoctor.torch_compat import release_name

FAILING_EVENTS = (
    EventKind.REGION_EAGER,
    EventKind.FRAME_SKIPPED,
    EventKind.RECOMPILE_LIMIT,
    EventKind.PIPELINE_CRASH,
    EventKind.DIVERGENCE,
)
"""Event kinds whose rising count fails the gate; other kinds warn (``rank_divergence``, the
per-block flag that ranks differ at all: ``divergence`` counts the breaks that differ)."""

_EMPTY = KindCounts(layers=0, graph_count=0)

UPDATE_HINT = "review the change, then accept it with --update-baseline"


def _locations(
    report: ScanReport | None, kind: str, *, key: str | None = None, event: str | None = None
) -> tuple[Location, ...]:
    """Distinct file:line of the breaks (by key) or events (by kind) of a kind's blocks."""
    if report is None:
        return ()
    found: dict[Location, None] = {}
    if event == EventKind.DIVERGENCE:
        found.update((d.location, None) for d in report.divergence if d.kind == kind and d.location)
    for block in report.blocks:
        if block_key(block) != kind:
            continue
        if key is not None:
            found.update(
                (b.location, None) for b in block.breaks if b.location and break_key(b) == key
            )
        if event is not None:
            found.update((e.location, None) for e in block.events if e.location and e.kind == event)
    return tuple(sorted(found, key=lambda loc: (loc.file, loc.line, loc.function)))


def _gb_name(gb_id: str | None, gb_type: str) -> str:
    return f"{gb_id} {gb_type!r}" if gb_id else repr(gb_type)


def _totals(breaks: Iterable[BreakCount]) -> dict[str, int]:
    out: dict[str, int] = {}
    for brk in breaks:
        out[brk.key] = out.get(brk.key, 0) + brk.count
    return out


_Name = tuple[str, str | None, str]
"""(cause, gb_id, gb_type) of one side of a rename."""


def _id(brk: BreakCount, rename: GbRename | None) -> str | None:
    """The entry's gb id; a schema-1/2 entry has none, the rename table names it."""
    if brk.gb_id is not None or rename is None:
        return brk.gb_id
    return {rename.old_type: rename.old_id, rename.new_type: rename.new_id}.get(brk.gb_type)


def _match_breaks(
    old: Iterable[BreakCount], new: Iterable[BreakCount], old_torch: str, new_torch: str
) -> tuple[dict[str, int], dict[str, int], dict[tuple[_Name, _Name, GbRename | None], int]]:
    """Pair old and new breaks count by count, most specific evidence first:

    1. same cause, gb_type, location and checkpoint flag;
    2. same cause and gb_type, wherever the line moved (an unrelated edit shifts lines; schema
       1/2 baselines have no location or flag);
    3. torch versions differ: same cause, location and checkpoint flag, another gb_type: torch
       renamed the break;
    4. torch versions differ: a rename of ``causes/renames.py`` with the same cause (the
       location may have moved with it, or be unknown).

    Returns (old key -> count matched, new key -> count matched, (old name, new name, table
    entry or None) -> count renamed). What stays unmatched is a regression or an improvement.
    """
    left, right = list(old), list(new)
    left_n, right_n = [b.count for b in left], [b.count for b in right]
    matched_old: dict[str, int] = {}
    matched_new: dict[str, int] = {}
    renames: dict[tuple[_Name, _Name, GbRename | None], int] = {}
    other_torch = release_name(old_torch) != release_name(new_torch)

    def same_hop(a: BreakCount, b: BreakCount) -> bool:
        unknown = a.in_checkpoint is None or b.in_checkpoint is None
        return unknown or a.in_checkpoint == b.in_checkpoint

    def exact(a: BreakCount, b: BreakCount) -> tuple[bool, GbRename | None]:
        ok = a.key == b.key and a.location == b.location and a.location is not None
        return ok and same_hop(a, b), None

    def same_type(a: BreakCount, b: BreakCount) -> tuple[bool, GbRename | None]:
        return a.key == b.key and same_hop(a, b), None

    def same_place(a: BreakCount, b: BreakCount) -> tuple[bool, GbRename | None]:
        ok = other_torch and a.cause == b.cause and a.location is not None
        ok = ok and a.location == b.location and a.in_checkpoint == b.in_checkpoint
        return ok, renamed(a.gb_type, a.gb_id, b.gb_type, b.gb_id, old_torch, new_torch)

    def aliased(a: BreakCount, b: BreakCount) -> tuple[bool, GbRename | None]:
        if not other_torch or a.cause != b.cause or not same_hop(a, b):
            return False, None
        rename = renamed(a.gb_type, a.gb_id, b.gb_type, b.gb_id, old_torch, new_torch)
        return rename is not None, rename

    for rule in (exact, same_type, same_place, aliased):
        for i, a in enumerate(left):
            for j, b in enumerate(right):
                if not (left_n[i] and right_n[j]):
                    continue
                ok, rename = rule(a, b)
                if not ok:
                    continue
                n = min(left_n[i], right_n[j])
                left_n[i] -= n
                right_n[j] -= n
                matched_old[a.key] = matched_old.get(a.key, 0) + n
                matched_new[b.key] = matched_new.get(b.key, 0) + n
                if a.key != b.key:
                    pair = (
                        (a.cause, _id(a, rename), a.gb_type),
                        (b.cause, b.gb_id, b.gb_type),
                        rename,
                    )
                    renames[pair] = renames.get(pair, 0) + n
    return matched_old, matched_new, renames


def _compare_kind(
    spec: str,
    kind: str,
    old: KindCounts,
    new: KindCounts,
    *,
    new_report: ScanReport | None,
    old_report: ScanReport | None,
    recompiles: bool,
    old_torch: str = "",
    new_torch: str = "",
) -> list[Finding]:
    out: list[Finding] = []

    def add(severity: str, what: str, **kw: Any) -> None:
        out.append(Finding(severity=severity, spec=spec, kind=kind, what=what, **kw))

    if old.layers and new.layers != old.layers:
        add(Severity.INFO, f"layers {old.layers} -> {new.layers}")
    if new.error and not old.error:
        add(Severity.REGRESSION, "block now errors", cause="error", hint=fix_hint("error"))
    elif old.error and not new.error:
        add(Severity.IMPROVEMENT, "block traces again", cause="error", hint=UPDATE_HINT)
    if old.error or new.error:
        # No trustworthy break counts on the side that errored: the error finding says it all.
        if old.error and not new.error and new.break_count:
            add(Severity.INFO, f"break count (unknown) -> {new.break_count}")
        return out

    matched_old, matched_new, renames = _match_breaks(old.breaks, new.breaks, old_torch, new_torch)
    for (was_brk, now_brk, rename), n in sorted(renames.items(), key=lambda kv: str(kv[0])):
        version = f"torch {release_name(new_torch)}" if new_torch else "torch"
        via = "" if rename is None else f" ({rename.why})"
        add(
            Severity.WARNING,
            f"renamed by {version}: {_gb_name(was_brk[1], was_brk[2])} -> "
            f"{_gb_name(now_brk[1], now_brk[2])}" + (f" ({n} break(s))" if n > 1 else ""),
            cause=now_brk[0],
            gb_type=now_brk[2],
            hint="the same break (same cause, location and checkpoint flag) under torch's new "
            f"name{via}; " + UPDATE_HINT,
            locations=_locations(new_report, kind, key=f"{now_brk[0]}|{now_brk[2]}"),
        )

    old_breaks = _totals(old.breaks)
    new_breaks = _totals(new.breaks)
    old_causes = old.causes
    for key in sorted(set(old_breaks) | set(new_breaks)):
        was, now = old_breaks.get(key, 0), new_breaks.get(key, 0)
        extra = now - matched_new.get(key, 0)  # breaks of this key no old break accounts for
        gone = was - matched_old.get(key, 0)  # old breaks of this key nothing accounts for
        cause, _, gb_type = key.partition("|")
        if extra > 0:
            was = now - extra
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
        if gone > 0:
            now = was - gone
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
                hint=UPDATE_HINT,
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
                hint=_event_hint(name),
            )
        elif now < was:
            what = f"event {name} gone" if now == 0 else f"event {name} count {was} -> {now}"
            add(
                Severity.IMPROVEMENT,
                what,
                hint=UPDATE_HINT,
                locations=_locations(old_report, kind, event=name),
            )

    if new.graph_count != old.graph_count and old.layers:
        add(Severity.INFO, f"graph count {old.graph_count} -> {new.graph_count}")
    _compare_recompiles(add, kind, old, new, new_report, recompiles)
    return out


def _recompiles(report: ScanReport | None, kind: str, *, steady: bool) -> Iterator[Recompile]:
    """The recompiles a kind's blocks recorded, in scan order; ``steady``: only those measured
    in the probe's last step."""
    for block in report.blocks if report is not None else ():
        for rec in block.recompiles if block_key(block) == kind else ():
            if rec.measured or not steady:
                yield rec


def _recompile_locations(recompiles: Iterable[Recompile]) -> tuple[Location, ...]:
    found: dict[Location, None] = {}
    for rec in recompiles:
        if rec.location:
            file, _, line = rec.location.rpartition(":")
            found[Location(file=file, line=int(line) if line.isdigit() else 0)] = None
    return tuple(sorted(found, key=lambda loc: (loc.file, loc.line)))


def _compare_recompiles(
    add: Callable[..., None],
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

    def regression(what: str, *, steady: bool, hint: str) -> None:
        """``what`` with the first such recompile of the new scan, and where they happen."""
        recompiles = list(_recompiles(new_report, kind, steady=steady))
        first = recompiles[0] if recompiles else None
        where = f" at {first.location}" if first is not None and first.location else ""
        add(
            severity,
            what + (f" (first: {first.reason}{where})" if first is not None else ""),
            locations=_recompile_locations(recompiles),
            hint=hint,
        )

    if now_steady > was_steady:
        regression(
            f"recompiles on every step ({was_steady} -> {now_steady} in the last probe step)",
            steady=True,
            hint="a guard fails on every training step; after recompile_limit (8) Dynamo runs the "
            "frame eagerly: make the changing value a tensor or stop the model from changing it",
        )
    elif now_steady < was_steady:
        add(
            Severity.IMPROVEMENT,
            f"steady recompiles {was_steady} -> {now_steady}",
            hint=UPDATE_HINT,
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
        regression(
            f"recompiles with changed inputs {old.recompiles} -> {now}",
            steady=False,
            hint="a new guard fails when the data or sequence length changes; each is a compile "
            "in training",
        )
    elif now < old.recompiles:
        add(
            Severity.IMPROVEMENT,
            f"recompiles with changed inputs {old.recompiles} -> {now}",
            hint=UPDATE_HINT,
        )


def compare_spec(
    spec: str,
    old: dict[str, KindCounts],
    new: dict[str, KindCounts],
    *,
    new_report: ScanReport | None = None,
    old_report: ScanReport | None = None,
    recompiles: bool = False,
    old_torch: str = "",
    new_torch: str = "",
) -> list[Finding]:
    out: list[Finding] = []

    def add(severity: str, kind: str, what: str, hint: str = "") -> None:
        out.append(Finding(severity=severity, spec=spec, kind=kind, what=what, hint=hint))

    for kind in new:
        if kind not in old:
            add(Severity.INFO, kind, f"new kind ({new[kind].layers} layer(s))")
        out += _compare_kind(
            spec,
            kind,
            old.get(kind, _EMPTY),
            new[kind],
            new_report=new_report,
            old_report=old_report,
            recompiles=recompiles,
            old_torch=old_torch,
            new_torch=new_torch,
        )
    for kind in old:
        if kind not in new:
            add(
                Severity.WARNING,
                kind,
                f"kind removed (baseline: {old[kind].layers} layer(s), "
                f"{old[kind].break_count} break(s))",
                "the block kinds changed (setup or model edit?); " + UPDATE_HINT,
            )
    return out


def _event_hint(name: str) -> str:
    if name == EventKind.DIVERGENCE:
        return (
            "ranks now compile this kind differently: see the scan's divergence section "
            "(docs/divergence.md)"
        )
    if name in FAILING_EVENTS:
        return "a break inside the region sent it to eager; fix the breaks listed for this kind"
    return ""
