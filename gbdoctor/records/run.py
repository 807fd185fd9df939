"""Records of ``gbdoctor run`` (frozen, JSON-serializable with ``report.serialize``)."""

from __future__ import annotations

from gbdoctor.records.base import record
from gbdoctor.records.scan import Recompile

__all__ = [
    "LOSS_RTOL",
    "READABLE_RUN_SCHEMA_VERSIONS",
    "RUN_SCHEMA_VERSION",
    "ModeResult",
    "Recompile",
    "RunReport",
]

RUN_SCHEMA_VERSION = 2
"""2: recompile events carry ``limit_hit`` (a recompile-limit hit is an event of its own); 1 is
read too."""
READABLE_RUN_SCHEMA_VERSIONS = (1, 2)


LOSS_RTOL = 2e-2
"""Relative tolerance on the first step's loss vs eager. bf16 parameters (the torchtitan
default) make differences of ~1e-3 normal between eager and compiled runs."""


@record
class ModeResult:
    """One compile configuration, trained in its own processes."""

    mode: str
    """``eager``, ``titan-v0.2.0``, ``titan-v0.2.2``, ``block-fullgraph``, ``plan`` or
    ``cudagraphs`` (the plan with ``mode="reduce-overhead"`` on its CUDA-graph-ready kinds)."""
    strategy: str
    """Compile strategy name the mode ran (``none``, ``block``, ..., or the plan's)."""
    status: str
    """``ok``, ``failed`` or ``unavailable`` (not run here: ``cudagraphs`` without CUDA)."""
    error: str | None = None
    """One line: what failed, where (setup, warm-up step k, measured step k)."""
    error_kind: str | None = None
    """``graph-break`` (fullgraph compile hit a break), ``recompile-limit`` (a fullgraph region
    hit ``recompile_limit``), ``compile`` (other Dynamo/backend error), ``runtime`` (the training
    step raised), ``setup``, ``timeout`` or ``crash`` (a rank died)."""
    step_times_s: tuple[float, ...] = ()
    """Measured step times (slowest rank per step)."""
    warmup_times_s: tuple[float, ...] = ()
    step_time_median_s: float | None = None
    step_time_min_s: float | None = None
    step_time_max_s: float | None = None
    tokens_per_s: float | None = None
    """Global tokens per second (all ranks) at the median step time."""
    compile_time_s: float | None = None
    """Warm-up wall time minus ``warmup`` x the median step time, clamped at 0."""
    dynamo_compile_s: float | None = None
    """Dynamo's own frame-compile time during the warm-up steps (``_compile.compile_inner``:
    tracing plus the backend's forward/joint compile; excludes lazily compiled backward graphs),
    rank 0. A cross-check of ``compile_time_s``."""
    peak_memory_mib: float | None = None
    memory_metric: str = ""
    """``cuda_max_allocated_measured`` or ``cpu_peak_rss_process``."""
    graphs: int = 0
    """Graphs Dynamo compiled (``unique_graphs``), rank 0, warm-up and measured steps."""
    graphs_measured: int = 0
    """Graphs compiled during the measured steps (non-zero means recompiles)."""
    graph_breaks: int = 0
    """Dynamo's ``graph_break`` counter total (a lower bound; ``gbdoctor scan`` is the full count)."""
    regions: int = 0
    """Compiled regions per the strategy (all blocks)."""
    fullgraph_regions: int = 0
    recompiles: int = 0
    """Recompiles during the measured steps (max over ranks)."""
    recompile_events: tuple[Recompile, ...] = ()
    """Every recompile (warm-up ones too), of the rank with most measured recompiles."""
    recompile_limit_hit: bool = False
    cudagraph_skips: tuple[str, ...] = ()
    """``cudagraphs`` mode: inductor's "skipping cudagraphs due to ..." messages (rank 0), to set
    next to the plan's static readiness prediction."""
    """Dynamo hit ``recompile_limit`` and fell back to eager for some frame."""
    losses: tuple[float, ...] = ()
    """Global loss of every step, warm-up steps first."""
    loss_rel_diff: float | None = None
    """|loss0 - eager loss0| / |eager loss0| (None for eager or without an eager run)."""
    diverged: bool = False
    speedup_vs_eager: float | None = None
    """Eager median step time / this mode's (>1 is faster)."""
    speedup_vs_best_baseline: float | None = None
    dynamo_config: tuple[tuple[str, str], ...] = ()
    """The strategy's Dynamo settings, as (name, repr(value))."""
    same_regions_as: str | None = None
    """An earlier mode that compiled exactly the same regions with the same fullgraph settings."""
    notes: tuple[str, ...] = ()


@record
class RunReport:
    spec: str
    model: str
    torch_version: str
    device: str
    backend: str
    world_size: int
    batch_size: int
    """Local (per-rank) batch size."""
    seq_len: int
    warmup: int
    steps: int
    seed: int
    tokens_per_step: int
    """Global tokens per training step."""
    ac_mode: str
    ac_option: str
    modes: tuple[ModeResult, ...]
    best_baseline: str | None = None
    loss_rtol: float = LOSS_RTOL
    findings: tuple[str, ...] = ()
    """Failed modes, measured-step recompiles, recompile-limit hits, diverged losses."""
    notes: tuple[str, ...] = ()
    schema_version: int = RUN_SCHEMA_VERSION

    @property
    def has_findings(self) -> bool:
        return bool(self.findings)
