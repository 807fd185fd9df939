"""Merge: one report from the per-rank scans (rank 0's records plus ``rank_divergence`` events)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from gbdoctor.capture import torch_version
from gbdoctor.records import BlockReport, Event, ScanReport, Spec
from gbdoctor.scan.block_report import event_order
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
    ``spec_notes`` (how the spec was read) come before the ranks' notes."""
    blocks0, info, notes0 = ranks[0]
    merged = []
    for i, block in enumerate(blocks0):
        differing = [
            r
            for r, (blocks, _, _) in enumerate(ranks[1:], start=1)
            if _fingerprint(blocks[i]) != _fingerprint(block)
        ]
        if differing:
            detail = "; ".join(f"rank {r}: {_fingerprint_text(ranks[r][0][i])}" for r in differing)
            event = Event(
                kind="rank_divergence",
                module=block.fqn,
                detail=f"rank 0: {_fingerprint_text(block)}; {detail}",
            )
            block = replace(block, events=tuple(sorted(block.events + (event,), key=event_order)))
        merged.append(block)
    notes = spec_notes + notes0
    if len(ranks) > 1:
        notes += (
            f"captured on {len(ranks)} ranks; records are rank 0's, disagreements are rank_divergence events",
        )
    divergence = rank_divergences([blocks for blocks, _, _ in ranks], info)
    report = ScanReport(
        spec=spec_label,
        model=model_label,
        torch_version=torch_version(),
        setup=info,
        blocks=tuple(merged),
        notes=notes,
        divergence=divergence if len(ranks) > 1 else (),
    )
    return with_layout(report, len(ranks))


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
