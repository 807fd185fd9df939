"""``run``: train for real under several compile configurations and compare them.

``driver`` (the plan, modes in rounds of fresh rank processes) -> ``worker`` (one rank of one
mode: build, set up, warm up, measure each step per phase); ``modes`` (which modes, the
defaults, the benchmark shape); ``stats`` (a mode's result over its rounds, ratios with their
spread); ``assemble`` (the report: ratios, notes, findings, the plan's verdict);
``flops`` (FLOPs per token from the model config, device peaks, MFU); ``settings`` (the one
``RunSettings`` of ``run``, ``price`` and ``timeline``, and the spec their ranks train). Records
are in ``records.run`` and ``records.settings``.
"""

from gbdoctor.run.assemble import build_report, report_from_json
from gbdoctor.run.driver import run_modes
from gbdoctor.run.modes import (
    BASELINES,
    DEFAULT_BACKEND,
    DEFAULT_ROUNDS,
    DEFAULT_STEPS,
    DEFAULT_WARMUP,
    MODE_STRATEGIES,
    MODES,
    benchmark_shape,
    cpu_param_dtype,
    resolve_modes,
)
from gbdoctor.run.settings import Shape, prepare_training, run_settings
from gbdoctor.run.stats import ratio_with_spread
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
    "Shape",
    "benchmark_shape",
    "build_report",
    "cpu_param_dtype",
    "prepare_training",
    "ratio_with_spread",
    "report_from_json",
    "resolve_modes",
    "run_modes",
    "run_mode_rank",
    "run_settings",
]
