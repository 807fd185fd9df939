"""What one capture saw, before classification (``RawCapture``), and how Dynamo's compilation
metrics name a frame (``CodeKey``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gbdoctor.records import Location, RawBreak

CodeKey = tuple[str, int, str]
"""(file, first line, name) of a code object: how Dynamo's compilation metrics name a frame."""


@dataclass
class RawCapture:
    """What one capture saw, before classification."""

    graphs: dict[str, list[int]] = field(default_factory=dict)
    """Region FQN -> op count of each graph Dynamo produced for it."""
    entered: set[str] = field(default_factory=set)
    """Regions that were called during the capture."""
    ran_compiled: set[str] = field(default_factory=set)
    """Regions in which compiled code ran: their own graphs, or a graph Dynamo's cache reused
    from another region with the same code (two RMSNorm children share one compiled forward
    when every guard passes: no new graph, but the region did not run eagerly)."""
    breaks: list[tuple[RawBreak, str]] = field(default_factory=list)
    """(break, region fqn) pairs, one per break Dynamo logged."""
    frame_skips: list[tuple[RawBreak, str]] = field(default_factory=list)
    seen: list[tuple[Any, tuple[Location, ...], int]] = field(default_factory=list)
    """(gb_type + instance, user frames, index in ``breaks``) of every statement recorded."""
    break_frames: dict[int, set[CodeKey]] = field(default_factory=dict)
    """Index in ``breaks`` -> the frames (code objects) Dynamo was compiling when it met it."""
    counter_types: dict[str, int] = field(default_factory=dict)
    """gb_type -> count from ``counters["graph_break"]`` (cross-check)."""
    cudagraph_findings: list[Any] = field(default_factory=list)
    """CUDA-graph readiness findings of every graph compiled during the capture."""
    static_inputs: list[Any] = field(default_factory=list)
    """``capture.cudagraphs.WatchedInput`` of every static input of every forward graph, read
    when the capture ends (``cudagraphs.released_static_inputs``)."""
    aten_graphs: int = 0
    """AOTAutograd forward + backward graphs compiled during the capture."""
    aten_graphs_by_region: dict[str, int] = field(default_factory=dict)
    """The same per region FQN (a whole-model capture splits them per block: DeepSpeed)."""
    compiled: set[CodeKey] = field(default_factory=set)
    """Frames Dynamo compiled (a scratch capture's re-trace, ``CaptureSession.scratch``)."""
    error: str | None = None
    error_traceback: str | None = None


def code_key(file: str, first_line: int, name: str) -> CodeKey:
    return (file, first_line, name)


def compiled_frames(metrics: list[Any]) -> set[CodeKey]:
    """Every frame Dynamo compiled, by its compilation metrics."""
    return {
        code_key(m.co_filename, m.co_firstlineno or 0, m.co_name or "")
        for m in metrics
        if getattr(m, "co_filename", None)
    }
