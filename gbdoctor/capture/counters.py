"""What ``run`` reads from Dynamo while training besides recompiles (``capture.recompiles``):
Dynamo's graph and break counters, its frame-compile time, and the kind of a failure (a Dynamo
exception class).
"""

from __future__ import annotations


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
