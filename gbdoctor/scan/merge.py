"""Merge: one report from the per-rank scans (rank 0's records plus ``rank_divergence`` events)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from gbdoctor.capture import torch_version
from gbdoctor.records import BlockReport, Event, RankDivergence, ScanReport, Spec
from gbdoctor.scan.block_report import event_order, layer_order
from gbdoctor.scan.divergence import rank_divergences
from gbdoctor.scan.job import RankScan, ScanJob
from gbdoctor.setup import launched

Report = TypeVar("Report", bound=Any)


def with_layout(report: Report, ranks: int) -> Report:
    """``report`` (a scan or inspect report) with how its ``ranks`` processes were started:
    by gbdoctor, or by a launcher whose job it joined (``setup.launched.layout``)."""
    launcher, nodes, per_node = launched.layout(ranks)
    setup = replace(report.setup, launcher=launcher, nodes=nodes, ranks_per_node=per_node)
    return replace(report, setup=setup)


def merge_ranks(spec: Spec, job: ScanJob, ranks: list[RankScan]) -> ScanReport:
    """Rank 0's records, plus a ``rank_divergence`` event on every block where ranks disagree."""
    from gbdoctor.spec import spec_notes

    label = f"{spec.model.name}/{spec.model.flavor}"
    return merged_report(spec.key, label, ranks, spec_notes=spec_notes(spec))


def merged_report(
    spec_label: str, model_label: str, ranks: list[RankScan], spec_notes: tuple[str, ...] = ()
) -> ScanReport:
    """``merge_ranks`` for any setup: ``spec_label`` and ``model_label`` name what was scanned;
    ``spec_notes`` (how the spec was read) come before the ranks' notes.

    Ranks that hold different blocks (pipeline stages set up by a framework's own pipeline
    code: each PP rank holds its stages' layers only) are merged per group of ranks that hold
    the same blocks: each block's record is its group's first rank's, divergences are compared
    within the group, the blocks in layer order."""
    _, info, notes0 = ranks[0]
    groups: dict[tuple[str, ...], list[int]] = {}
    for r, (blocks, _, _) in enumerate(ranks):
        groups.setdefault(tuple(b.fqn for b in blocks), []).append(r)
    merged: list[BlockReport] = []
    divergence: list[RankDivergence] = []
    for members in groups.values():
        group = [ranks[r] for r in members]
        merged += _merge_group(group, members)
        found = rank_divergences([blocks for blocks, _, _ in group], info)
        divergence += [_global_ranks(d, members) for d in found]
    if len(groups) > 1:
        merged.sort(key=lambda b: layer_order(b.fqn))
    notes = spec_notes + notes0
    if len(groups) > 1:  # notes other ranks add (a rank's own stages) follow rank 0's, once each
        for _, _, rank_notes in ranks[1:]:
            notes += tuple(n for n in rank_notes if n not in notes)
    if len(ranks) > 1:
        whose = (
            "records are rank 0's"
            if len(groups) == 1
            else "each block's record is the first rank's that holds it"
        )
        notes += (
            f"captured on {len(ranks)} ranks; {whose}, disagreements are rank_divergence events",
        )
    report = ScanReport(
        spec=spec_label,
        model=model_label,
        torch_version=torch_version(),
        setup=info,
        blocks=tuple(merged),
        notes=notes,
        divergence=tuple(divergence) if len(ranks) > 1 else (),
    )
    return with_layout(report, len(ranks))


def _merge_group(group: list[RankScan], members: list[int]) -> list[BlockReport]:
    """The first rank's records of a group that holds the same blocks, plus a
    ``rank_divergence`` event on each block where another rank of the group disagrees."""
    blocks0 = group[0][0]
    merged = []
    for i, block in enumerate(blocks0):
        differing = [
            k
            for k, (blocks, _, _) in enumerate(group[1:], start=1)
            if _fingerprint(blocks[i]) != _fingerprint(block)
        ]
        if differing:
            detail = "; ".join(
                f"rank {members[k]}: {_fingerprint_text(group[k][0][i])}" for k in differing
            )
            event = Event(
                kind="rank_divergence",
                module=block.fqn,
                detail=f"rank {members[0]}: {_fingerprint_text(block)}; {detail}",
            )
            block = replace(block, events=tuple(sorted(block.events + (event,), key=event_order)))
        merged.append(block)
    return merged


def _global_ranks(found: RankDivergence, members: list[int]) -> RankDivergence:
    """A divergence found within a group of ranks, with the group's ranks as global ranks."""
    if members == list(range(len(members))):
        return found
    return replace(
        found,
        ranks=tuple(members[r] for r in found.ranks),
        without=tuple(members[r] for r in found.without),
    )


def _fingerprint(block: BlockReport) -> tuple[Any, ...]:
    return (
        block.graph_count,
        tuple((b.cause, b.gb_type, str(b.location)) for b in block.breaks),
        tuple((e.kind, e.module) for e in block.events),
        block.error,
    )


def _fingerprint_text(block: BlockReport) -> str:
    return (
        f"{block.graph_count} graph(s), {len(block.breaks)} break(s), {len(block.events)} event(s)"
    )
