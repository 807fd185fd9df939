"""Every count derived from a :class:`~gbdoctor.records.ScanReport`, computed once.

Formatters and the CLI lay these out; they never count themselves. No torch, no rich.

Counting rules:

- a break counts ``Break.count`` times (how often Dynamo logged it during the capture);
- every block counts its own copy: a block with ``same_as`` carries the breaks of the capture
  it shares, so a break in a shared capture counts once per layer in the totals;
- per-kind rows report *per block* numbers (the worst block of the kind; every layer of a
  kind is identical when the scan deduplicated blocks).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import fields, is_dataclass, replace
from typing import Any, TypeVar

from gbdoctor.records import (
    BlockerEffect,
    BlockerKind,
    BlockReport,
    CudaGraphFinding,
    CudaGraphReadiness,
    KindSummary,
    NotableFinding,
    Recompile,
    ScanReport,
    ScanSummary,
)

T = TypeVar("T")

__all__ = [
    "KindSummary",
    "ScanSummary",
    "block_break_count",
    "compact_layers",
    "fix_hint",
    "group_by_kind",
    "stage_rows",
    "has_findings",
    "recompile_location",
    "recompiled_code",
    "summarize",
    "top_cause",
    "with_user_names",
]


def block_break_count(block: BlockReport) -> int:
    """Breaks of one block, each counted ``Break.count`` times."""
    return sum(b.count for b in block.breaks)


def has_findings(report: ScanReport) -> bool:
    """Any break, event or error in the report (what ``--strict`` turns into exit 1)."""
    return any(b.breaks or b.events or b.error is not None for b in report.blocks)


def compact_layers(fqns: tuple[str, ...] | list[str]) -> str:
    """``("layers.1", "layers.3", "layers.5")`` -> ``"layers.1, 3, 5"``.

    A FQN whose prefix differs from the previous one is written in full.
    """
    parts: list[str] = []
    prefix = None
    for fqn in fqns:
        head, dot, tail = fqn.rpartition(".")
        if dot and head == prefix:
            parts.append(tail)
        else:
            parts.append(fqn)
            prefix = head if dot else None
    return ", ".join(parts)


def fix_hint(cause: str) -> str:
    """First fix of a cause from the taxonomy (the frameworks' additions included); ``""`` for
    an unknown cause id."""
    from gbdoctor.frameworks.registry import cause_taxonomy  # lazy: only hints need it

    return cause_taxonomy().fix_hint(cause)


def _unique(items: list) -> tuple:
    return tuple(dict.fromkeys(items))


def _kind_summary(kind: str, blocks: list[BlockReport]) -> KindSummary:
    causes = {b.cause for block in blocks for b in block.breaks}
    errors = [block.error for block in blocks if block.error is not None]
    if errors:
        causes.add("error")
    fqns = tuple(block.fqn for block in blocks)
    ready = next(
        (b.cudagraphs for b in blocks if b.same_as is None and b.cudagraphs is not None), None
    )
    recompiles = tuple(rec for block in blocks if block.same_as is None for rec in block.recompiles)
    return KindSummary(
        kind=kind,
        layers=fqns,
        layers_label=compact_layers(fqns),
        graphs=max(block.graph_count for block in blocks),
        breaks=max(block_break_count(block) for block in blocks),
        events=max(len(block.events) for block in blocks),
        errors=len(errors),
        causes=tuple(sorted(causes)),
        # The captured representative's records stand for the kind (shared layers carry the
        # same records re-addressed to their own FQNs).
        break_records=_unique(
            [b for block in blocks if block.same_as is None for b in block.breaks]
        ),
        event_records=_unique(
            [e for block in blocks if block.same_as is None for e in block.events]
        ),
        error=errors[0] if errors else None,
        cudagraphs=ready,
        cudagraph_notable=_notable(ready),
        recompiles=recompiles,
        steady_recompiles=sum(1 for rec in recompiles if rec.measured),
    )


_EFFECT_RANK = {BlockerEffect.BLOCKS: 0, BlockerEffect.RERECORD: 1, BlockerEffect.ALLOWED: 2}
_KIND_RANK = {
    kind: i
    for i, kind in enumerate(
        (
            BlockerKind.HOST_SYNC,
            BlockerKind.MUTATED_INPUT,
            BlockerKind.CPU_TENSOR,
            BlockerKind.RNG_STATE,
            BlockerKind.COLLECTIVE,
            BlockerKind.SYMINT_INPUT,
            BlockerKind.DYNAMIC_SHAPE,
        )
    )
}
"""Causes before consequences: a host read's value is what makes the shapes after it dynamic."""


def _notable(ready: CudaGraphReadiness | None) -> tuple[NotableFinding, ...]:
    """Readiness findings worth a row, blockers first: all but the per-input copies (counted).
    Findings that differ only in their node, and in the input their detail names first
    (``name: why``, as a finding about a graph input writes it; each name listed once), share
    one row: under
    FSDP2 a block's 9 parameters are each released, and an MoE block has 15 inputs of
    data-dependent size."""
    if ready is None:
        return ()
    shown = [f for f in ready.findings if f.effect != BlockerEffect.COPY]
    groups: dict[tuple[object, ...], list[tuple[CudaGraphFinding, str]]] = {}
    for f in shown:
        subject, reason = _named_input(f.detail)
        key = (f.kind, f.effect, f.region, f.graph, f.location, reason, subject is None)
        groups.setdefault(key, []).append((f, subject or ""))
    merged = []
    for members in groups.values():
        members.sort(key=lambda member: _natural(member[0].node))  # primals_2 before primals_10
        merged.append(
            NotableFinding(
                finding=members[0][0],
                nodes=tuple(f.node for f, _ in members),
                subjects=tuple(dict.fromkeys(subject for _, subject in members if subject)),
                reason=_named_input(members[0][0].detail)[1],
            )
        )
    return tuple(
        sorted(
            merged,
            key=lambda g: (
                _EFFECT_RANK.get(g.finding.effect, 3),
                _KIND_RANK.get(g.finding.kind, 9),
            ),
        )
    )


_NAMED_INPUT = re.compile(r"(?P<name>[A-Za-z_][\w.\[\]']*): (?P<reason>.+)", re.DOTALL)
"""A detail that starts with the input it is about: ``self.w1.weight: why``, ``args[0]: why``."""


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders the numbers inside a name by value."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name)
    )


