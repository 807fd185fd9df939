"""What ``run`` and ``price`` share about measuring: the machine (its name and peak), its load,
per-round step times, rank-prefixed messages, and the known upstream bugs a mode may run around."""

from __future__ import annotations

import os
import re
from typing import Any

from gbdoctor.causes import KnownIssue
from gbdoctor.frameworks.registry import cause_taxonomy
from gbdoctor.run.worker import RankRun


def known_bug_workaround(error: str, strategy: Any) -> KnownIssue | None:
    """The known upstream bug behind a failed mode, when its workaround is a config change that
    the mode can run under. A plan is made for the spec's own block kinds (their AC labels), so
    only strategies that do not depend on the kinds are retried."""
    issue = cause_taxonomy().known_issue(error)
    per_kind: tuple[Any, ...] = getattr(strategy, "per_kind", ())
    if issue is None or not issue.overrides or per_kind:
        return None
    return issue


def workaround_note(issue: KnownIssue) -> str:
    return (
        f"ran with {', '.join(issue.overrides)}: with the spec's own setting it fails with a "
        f"known upstream bug ({issue.link})"
    )


def cpu_name() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def device_name(device: str) -> str:
    """The machine a run measures on: the GPU's name, or the CPU's with its core count."""
    if device == "cuda":
        import torch

        return str(torch.cuda.get_device_name(0))
    return cpu_name()


def device_peak(device: str) -> tuple[str, float | None]:
    """(:func:`device_name`, the GPU's peak dense TFLOP/s where it is known; None on CPU)."""
    name = device_name(device)
    if device != "cuda":
        return name, None
    from gbdoctor.run.flops import peak_tflops

    return name, peak_tflops(name)


def load_average() -> float:
    """1-minute load average before a mode starts (0 where the OS has none). It still counts the
    previous mode's ranks for a while, hence the margin of ``world`` in ``build_report``."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def strip_rank(message: str, world: int) -> str:
    """``rank 0: ...`` is noise on a single-rank job."""
    first = (message.strip().splitlines() or [""])[0]
    if world == 1:
        first = re.sub(r"^rank 0( failed)?: ", "", first)
    return first[:400]


def per_step_max(ranks: list[RankRun], attr: str) -> list[Any]:
    values = [getattr(r, attr) for r in ranks]
    return [max(v[i] for v in values) for i in range(len(values[0]))]
