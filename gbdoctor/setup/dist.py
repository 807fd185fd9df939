"""Where a job's ranks run: this process, or N spawned local processes.

World size 1 runs in-process on a real (gloo or nccl) process group; world size N > 1 runs as
N spawned local processes. A job has a wall-clock limit so a hung rank never hangs the tool, and
every child is killed on failure, timeout, Ctrl-C or SIGTERM; ranks also die when the parent is
killed outright. The rendezvous store and gloo's transport listen on loopback only. The meshes
of a rank are ``setup.mesh``'s; what a rank and its parent agree on (timeouts, failure reports)
is ``setup.rank_protocol``'s; the spawned ranks are ``setup.rank_pool``'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from gbdoctor.contain import time_limited
from gbdoctor.errors import SetupError
from gbdoctor.setup.rank_pool import RankPool
from gbdoctor.setup.rank_protocol import deadline_error

__all__ = ["RankPool", "resolve_device", "run_ranks", "shared_ranks", "single_process_group"]


def resolve_device(requested: str) -> str:
    """``auto`` picks cuda when it is available; an explicit ``cuda`` without a GPU is an error."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise SetupError(
            "device 'cuda' requested but no CUDA device is available",
            hint="use --set gbdoctor.device=cpu (or auto)",
        )
    return requested


@contextlib.contextmanager
def single_process_group(device_type: str, timeout_s: float | None = None) -> Iterator[None]:
    """A real world-size-1 process group in this process (gloo on CPU, nccl on CUDA); under a
    launcher of one rank, the launcher's. ``timeout_s``: the job's limit, as for spawned ranks
    (``contain.time_limited``: the user code in the body runs in this process)."""
    import torch.distributed as dist

    from gbdoctor.setup import launched

    limit = (
        time_limited(timeout_s, lambda: deadline_error([0], timeout_s))
        if timeout_s is not None
        else contextlib.nullcontext()
    )
    with limit:
        if launched.current() is not None:
            # Under a launcher of one rank, its group is the world-size-1 group.
            launched.check_world(1)
            yield
            return
        if dist.is_initialized():
            raise SetupError(
                "a torch.distributed process group is already initialized in this process"
            )
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def run_ranks(
    target: Callable[[Any], Any],
    payload: Any,
    *,
    world_size: int,
    device_type: str,
    timeout_s: float,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[Any]:
    """Run ``target(payload)`` on ``world_size`` freshly spawned ranks and return the per-rank
    results in rank order. ``target`` must be a module-level function (spawned ranks unpickle
    it by its qualified name, so a rename fails here, in the parent, not inside a child).

    Raises SetupError on timeout or crash, naming the rank that failed first and how (exit code
    or signal), or re-raises the GbdoctorError a rank raised (same class and hint). All children
    are dead on return, and they die with this process if it is killed.

    Inside :func:`shared_ranks` the ranks are not fresh: the scope's pool for this world size
    and device runs the job. Under a launcher (``setup.launched``) the launcher's ranks run it
    instead, this process being rank 0; a world size that is not the launcher's is a SpecError
    (exit 2). ``progress``: what rank 0's job reports (``rank_protocol.rank_progress``).
    """
    if _shared_pools is not None:
        key = (world_size, device_type)
        if key not in _shared_pools:
            _shared_pools[key] = RankPool(
                world_size=world_size, device_type=device_type, timeout_s=timeout_s
            )
        return _shared_pools[key].run(target, payload, timeout_s=timeout_s, progress=progress)
    with RankPool(world_size=world_size, device_type=device_type, timeout_s=timeout_s) as pool:
        return pool.run(target, payload, progress=progress)


_shared_pools: dict[tuple[int, str], RankPool] | None = None
"""The open :func:`shared_ranks` scope's pools per (world size, device); None outside one."""


@contextlib.contextmanager
def shared_ranks() -> Iterator[None]:
    """Inside, :func:`run_ranks` sends its jobs to one :class:`RankPool` per world size and
    device, started by the first such job and closed (every rank dead) when the scope ends:
    ``price``, whose scan and rounds would otherwise start ranks for every job. A nested scope
    uses the outer one's ranks. Use it from one thread (the pool's docstring says why)."""
    global _shared_pools
    if _shared_pools is not None:
        yield
        return
    pools: dict[tuple[int, str], RankPool] = {}
    _shared_pools = pools
    try:
        yield
    finally:
        _shared_pools = None
        for pool in pools.values():
            pool.close()


@contextlib.contextmanager
def fresh_ranks() -> Iterator[None]:
    """Inside, :func:`run_ranks` spawns fresh ranks per job again, also within an open
    :func:`shared_ranks` scope, whose pools stay open for after: for a job whose result depends
    on the process being new (``run``'s compile time and peak RSS, ``run/rounds.py``)."""
    global _shared_pools
    pools, _shared_pools = _shared_pools, None
    try:
        yield
    finally:
        _shared_pools = pools
