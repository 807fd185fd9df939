"""What one rank of a scan needs (``ScanJob``, picklable) and what it returns (``RankScan``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gbdoctor.records import BlockReport, SetupInfo, Spec
from gbdoctor.setup.compile import STRATEGIES, Strategy

Progress = Callable[[str, int, int], None]
"""(message, done, total) callback for progress bars."""


@dataclass(frozen=True)
class ScanJob:
    """Everything a rank needs (picklable: sent to spawned ranks)."""

    spec: Spec
    strategy: Strategy
    device: str
    dedupe: bool = True
    strict: bool = False
    """Run blocks whose compiled regions are all fullgraph under Dynamo's strict check."""
    probe_recompiles: bool = False
    """After each block's capture, run it again with changed inputs and record recompiles
    (``probe.py``). ``scan()`` turns it on; the planner's internal scans and simulation do not."""


def strategy_for(spec: Spec, name: str | None) -> Strategy:
    return STRATEGIES[name or spec.gbdoctor.strategy]


RankScan = tuple[tuple[BlockReport, ...], SetupInfo, tuple[str, ...]]
