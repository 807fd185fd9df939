"""What ``run`` reads from Dynamo while training besides recompiles (``capture.recompiles``,
which DeepSpeed scans use too): Dynamo's graph and break counters, its frame-compile time, and
the kind of a failure (a Dynamo exception class).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

CUDAGRAPHS_LOGGERS = (
    "torch._inductor.cudagraph_utils.__cudagraphs",
    "torch._inductor.cudagraph_trees.__cudagraphs",
)
"""Inductor's ``cudagraphs`` artifact logs: "skipping cudagraphs due to ..." (one per skip) from
``cudagraph_utils``; recordings and "Re-recording function=F, reason=R" from ``cudagraph_trees``
(at debug level: enabling the artifact without taking these over prints every recording)."""

# torch 2.11: "Re-recording function=F, reason=R."; 2.13 adds ", mode=M" before the reason.
_RERECORD = re.compile(
    r"Re-recording function=(?P<function>[^,\s]+),(?:.*?)reason=(?P<reason>[^.\n]+)"
)


class CudagraphRecorder(logging.Handler):
    """Inductor's cudagraph skip reasons (first line of each) and re-recordings, in the order
    they were logged; the rest of what the artifact logs (every recording) is dropped."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []
        self.rerecords: list[str] = []
        """``function: reason`` of each re-recording (a cudagraph recorded again, e.g. because
        a static input moved: pytorch/pytorch#183451)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record never breaks training
            return
        rerecord = _RERECORD.search(text)
        if rerecord:
            self.rerecords.append(f"{rerecord['function']}: {rerecord['reason'].strip()}")
        elif "skipping cudagraph" in text:
            self.reasons.append((text.strip().splitlines() or [""])[0][:300])


@contextlib.contextmanager
def record_cudagraph_log() -> Iterator[CudagraphRecorder]:
    """Route inductor's cudagraph messages into a recorder for the duration of the block.

    Enables only the ``cudagraphs`` logging artifact (like ``capture.watch_recompiles``, which
    may be active around it), so the rest of the ``torch._logging`` state is left as it is."""
    from torch._logging._internal import log_state

    recorder = CudagraphRecorder()
    loggers = [logging.getLogger(name) for name in CUDAGRAPHS_LOGGERS]
    was_enabled = log_state.is_artifact_enabled("cudagraphs")
    saved = [(logger.level, logger.propagate) for logger in loggers]
    log_state.enable_artifact("cudagraphs")
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.addHandler(recorder)
        logger.propagate = False
    try:
        yield recorder
    finally:
        for logger, (level, propagate) in zip(loggers, saved, strict=True):
            logger.removeHandler(recorder)
            logger.setLevel(level)
            logger.propagate = propagate
        if not was_enabled:
            log_state.artifact_names.discard("cudagraphs")


def failure_kind(exc: BaseException) -> str:
    import torch._dynamo.exc as dexc

    if isinstance(exc, getattr(dexc, "FailOnRecompileLimitHit", ())):
        return "recompile-limit"  # fullgraph=True turns hitting recompile_limit into an error
    if isinstance(exc, dexc.Unsupported):
        return "graph-break"
    if isinstance(exc, dexc.TorchDynamoException):
        return "compile"
    return "runtime"


def counter_totals() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


def dynamo_compile_s() -> float:
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(compilation_time_metrics.get("_compile.compile_inner", [])))
