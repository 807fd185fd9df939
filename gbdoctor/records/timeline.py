"""Records of ``gbdoctor timeline``: a training run step by step, its pattern and its causes.

Byte-stable apart from timings: every field measured in seconds (``*_s``) or derived from them
(``time_period``) is a timing; the rest (steps, recompiles, guards, frames, cache sizes, the
event-based period, findings and fixes) comes from Dynamo's records and is deterministic.
"""

from __future__ import annotations

from gbdoctor.records.base import record

__all__ = [
    "READABLE_TIMELINE_SCHEMA_VERSIONS",
    "TIMELINE_SCHEMA_VERSION",
    "FrameTimeline",
    "TimelineGraph",
    "StepCompile",
    "TimelineFinding",
    "TimelineFix",
    "TimelinePeriod",
    "TimelineReport",
    "TimelineStep",
    "TimelineVerification",
]

TIMELINE_SCHEMA_VERSION = 2
READABLE_TIMELINE_SCHEMA_VERSIONS = (1, 2)
"""2 added ``graphs``, ``shapes``, ``rank_compile_steps`` and ``predicted`` (defaults keep a version-1 file readable)."""


@record
class StepCompile:
    """One Dynamo compile (or ``recompile_limit`` hit) inside a training step."""

    frame: str
    """The compiled function: ``forward at fixtures/timeline/step_counter.py:35``."""
    attempt: int
    """0 for the frame's first compile, k for its k-th recompile."""
    compile_s: float
    guard: str = ""
    """The guard that failed (recompiles only), as Dynamo prints it: ``self.calls == 3``."""
    guard_kind: str = ""
    """A :class:`~gbdoctor.records.enums.GuardKind` ("" for a first compile)."""
    plain: str = ""
    """The guard in plain words."""
    limit_hit: bool = False
    """Dynamo refused to compile: the frame hit ``recompile_limit`` and runs eagerly from now
    on for every call its cached graphs do not match."""


@record
class TimelineStep:
    """One training step (slowest rank)."""

    step: int
    time_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    """The optimizer phase as the framework times it (``engine.step()`` for DeepSpeed: the
    boundary's gradient reduction and optimizer step, nothing on other micro-steps)."""
    collective_s: float
    """Wall time inside ``torch.distributed`` collectives called from Python (collectives
    traced into compiled graphs are not visible here)."""
    collective_calls: int
    compile_s: float
    """Dynamo compile time spent in this step (frames and lazily compiled backward graphs)."""
    tokens: int
    """Tokens of this step's batch on one rank."""
    boundary: bool | None = None
    """The step ended at a gradient accumulation boundary (None: the framework has no
    accumulation)."""
    compiles: tuple[StepCompile, ...] = ()
    graph_runs: int = 0
    """Compiled graphs run in this step (all frames)."""
    eager_frames: tuple[str, ...] = ()
    """Frames past their ``recompile_limit`` whose compiled graphs ran fewer times in this step
    than in the frame's busiest step: some calls ran eagerly."""
    cache_entries: int = 0
    """Cache entries over every frame after the step."""


@record
class FrameTimeline:
    """One compiled frame over the run."""

    frame: str
    cache_size: int
    """Cache entries at the end of the run."""
    compiles: int
    """Compiles that produced a graph (first compile and recompiles)."""
    recompile_steps: tuple[int, ...] = ()
    limit_hit_step: int | None = None
    eager_steps: tuple[int, ...] = ()


@record
class TimelineGraph:
    """One graph Dynamo compiled for a frame: what it made dynamic, and when it met new shapes."""

    frame: str
    graph: int
    """Its number among the frame's graphs, in compile order (a recompile adds one)."""
    compiled_step: int
    dynamic: tuple[str, ...] = ()
    """Input dims compiled as symbols (``L['x'] dim 1``): automatic dynamic shapes after a size
    changed, ``mark_dynamic``, or ``dynamic=True``. Empty: every size is static."""
    shape_steps: tuple[int, ...] = ()
    """Steps in which the graph first ran at an input shape it had not run at. Under CUDA graphs
    (``mode="reduce-overhead"``) each is a recording: ``len(shape_steps)`` re-records."""


