"""How every framework's planner reads a scan report: which rows stand for their kind, whether
a row is clean, and how much of a kind runs in clean fullgraph regions."""

from __future__ import annotations

from gbdoctor.records import BlockReport, ScanReport


def representatives(report: ScanReport) -> list[BlockReport]:
    """One row per block kind: the rows that are not ``same_as`` another."""
    return [b for b in report.blocks if b.same_as is None]


def clean(block: BlockReport) -> bool:
    """No break, no event, no error."""
    return not block.breaks and not block.events and block.error is None


def fullgraph_share(block: BlockReport, total_ops: int) -> float:
    """Share of the kind's ``total_ops`` that runs in clean fullgraph regions (4 decimals)."""
    if total_ops <= 0:
        return 0.0
    dirty = {b.region for b in block.breaks} | {e.module for e in block.events}
    clean_ops = sum(
        n
        for region, n in block.region_ops
        if region in block.fullgraph_regions and region not in dirty and not block.error
    )
    return round(min(1.0, clean_ops / total_ops), 4)
