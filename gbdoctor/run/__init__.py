"""``run``: train for real under several compile configurations and compare them.

``driver`` (modes, fresh rank processes per mode, the report) -> ``worker`` (one rank of one
mode: build, set up, warm up, measure). Records are in ``records.run``.
"""

from gbdoctor.run.driver import (
    BASELINES,
    DEFAULT_STEPS,
    DEFAULT_WARMUP,
    MODE_STRATEGIES,
    MODES,
    build_report,
    report_from_json,
    resolve_modes,
    run_modes,
)
from gbdoctor.run.worker import ModeFailure, ModeJob, RankRun, run_mode_rank

__all__ = [
    "BASELINES",
    "DEFAULT_STEPS",
    "DEFAULT_WARMUP",
    "MODES",
    "MODE_STRATEGIES",
    "ModeFailure",
    "ModeJob",
    "RankRun",
    "build_report",
    "report_from_json",
    "resolve_modes",
    "run_modes",
    "run_mode_rank",
]
