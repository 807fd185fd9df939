"""Process groups, device meshes, and running a job on N local ranks.

World size 1 runs in-process on a real (gloo or nccl) process group; world size N > 1 runs as
N spawned local processes. A job has a wall-clock limit so a hung rank never hangs the tool, and
every child is killed on failure, timeout or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import os
import queue as queue_mod
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from gbdoctor.errors import GbdoctorError, SetupError
from gbdoctor.records import ParallelSpec


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


@dataclass
class Meshes:
    """Device meshes of one rank, built the way torchtitan's dp2ep layout builds them."""

    rank: int
    world_size: int
    device: Any
    """torch.device of this rank."""
    dp: Any
    """Mesh FSDP2 shards dense parameters over (1-D dp_shard, or 2-D with dp_replicate)."""
    ep: Any | None
    """1-D expert-parallel mesh (None when EP is 1)."""
    edp: Any | None
    """Mesh FSDP2 shards expert parameters over when EP > 1 (efsdp = dp_shard / ep)."""

    @property
    def dp_group(self) -> Any:
        """Group over which data-parallel quantities (loss, token counts) are summed."""
        import torch.distributed as dist

        return dist.group.WORLD

    @property
    def ep_degree(self) -> int:
        return 1 if self.ep is None else self.ep.size()


def build_meshes(parallel: ParallelSpec, device_type: str) -> Meshes:
    """Meshes for an initialized default process group whose size is ``parallel.world_size``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()
    if world != parallel.world_size:
        raise SetupError(
            f"process group has {world} ranks but the spec needs {parallel.world_size}"
        )
    rep, shard, ep = (
        parallel.data_parallel_replicate_degree,
        parallel.dp_shard,
        parallel.expert_parallel_degree,
    )
    if rep > 1:
        dp = init_device_mesh(
            device_type, (rep, shard), mesh_dim_names=("dp_replicate", "dp_shard")
        )
    else:
        dp = init_device_mesh(device_type, (shard,), mesh_dim_names=("dp_shard",))
    ep_mesh = edp = None
    if ep > 1:
        # EP borrows ranks from the FSDP dimension ("dp2ep"): dp_shard = efsdp * ep.
        sparse = init_device_mesh(
            device_type, (rep, shard // ep, ep), mesh_dim_names=("dp_replicate", "efsdp", "ep")
        )
        ep_mesh = sparse["ep"]
        edp = sparse["dp_replicate", "efsdp"] if rep > 1 else sparse["efsdp"]
    if device_type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device(device_type)
    return Meshes(rank=rank, world_size=world, device=device, dp=dp, ep=ep_mesh, edp=edp)


@contextlib.contextmanager
def single_process_group(device_type: str) -> Iterator[None]:
    """A real world-size-1 process group in this process (gloo on CPU, nccl on CUDA)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise SetupError("a torch.distributed process group is already initialized in this process")
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    device_type: str,
    timeout_s: float,
    target: Callable[[Any], Any],
    payload: Any,
    results: Any,
) -> None:
    """Entry point of one spawned rank: init the group, run ``target(payload)``, report."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    # Ranks share the machine's cores; oversubscribing threads makes gloo ranks crawl.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        if device_type == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=max(30.0, timeout_s)),
        )
        try:
            # stdout is the report: whatever a rank prints (the model, DeepSpeed) goes to stderr.
            with contextlib.redirect_stdout(sys.stderr):
                out = target(payload)
        finally:
            dist.destroy_process_group()
        results.put(("ok", rank, out))
    except GbdoctorError as exc:
        results.put(
            ("gbdoctor", rank, (type(exc).__module__, type(exc).__name__, exc.message, exc.hint))
        )
    except BaseException as exc:  # noqa: BLE001 - a rank's failure is reported, never swallowed
        results.put(("crash", rank, f"{type(exc).__name__}: {exc}", traceback.format_exc()))


def _kill_all(procs: list[Any]) -> None:
    procs = [p for p in procs if p.pid is not None]  # never started: nothing to kill
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1)


def run_ranks(
    target: Callable[[Any], Any],
    payload: Any,
    *,
    world_size: int,
    device_type: str,
    timeout_s: float,
) -> list[Any]:
    """Run ``target(payload)`` on ``world_size`` spawned ranks and return the per-rank results in
    rank order. ``target`` must be a module-level function (spawned ranks unpickle it by its
    qualified name, so a rename fails here, in the parent, not inside a child).

    Raises SetupError on timeout or crash (with the failing rank's message), or re-raises the
    GbdoctorError a rank raised (same class and hint). All children are dead on return.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_rank_main,
            daemon=True,
            args=(r, world_size, port, device_type, timeout_s, target, payload, results),
        )
        for r in range(world_size)
    ]
    outs: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.start()
        while len(outs) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(outs))
                raise SetupError(
                    f"rank(s) {missing} did not finish within {timeout_s:.0f} s",
                    hint="a rank hung or is very slow; raise --set gbdoctor.timeout_s=... or use --debug",
                )
            try:
                msg = results.get(timeout=min(1.0, remaining))
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in outs]
                if dead and results.empty():
                    time.sleep(0.5)  # a result may still be in flight from a rank that just exited
                    if results.empty():
                        codes = {r: procs[r].exitcode for r in dead}
                        raise SetupError(
                            f"rank(s) {dead} exited without a result (exit codes {codes})",
                            hint="the worker was killed (out of memory?) or crashed in native code",
                        ) from None
                continue
            status, rank = msg[0], msg[1]
            if status == "ok":
                outs[rank] = msg[2]
            elif status == "gbdoctor":
                module, name, message, hint = msg[2]
                cls = getattr(importlib.import_module(module), name, SetupError)
                raise cls(f"rank {rank}: {message}", hint)
            else:
                detail, tb = msg[2], msg[3]
                err = SetupError(
                    f"rank {rank} failed: {detail}", hint="run with --debug for the traceback"
                )
                err.remote_traceback = tb  # type: ignore[attr-defined]
                raise err
        for p in procs:
            p.join(10)
        return [outs[r] for r in range(world_size)]
    finally:
        _kill_all(procs)
