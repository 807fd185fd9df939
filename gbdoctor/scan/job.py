"""What one rank of a scan needs (``ScanJob``, picklable) and what it returns (``RankScan``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gbdoctor.records import BlockReport, SetupInfo, Spec
from gbdoctor.setup.compile import STRATEGIES

Progress = Callable[[str, int, int], None]
"""(message, done, total) callback for progress bars."""


@dataclass(frozen=True)
class ScanJob:
    """Everything a rank needs (picklable: sent to spawned ranks)."""

    spec: Spec
    strategy: Any
    """A ``setup.compile.Strategy`` (torchtitan) or ``setup.deepspeed.DeepSpeedStrategy``."""
    device: str
    dedupe: bool = True
    strict: bool = False
    """Run blocks whose compiled regions are all fullgraph under Dynamo's strict check."""


def strategy_for(spec: Spec, name: str | None) -> Any:
    """The spec's compile strategy (or ``name``), from its framework's table."""
    if spec.gbdoctor.framework == "deepspeed":
        from gbdoctor.setup.deepspeed import DS_STRATEGIES

        return DS_STRATEGIES[name or spec.gbdoctor.strategy]
    return STRATEGIES[name or spec.gbdoctor.strategy]


RankScan = tuple[tuple[BlockReport, ...], SetupInfo, tuple[str, ...]]
