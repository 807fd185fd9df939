"""``run``: train for real under several compile configurations and compare them.

``driver`` (the plan, modes in rounds of fresh rank processes, the report with ratio spreads)
-> ``worker`` (one rank of one mode: build, set up, warm up, measure each step per phase);
``flops`` (FLOPs per token from the model config, device peaks, MFU). Records are in
``records.run``.
"""

from gbdoctor.run.driver import (
    BASELINES,
    DEFAULT_BACKEND,
    DEFAULT_ROUNDS,
    DEFAULT_STEPS,
    DEFAULT_WARMUP,
    MODE_STRATEGIES,
    MODES,
    benchmark_shape,
    build_report,
    cpu_param_dtype,
    ratio_with_spread,
    report_from_json,
    resolve_modes,
    run_modes,
)
from gbdoctor.run.worker import ModeFailure, ModeJob, RankRun, run_mode_rank

__all__ = [
    "BASELINES",
    "DEFAULT_BACKEND",
    "DEFAULT_ROUNDS",
    "DEFAULT_STEPS",
    "DEFAULT_WARMUP",
    "MODES",
    "MODE_STRATEGIES",
    "ModeFailure",
    "ModeJob",
    "RankRun",
    "benchmark_shape",
    "build_report",
    "cpu_param_dtype",
    "ratio_with_spread",
    "report_from_json",
    "resolve_modes",
    "run_modes",
    "run_mode_rank",
]
