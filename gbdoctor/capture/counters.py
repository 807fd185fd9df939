"""What ``run`` reads from Dynamo while training besides recompiles (``capture.recompiles``,
which DeepSpeed scans use too): Dynamo's graph and break counters, its frame-compile time, and
the kind of a failure (a Dynamo exception class).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

CUDAGRAPHS_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"
"""Inductor's ``cudagraphs`` artifact log: "skipping cudagraphs due to ..." (one per skip)."""


class CudagraphSkipRecorder(logging.Handler):
    """Inductor's cudagraph skip reasons (first line of each), in the order they were logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record never breaks training
            return
        if "cudagraph" in text:
            self.reasons.append((text.strip().splitlines() or [""])[0][:300])


@contextlib.contextmanager
def record_cudagraph_skips() -> Iterator[CudagraphSkipRecorder]:
    """Route inductor's cudagraph skip messages into a recorder for the duration of the block.

    Enables only the ``cudagraphs`` logging artifact (like ``capture.watch_recompiles``, which
    may be active around it), so the rest of the ``torch._logging`` state is left as it is."""
    from torch._logging._internal import log_state

    recorder = CudagraphSkipRecorder()
    logger = logging.getLogger(CUDAGRAPHS_LOGGER)
    was_enabled = log_state.is_artifact_enabled("cudagraphs")
    old_level, old_propagate = logger.level, logger.propagate
    log_state.enable_artifact("cudagraphs")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(recorder)
    logger.propagate = False
    try:
        yield recorder
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
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