def _named_input(detail: str) -> tuple[str | None, str]:
    """``(name, why)`` of a detail that starts with the input it is about, else (None, detail)."""
    match = _NAMED_INPUT.fullmatch(detail)
    if match is None:
        return None, detail
    return match["name"], match["reason"]


def group_by_kind(report: ScanReport) -> dict[str, list[BlockReport]]:
    """Blocks grouped by kind label, kinds in order of first appearance."""
    groups: dict[str, list[BlockReport]] = {}
    for block in report.blocks:
        groups.setdefault(block.kind, []).append(block)
    return groups


def stage_rows(report: ScanReport) -> list[tuple[int, str, tuple[tuple[str, int, bool], ...]]]:
    """Under pipeline parallelism, per stage: (stage, its layers, (kind, breaks per block,
    whether a block of it did not trace) of each kind it holds); empty without stages."""
    stages: dict[int, list[BlockReport]] = {}
    for block in report.blocks:
        if block.stage is not None:
            stages.setdefault(block.stage, []).append(block)
    rows = []
    for stage, blocks in sorted(stages.items()):
        kinds = group_by_kind(replace(report, blocks=tuple(blocks)))
        rows.append(
            (
                stage,
                compact_layers([b.fqn for b in blocks]),
                tuple(
                    (
                        kind,
                        max(block_break_count(b) for b in members),
                        any(b.error is not None for b in members),
                    )
                    for kind, members in kinds.items()
                ),
            )
        )
    return rows


def summarize(report: ScanReport) -> ScanSummary:
    """All derived counts of a scan report."""
    by_cause: Counter[str] = Counter()
    events: Counter[str] = Counter()
    for block in report.blocks:
        for brk in block.breaks:
            by_cause[brk.cause] += brk.count
        for event in block.events:
            events[event.kind] += 1
    return ScanSummary(
        blocks=len(report.blocks),
        breaks=sum(by_cause.values()),
        events=sum(events.values()),
        events_by_kind=tuple(sorted(events.items())),
        errors=sum(1 for block in report.blocks if block.error is not None),
        graphs=sum(block.graph_count for block in report.blocks),
        ops=sum(block.op_count for block in report.blocks),
        by_cause=tuple(sorted(by_cause.items())),
        kinds=tuple(_kind_summary(kind, blocks) for kind, blocks in group_by_kind(report).items()),
    )


def top_cause(summary: ScanSummary) -> tuple[str, int] | None:
    """(cause, breaks) of the cause with the most breaks (ties: the first by name); None when
    there is no break."""
    if not summary.by_cause:
        return None
    return min(summary.by_cause, key=lambda pair: (-pair[1], pair[0]))


_CODE_AT = re.compile(r" at (?P<where>\S+:\d+)$")
"""The end of a recompile's ``function``: ``forward at gbdoctor/models/decoder.py:47``."""


def recompile_location(rec: Recompile) -> str | None:
    """Where to look for a recompile: the user frame of its guard, else the first line of the
    recompiled code (Dynamo gives a guard's user frame for few guards: a tensor's size guard has
    none, and its code's line is where the tensor comes in)."""
    if rec.location:
        return rec.location
    match = _CODE_AT.search(rec.function)
    return match["where"] if match else None


def recompiled_code(rec: Recompile) -> str:
    """The recompiled function's name, without its ``at file:line``."""
    return _CODE_AT.sub("", rec.function)


def with_user_names(record: T) -> T:
    """``record`` (a scan report, or any record) with Dynamo's generated names in its text said
    in the user's terms (``causes.generated_names``: a resume function by the user's function,
    a stack slot as the value carried across the break, a placeholder by its attribute path).
    Every output format renders this; the records as captured keep Dynamo's words, which the
    gate's baselines were written from. Unchanged parts are shared, not copied."""
    from gbdoctor.causes.generated_names import has_generated_name, user_names

    def named(value: Any) -> Any:
        if isinstance(value, str):
            return user_names(value) if has_generated_name(value) else value
        if isinstance(value, tuple):
            items = tuple(named(item) for item in value)
            return value if all(a is b for a, b in zip(items, value)) else items
        if is_dataclass(value) and not isinstance(value, type):
            changed = {}
            for field in fields(value):
                old = getattr(value, field.name)
                new = named(old)
                if new is not old:
                    changed[field.name] = new
            return replace(value, **changed) if changed else value
        return value

    return named(record)
