"""What one rank of a scan needs (``ScanJob``, picklable) and what it returns (``RankScan``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gbdoctor.frameworks.interface import Framework
from gbdoctor.records import BlockReport, SetupInfo, Spec

Progress = Callable[[str, int, int], None]
"""(message, done, total) callback for progress bars."""


@dataclass(frozen=True)
class ScanJob:
    """Everything a rank needs (picklable: sent to spawned ranks)."""

    spec: Spec
    framework: Framework
    """The spec's framework, resolved once by the command (``registry.framework_for``); it
    travels to the ranks with the job (a plug-in's framework is a stateless object of an
    importable class, as its strategies are), so no stage below asks the registry again."""
    strategy: Any
    """One of the spec's framework's strategies (``Framework.strategies``), or a plan's."""
    device: str
    """``cpu`` or ``cuda``: ``setup.dist.resolve_device`` of the spec's, resolved once."""
    dedupe: bool = True
    strict: bool = False
    """Run blocks whose compiled regions are all fullgraph under Dynamo's strict check."""
    probe_recompiles: bool = False
    """After each block's capture, run it again with changed inputs and record recompiles
    (``probe.py``). ``scan()`` turns it on by default; the planner's internal scans, ``gate``
    without ``--recompiles`` and simulation do not."""
    probe_shapes: tuple[tuple[int, int], ...] = ()
    """A shape stream's distinct (batch, seq), rank 0's, in first-appearance order: the probe's
    steps (``scan --shapes``); empty: the synthetic lengths."""


PROBE_ENV = "GBDOCTOR_RECOMPILE_PROBE"
"""``0`` turns the recompile probe off where no caller chose (``scan()``, ``gbdoctor scan``
without ``--[no-]recompile-probe``). The test suite sets it: only the tests that check
recompiles pay for the probe. A scan without the probe says so (``setup.probed_recompiles``)."""


def probe_by_default() -> bool:
    return os.environ.get(PROBE_ENV, "1").strip() != "0"


def strategy_for(framework: Framework, spec: Spec, name: str | None) -> Any:
    """The spec's compile strategy (or ``name``), from its framework's table."""
    return framework.strategies[name or spec.gbdoctor.strategy]


RankScan = tuple[tuple[BlockReport, ...], SetupInfo, tuple[str, ...]]