@record
class TimelinePeriod:
    """A period found in the run."""

    k: int
    """Every k-th step."""
    offset: int
    """The slow steps are those with ``step % k == offset``."""
    source: str
    """``events`` (the steps with recompiles / eager fallbacks / boundaries / larger inputs
    repeat with period k: from Dynamo's and the framework's records) or ``step-times``
    (autocorrelation of the steady-state step times)."""
    amplitude_s: float | None = None
    """Median slow step minus median other step, steady state."""
    confidence: float | None = None
    """Autocorrelation of the steady-state step times at lag k (1 = perfectly periodic)."""


@record
class TimelineFix:
    kind: str
    """A :class:`~gbdoctor.records.enums.FixKind`."""
    config: tuple[tuple[str, str], ...] = ()
    """``torch._dynamo.config`` settings that apply it (what ``--fix`` sets)."""
    code: str = ""
    """The fix in the user's code, when there is a better one than a flag."""
    why: str = ""


@record
class TimelineFinding:
    """One cause of slow steps."""

    cause: str
    """A :class:`~gbdoctor.records.enums.SlowCause`."""
    problem: bool
    """False when the slow steps are periodic by design (nothing is wrong)."""
    steps: tuple[int, ...]
    frame: str = ""
    guard: str = ""
    guard_kind: str = ""
    plain: str = ""
    summary: str = ""
    period: int | None = None
    fix: TimelineFix | None = None


@record
class TimelineVerification:
    """The run again with the fixes applied (``--fix``)."""

    applied: tuple[tuple[str, str], ...]
    before_recompiles: int
    after_recompiles: int
    before_limit_hits: int
    after_limit_hits: int
    before_eager_steps: int
    after_eager_steps: int
    before_steady_recompiles: int
    after_steady_recompiles: int
    gone: bool
    """No recompile or eager fallback left in steady state, and none of the findings' frames
    recompiles after warm-up."""
    before_median_s: float | None = None
    after_median_s: float | None = None
    after_steps: tuple[TimelineStep, ...] = ()


@record
class TimelineReport:
    schema_version: int
    spec: str
    framework: str
    mode: str
    """``as-is`` (the spec's own compile strategy), ``eager`` or ``plan``."""
    strategy: str
    backend: str
    device: str
    world_size: int
    torch_version: str
    recompile_limit: int
    seq_lens: tuple[int, ...]
    """The sequence lengths the steps cycle through."""
    batch_size: int
    steps: tuple[TimelineStep, ...]
    frames: tuple[FrameTimeline, ...]
    warmup_steps: int
    """Steps before the steady state: up to the last first-compile of a frame (recompiles and
    eager fallbacks that repeat do not end the warm-up)."""
    findings: tuple[TimelineFinding, ...]
    periods: tuple[TimelinePeriod, ...]
    accumulation_steps: int | None = None
    verdict: str = ""
    """One sentence: is anything wrong."""
    sources: tuple[str, ...] = ()
    """Which Dynamo records the timeline was read from."""
    notes: tuple[str, ...] = ()
    verification: TimelineVerification | None = None
    graphs: tuple[TimelineGraph, ...] = ()
    shapes: str = ""
    """The ``--shapes`` stream the steps followed (its preset, or the file), "" for
    ``seq_lens``."""
    rank_compile_steps: tuple[tuple[int, ...], ...] = ()
    """Per rank (world size > 1), the steps in which Dynamo compiled a frame or hit its limit:
    ranks that differ here diverge (per-rank shapes), and a collective inside a compiled region
    can wait on a rank that is compiling; empty at world size 1."""
    predicted: bool = False
    """Predicted (``timeline.predict``: a forward at each distinct shape class, again after a compile), not trained:
    every timing is 0."""
