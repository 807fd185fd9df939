"""A fresh process's compile state, without a fresh process: what a job on a reused rank
process (``setup.rank_pool.RankPool``, ``price``'s rounds) must not inherit from the jobs before it
on that process, and how to drop it.
"""

from __future__ import annotations

import os
from typing import Any

JobStartState = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]


def job_start_state() -> JobStartState:
    """What :func:`restore_job_start_state` restores: the environment and Dynamo's and inductor's config,
    as they are when a rank is ready for its first job."""
    import torch._dynamo.config
    import torch._inductor.config

    return (
        dict(os.environ),
        torch._dynamo.config.get_config_copy(),
        torch._inductor.config.get_config_copy(),
    )


def restore_job_start_state(start: JobStartState) -> None:
    """Between two jobs on the same rank process: start the next one as a fresh process would,
    only without the process start, imports and group init. Dynamo forgets every compiled frame
    (the next job traces and compiles again, loading inductor's kernels from its caches as a new
    process does), its graph/break counters and compile times restart from zero, the
    environment and the compiler configs are ``start``'s (:func:`job_start_state`), the previous
    job's model is collected and the device's peak-memory counter restarts. A process's peak RSS
    cannot be reset: it covers every job the process ran."""
    import gc

    import torch
    import torch._dynamo
    import torch._dynamo.config
    import torch._inductor.config
    from torch._dynamo.utils import compilation_time_metrics, counters

    env, dynamo_config, inductor_config = start
    torch._dynamo.reset()
    counters.clear()
    compilation_time_metrics.clear()
    os.environ.clear()
    os.environ.update(env)
    for config, saved in (
        (torch._dynamo.config, dynamo_config),
        (torch._inductor.config, inductor_config),
    ):
        # Only what a job changed: setting every key warns about torch's deprecated ones.
        now = config.get_config_copy()
        for name, value in saved.items():
            if now.get(name) != value:
                setattr(config, name, value)
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def end_compile_workers() -> None:
    """Stop inductor's compile-worker processes of this process (they would outlive a rank
    that leaves with ``os._exit``, orphaned until they notice)."""
    from torch._inductor.async_compile import shutdown_compile_workers

    shutdown_compile_workers()
