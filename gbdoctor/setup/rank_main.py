"""Inside one spawned rank of a ``setup.rank_pool.RankPool``: join the group, then run the jobs the
parent sends, each in the parent's current environment; die with the parent; say where the rank
is (``report_stage``) so a deadline can name the block. The parent's side is ``rank_pool``'s."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from gbdoctor.capture.job_state import (
    end_compile_workers,
    job_start_state,
    restore_job_start_state,
)
from gbdoctor.setup.rank_protocol import (
    apply_dynamo_pins,
    failure_message,
    loopback_interface,
    pg_timeout,
    set_rank_progress,
)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

STAGE_KEY = "gbdoctor/stage/{rank}"
_stage_store: Any = None
"""This spawned rank's client of the job's store (None in the parent and under a launcher)."""


def report_stage(stage: str) -> None:
    """Say where this rank is (``capturing layers.3``), so that a job that reaches its deadline
    names the block each unfinished rank was at. A store write, never a wait on another rank;
    a no-op outside a spawned rank."""
    if _stage_store is not None:
        with contextlib.suppress(Exception):
            _stage_store.set(STAGE_KEY.format(rank=os.environ.get("RANK", "0")), stage)


def rank_threads(world_size: int) -> int:
    """Intra-op threads for one rank: the cores this process may run on, shared among the ranks,
    at most ``OMP_NUM_THREADS`` when the caller set it (a test runner's worker or a shared
    machine caps its ranks with it, a count per process as torchrun reads it). More threads than
    cores make the ranks crawl: idle OpenMP threads spin against the busy ones."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    share = max(1, (cores or 1) // world_size)
    explicit = os.environ.get("OMP_NUM_THREADS", "")
    return min(share, int(explicit)) if explicit.isdigit() and int(explicit) > 0 else share


def _die_with_parent(parent_pid: int) -> None:
    """Make this rank die when the gbdoctor process that spawned it dies, however it dies
    (kill -9 included): PR_SET_PDEATHSIG on Linux, a watcher thread elsewhere."""
    # The user-code guard replaces os._exit later; the watcher must not see that.
    real_exit = os._exit
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    else:
        armed = False
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        real_exit(1)
    if armed:
        return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        real_exit(1)

    threading.Thread(target=watch, name="gbdoctor-parent-watch", daemon=True).start()


EnvironmentChange = tuple[dict[str, str], tuple[str, ...], list[str], str]
"""(variables set or changed, variables removed) since the ranks were spawned, and the
parent's ``sys.path`` and working directory (a spawned process starts with the parent's)."""


def _apply_environment(change: EnvironmentChange) -> None:
    """On a rank, before a job: the parent's environment changes since the spawn (on top of the
    rank's own variables, which the parent's environment never holds), ``sys.path`` and working
    directory."""
    changed, removed, path, cwd = change
    sys.path[:] = path
    # The parent's now (a test's monkeypatch.chdir), not the first job's or what a job's user
    # code changed it to: relative paths a job reads resolve as on a fresh spawn.
    os.chdir(cwd)
    os.environ.update({k: v for k, v in changed.items() if k not in _RANK_OWN_VARIABLES})
    for name in removed:
        if name not in _RANK_OWN_VARIABLES:
            os.environ.pop(name, None)


_RANK_OWN_VARIABLES = frozenset(
    ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GLOO_SOCKET_IFNAME")
)
"""What :func:`rank_main` sets for itself: the rank's identity and its group's address."""


def rank_main(
    rank: int,
    world_size: int,
    port: int,
    device_type: str,
    timeout_s: float,
    jobs: Any,
    results: Any,
    parent_pid: int,
) -> None:
    """Entry point of one spawned rank: init the group, then run the jobs the parent sends.

    The parent owns the rank: it ignores Ctrl-C (the parent stops it) and dies with the
    parent. Through ``results`` (a pipe) goes ``ok`` once the group is up, then one message per
    job: ``ok`` with the result, ``gbdoctor`` (a GbdoctorError, re-raised by the parent with its
    class) or ``crash``; each failure carries the wall time it happened at, so the parent can
    tell the first failure from its echoes. A job is ``(target, payload, environment change)`` on ``jobs``; None, or
    the parent closing the pipe, ends the rank. After a failure the rank ends (the parent stops
    its peers); after a success the next job starts from a fresh state
    (``capture.job_state``).
    """
    real_exit = os._exit  # user code may replace it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    apply_dynamo_pins()
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    loopback = loopback_interface()
    if loopback:
        # gloo's pairs listen on loopback only. Forced, not a default: these ranks all run on
        # this machine, and a GLOO_SOCKET_IFNAME left in the environment for the user's own
        # multi-node jobs would make them listen on an external address.
        os.environ["GLOO_SOCKET_IFNAME"] = loopback
    # Decided before the default below, which would otherwise cap every rank at one thread;
    # the default is for the rank's own children (inductor's compile workers, g++).
    threads = rank_threads(world_size)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from gbdoctor.usercode import exits_guarded

    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        if device_type == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        backend = "nccl" if device_type == "cuda" else "gloo"
        timeout = timedelta(seconds=pg_timeout(timeout_s))
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        global _stage_store
        _stage_store = store
    except BaseException as exc:  # noqa: BLE001 - a rank's failure is reported, never swallowed
        results.send(failure_message(rank, exc))
        results.close()
        return
    results.send(("ok", rank, None))
    start = job_start_state()
    try:
        while True:
            try:
                job = jobs.recv()
            except (EOFError, OSError):
                break  # the parent closed the pipe: no more jobs
            except BaseException as exc:  # noqa: BLE001 - the job did not unpickle here
                results.send(failure_message(rank, exc))
                break
            if job is None:
                break
            target, payload, environment = job
            _apply_environment(environment)
            # Rank 0 says what it is doing; its peers run the same stages in step with it.
            set_rank_progress(
                (
                    lambda message, done, total: results.send(
                        ("progress", rank, (message, done, total))
                    )
                )
                if rank == 0
                else None
            )
            try:
                # stdout is the report: whatever a rank prints (the model, DeepSpeed) goes to
                # stderr.
                with exits_guarded(), contextlib.redirect_stdout(sys.stderr):
                    message: tuple[Any, ...] = ("ok", rank, target(payload))
            except BaseException as exc:  # noqa: BLE001 - reported, never swallowed
                message = failure_message(rank, exc)
            del job, target, payload
            results.send(message)
            if message[0] != "ok":
                break
            del message
            restore_job_start_state(start)
    finally:
        dist.destroy_process_group()
    results.close()
    end_compile_workers()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    # Done: skip the interpreter's teardown (finalizing torch's modules and the rest), which
    # took 1 to 4 s per job while the parent waited for it.
    real_exit(0)
