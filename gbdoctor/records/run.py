"""Records of ``gbdoctor run`` (frozen, JSON-serializable with ``report.serialize``)."""

from __future__ import annotations

from gbdoctor.records.base import record
from gbdoctor.records.price import PriceCheck
from gbdoctor.records.scan import Recompile

__all__ = [
    "LOSS_RTOL",
    "READABLE_RUN_SCHEMA_VERSIONS",
    "RUN_SCHEMA_VERSION",
    "ModeResult",
    "Recompile",
    "RunContext",
    "RunReport",
]

RUN_SCHEMA_VERSION = 6
"""2: rounds with ratio spreads and verdicts, per-phase step split, MFU, the plan's provenance;
recompile events carry ``limit_hit`` (a recompile-limit hit is an event of its own); 3: a mode's
``workaround``; 4: ``price_check`` (``run --price``); 5: a mode's ``round_cpu_medians_s`` and the
price check's ``clock``; 6: a mode's ``cudagraph_rerecords``. All new fields have defaults:
reports of versions 1 to 5 are still read."""
READABLE_RUN_SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6)


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
    """Measured step times (slowest rank per step), every round's, round after round."""
    round_medians_s: tuple[float, ...] = ()
    """Median measured step time of each round (each round runs every mode once, in fresh processes)."""
    round_cpu_medians_s: tuple[float, ...] = ()
    """The same in CPU time: per step the slowest rank's process CPU time (every thread), the
    median per round (schema 5; ``run --price`` reads it for prices measured in CPU time)."""
    warmup_times_s: tuple[float, ...] = ()
    step_time_median_s: float | None = None
    step_time_min_s: float | None = None
    step_time_max_s: float | None = None
    tokens_per_s: float | None = None
    """Global tokens per second (all ranks) at the median step time."""
    forward_s: float | None = None
    """Median forward time (with the loss) of the measured steps; slowest rank per step."""
    backward_s: float | None = None
    optimizer_s: float | None = None
    """Median optimizer time (pre-step hooks, step, zero_grad)."""
    tflops_per_s: float | None = None
    """Achieved model TFLOP/s over all ranks: tokens/s x the report's ``flops_per_token``."""
    mfu: float | None = None
    """Model FLOPs utilization: ``tflops_per_s`` / (ranks x the device's dense bf16 peak); GPU only."""
    compile_time_s: float | None = None
    """Warm-up wall time minus ``warmup`` x the median step time, clamped at 0, in the first
    round (empty compile cache). Never part of the step times or tokens/s."""
    compile_time_warm_s: float | None = None
    """The same for later rounds (median): the mode's own compile cache, filled by its first
    round, is reused, as a restarted training job reuses its cache."""
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
    """Dynamo hit ``recompile_limit`` and fell back to eager for some frame."""
    cudagraph_skips: tuple[str, ...] = ()
    """``cudagraphs`` mode: inductor's "skipping cudagraphs due to ..." messages (rank 0), to set
    next to the plan's static readiness prediction."""
    cudagraph_rerecords: tuple[str, ...] = ()
    """``cudagraphs`` mode: ``function: reason`` of every cudagraph inductor recorded again
    (rank 0), warm-up steps included: a static input at a new address re-records on every step
    it moves (pytorch/pytorch#183451)."""
    losses: tuple[float, ...] = ()
    """Global loss of every step, warm-up steps first."""
    loss_rel_diff: float | None = None
    """|loss0 - eager loss0| / |eager loss0| (None for eager or without an eager run)."""
    diverged: bool = False
    speedup_vs_eager: float | None = None
    """Eager median step time / this mode's (>1 is faster)."""
    speedup_vs_eager_range: tuple[float, float] | None = None
    """(min, max) over rounds of the per-round ratio; None with a single round."""
    verdict_vs_eager: str = ""
    """``faster`` / ``slower`` when the whole range is above / below 1, ``within noise`` when it
    contains 1, ``no spread`` with a single round. Only ``faster`` is a speedup."""
    speedup_vs_best_baseline: float | None = None
    speedup_vs_best_baseline_range: tuple[float, float] | None = None
    verdict_vs_best_baseline: str = ""
    plan_verified: bool | None = None
    """For the ``plan`` mode: whether the plan was verified (an unverified plan still runs, marked)."""
    dynamo_config: tuple[tuple[str, str], ...] = ()
    """The strategy's Dynamo settings, as (name, repr(value))."""
    same_regions_as: str | None = None
    """An earlier mode that compiled exactly the same regions with the same fullgraph settings."""
    workaround: str = ""
    """Set when the mode ran with a known upstream bug's config workaround because the spec's own
    setting fails with it (``causes/known_issues.py``): the overrides and the issue."""
    notes: tuple[str, ...] = ()


@record
class RunContext:
    """What a run's report states beside its measurements and its :class:`RunSettings`: the
    torch and machine it ran on, the model's FLOPs and the plan it applied. The run driver
    gathers it once (``run.assemble.build_report`` reads it), so the report's inputs travel as
    one checked record instead of a dozen loose keywords (issue 41)."""

    torch_version: str
    optimizer: str = ""
    """``AdamW (fused)`` or ``AdamW (foreach)`` (``RunReport.optimizer``)."""
    device_name: str = ""
    peak_tflops: float | None = None
    """The device's dense bf16 peak per rank (None: not known, or a CPU: no MFU)."""
    load: tuple[float, int] | None = None
    """(the highest 1-minute load average seen, cores): a busy machine gets a note; None: not
    measured (no note)."""
    flops_per_token: int | None = None
    """Training FLOPs per token (``run.flops``); None when not countable."""
    plan_source: str | None = None
    """``made by this run`` or the ``--plan`` file; None: no plan mode ran."""
    plan_verified: bool | None = None
    plan_kinds: tuple[str, ...] = ()
    """One line per block kind of the plan (``RunReport.plan_kinds``)."""


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
    """Measured steps per mode and round."""
    seed: int
    tokens_per_step: int
    """Global tokens per training step."""
    ac_mode: str
    ac_option: str
    modes: tuple[ModeResult, ...]
    rounds: int = 1
    """Every mode ran this many times, in fresh processes, in alternating order (ABC, CBA, ...)."""
    shape_note: str = ""
    """Where the benchmark shapes come from (on CPU: chosen so compiled regions dominate)."""
    optimizer: str = ""
    """``AdamW (fused)`` or ``AdamW (foreach)``: what the device supports (torchtitan's choice)."""
    device_name: str = ""
    flops_per_token: int | None = None
    """Training FLOPs per token from the model config (``run.flops``); None when not countable."""
    peak_tflops: float | None = None
    """The device's dense bf16 peak per rank (None on CPU and unknown GPUs: no MFU)."""
    plan_source: str | None = None
    """``made by this run`` (the planner and its verification ran first) or the ``--plan`` file."""
    plan_verified: bool | None = None
    plan_kinds: tuple[str, ...] = ()
    """One line per block kind of the plan: ``moe: children fullgraph, eager moe.experts``."""
    plan_verdict: str = ""
    """The plan against the best baseline, in words, with the ratio and its spread."""
    best_baseline: str | None = None
    loss_rtol: float = LOSS_RTOL
    findings: tuple[str, ...] = ()
    """Failed modes, measured-step recompiles, recompile-limit hits, diverged losses."""
    notes: tuple[str, ...] = ()
    price_check: PriceCheck | None = None
    """``run --price FILE``: the prices' predicted gain beside the measured one; else None."""
    schema_version: int = RUN_SCHEMA_VERSION

    @property
    def has_findings(self) -> bool:
        return bool(self.findings)
