"""Spawned local ranks (what ``setup.dist.run_ranks`` runs a job on): N processes on a real
gloo or nccl group, started once and fed jobs through pipes, so a series of jobs (``price``'s
rounds) can share them. The rendezvous store and gloo's transport listen on loopback only;
every child dies on failure, timeout, Ctrl-C or SIGTERM, and with the parent if it is killed
outright. What a rank and its parent agree on is ``setup.rank_protocol``'s; what a job must not
pass on to the next one on the same process is ``capture.job_state``'s.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from gbdoctor.errors import GbdoctorError, SetupError
from gbdoctor.setup.rank_main import STAGE_KEY, EnvironmentChange, rank_main
from gbdoctor.setup.rank_protocol import (
    FAILURE_GRACE_S,
    deadline_error,
    failure_error,
    pg_timeout,
)


def _stages(store: Any, ranks: list[int]) -> dict[int, str]:
    """What ``report_stage`` last said for each of ``ranks`` (``check`` first: a ``get`` of a
    missing key would wait for it)."""
    found = {}
    for rank in ranks:
        key = STAGE_KEY.format(rank=rank)
        with contextlib.suppress(Exception):
            if store is not None and store.check([key]):
                found[rank] = store.get(key).decode(errors="replace")
    return found


def _loopback_store(timeout_s: float) -> Any:
    """A TCPStore served by this process on a socket bound to 127.0.0.1 (never ``*:PORT``).

    torch's TCPStore binds its server to every interface; handing it an already-listening
    loopback socket (``master_listen_fd``) keeps the rendezvous unreachable from other machines,
    and the kernel-chosen port cannot be taken by another process between choice and bind.
    """
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            None,
            True,
            timedelta(seconds=pg_timeout(timeout_s)),
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now
    return store


def _start_quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (every spawned rank shares it) with its
    end-of-run warning silenced. A rank that is killed (at the deadline, after a peer failed,
    or from outside) cannot release the named semaphores its libraries made: torch.fx's
    interpreter makes tqdm's multiprocessing lock in every rank that compiles. The tracker
    unlinks them once gbdoctor ends, as it should, but printed "resource_tracker: There appear
    to be N leaked semaphore objects to clean up at shutdown" after gbdoctor's own error line,
    which already says which rank was killed. A no-op when the tracker already runs."""
    from multiprocessing import resource_tracker

    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    old = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = f"{old},{quiet}" if old else quiet  # the tracker's only
    try:
        resource_tracker.ensure_running()
    finally:
        if old is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = old


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


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "ended"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name}" + (
            " (out of memory?)" if -exitcode == signal.SIGKILL else ""
        )
    return f"exited with code {exitcode}"


class _Ranks:
    """The parent's view of N running ranks: a job pipe, a result pipe and a process sentinel
    each, and what the ranks said in the current exchange (group up, or one job)."""

    def __init__(self, procs: list[Any], jobs: list[Any], readers: list[Any], store: Any) -> None:
        self.procs = procs
        self.jobs = jobs
        self.readers = readers
        self.store = store
        self.messages: dict[int, tuple[Any, ...]] = {}
        self.silent: list[int] = []
        """Ranks that ended without sending a message, in the order they were seen to end."""
        self.on_progress: Callable[[str, int, int], None] | None = None
        """Where a rank's ``progress`` messages go during a job (none are answers)."""

    def pending(self) -> list[int]:
        return [
            r for r in range(len(self.procs)) if r not in self.messages and r not in self.silent
        ]

    def failures(self) -> bool:
        return bool(self.silent) or any(m[0] != "ok" for m in self.messages.values())

    def poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a rank to report or end, and record what happened."""
        from multiprocessing.connection import wait

        waiting = {}
        for r in self.pending():
            waiting[self.readers[r]] = r
            waiting[self.procs[r].sentinel] = r
        if not waiting:
            return
        ready = wait(list(waiting), timeout)
        # Pipes before sentinels: a rank that reported and then exited is not a silent death.
        ready.sort(key=lambda obj: not hasattr(obj, "recv"))
        for obj in ready:
            r = waiting[obj]
            if r in self.messages or r in self.silent:
                continue
            reader, ended = self.readers[r], obj is self.procs[r].sentinel
            try:
                if reader.poll():
                    message = reader.recv()
                    if message[0] == "progress":
                        if self.on_progress is not None:
                            self.on_progress(*message[2])
                        continue
                    self.messages[r] = message
                    continue
            except (EOFError, OSError):
                ended = True  # the pipe closed with nothing in it: the rank is ending silently
            if ended:
                self.procs[r].join(1)
                self.silent.append(r)

    def first_failure(self) -> GbdoctorError:
        """The failure that came first: a rank that ended without reporting (its peers' errors
        are echoes of its death), else the earliest reported error."""
        if self.silent:
            r = self.silent[0]
            code = self.procs[r].exitcode
            return SetupError(
                f"rank {r} {_how_it_ended(code)} before reporting a result",
                hint="the rank was killed (out of memory?), crashed in native code, or user code "
                "ended the process; run `gbdoctor --debug ...`",
            )
        failed = sorted(
            ((m[-1], r, m) for r, m in self.messages.items() if m[0] != "ok"), key=lambda t: t[:2]
        )
        return failure_error(failed[0][2])

    def send(self, job: Any) -> None:
        """Send one job to every rank (pickled once, here: a target that does not pickle by its
        qualified name fails in the parent). A rank that died since its last report is found
        by :meth:`collect`."""
        from multiprocessing.reduction import ForkingPickler

        data = bytes(ForkingPickler.dumps(job))
        for conn in self.jobs:
            with contextlib.suppress(BrokenPipeError):
                conn.send_bytes(data)

    def collect(self, deadline: float, timeout_s: float) -> list[Any]:
        """Every rank's answer to the current exchange, in rank order; the first failure (or
        the deadline's DeadlineError) raised instead."""
        self.messages, self.silent = {}, []
        while self.pending() and not self.failures():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise deadline_error(self.pending(), timeout_s, _stages(self.store, self.pending()))
            self.poll(min(1.0, remaining))
        if self.failures():
            grace = min(time.monotonic() + FAILURE_GRACE_S, deadline)
            while self.pending() and time.monotonic() < grace:
                self.poll(max(0.0, grace - time.monotonic()))
            raise self.first_failure()
        return [self.messages[r][2] for r in range(len(self.procs))]

    def stop(self, *, gracefully: bool) -> None:
        """End every rank: ``gracefully``, idle ranks leave their group and exit (10 s each);
        then whatever still runs is killed. All children are dead on return."""
        if gracefully:
            for conn in self.jobs:
                with contextlib.suppress(OSError):
                    conn.send(None)
            for p in self.procs:
                p.join(10)
        _kill_all(self.procs)
        for conn in (*self.jobs, *self.readers):
            conn.close()
        self.store = None


class RankPool:
    """``world_size`` spawned local ranks that run a series of jobs (``price``'s rounds) in the
    same processes: the ranks start (spawn, import torch, join the group) with the first job,
    and each later job starts from a fresh state (``capture.job_state``: Dynamo reset,
    counters cleared, the previous model collected), only without paying the start again.

    Per job the guarantees of ``setup.dist.run_ranks`` hold: ``timeout_s`` per job (the first one's
    counts the ranks' start) -> DeadlineError; a rank's GbdoctorError re-raised with its class,
    a crash or silent death as SetupError naming the rank. A job that fails in any way (or is
    interrupted) kills every rank: the next job gets fresh ranks. All children are dead after
    :meth:`close` (``with RankPool(...)``), and they die with this process (PR_SET_PDEATHSIG
    follows the thread that starts them: use a pool from the thread that made it).

    Under a launcher (``setup.launched``) its ranks run every job: they already persist.
    """

    def __init__(self, *, world_size: int, device_type: str, timeout_s: float) -> None:
        self.world_size = world_size
        self.device_type = device_type
        self.timeout_s = timeout_s
        self._ranks: _Ranks | None = None
        self._spawn_environment: dict[str, str] = {}

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pids(self) -> list[int]:
        """The process ids of the running ranks (none before the first job or after a failure)."""
        return [p.pid for p in self._ranks.procs] if self._ranks is not None else []

    def run(
        self,
        target: Callable[[Any], Any],
        payload: Any,
        *,
        timeout_s: float | None = None,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> list[Any]:
        """``target(payload)`` on every rank; the per-rank results in rank order. ``target``
        must be a module-level function (ranks unpickle it by its qualified name). ``progress``
        gets what rank 0's job reports (``rank_protocol.rank_progress``) while it runs."""
        from gbdoctor.setup import launched

        limit = self.timeout_s if timeout_s is None else timeout_s
        if launched.current() is not None:
            return launched.run_job(target, payload, world_size=self.world_size, timeout_s=limit)
        deadline = time.monotonic() + limit
        try:
            if self._ranks is None:
                self._ranks = self._start()
                self._ranks.collect(deadline, limit)
            self._ranks.send((target, payload, self._environment_change()))
            self._ranks.on_progress = progress
            try:
                return self._ranks.collect(deadline, limit)
            finally:
                if self._ranks is not None:
                    self._ranks.on_progress = None
        except BaseException:
            self.close(gracefully=False)
            raise

    def _environment_change(self) -> EnvironmentChange:
        """How this process's environment differs from the one the ranks were spawned with: a
        job sees the environment a fresh spawn would get now (a test's ``monkeypatch.setenv``,
        a command's ``TORCH_LOGS``, the working directory), not the one of the first job."""
        now = dict(os.environ)
        spawned = self._spawn_environment
        changed = {k: v for k, v in now.items() if spawned.get(k) != v}
        removed = tuple(sorted(k for k in spawned if k not in now))
        return changed, removed, list(sys.path), os.getcwd()

    def close(self, *, gracefully: bool = True) -> None:
        ranks, self._ranks = self._ranks, None
        if ranks is not None:
            ranks.stop(gracefully=gracefully)

    def _start(self) -> _Ranks:
        ctx = mp.get_context("spawn")
        self._spawn_environment = dict(os.environ)
        _start_quiet_resource_tracker()
        store = _loopback_store(self.timeout_s)
        procs, jobs, readers, ends = [], [], [], []
        for r in range(self.world_size):
            job_reader, job_writer = ctx.Pipe(duplex=False)
            reader, writer = ctx.Pipe(duplex=False)
            jobs.append(job_writer)
            readers.append(reader)
            ends.append((job_reader, writer))
            procs.append(
                ctx.Process(
                    target=rank_main,
                    daemon=True,
                    name=f"gbdoctor-rank{r}",
                    args=(
                        r,
                        self.world_size,
                        store.port,
                        self.device_type,
                        self.timeout_s,
                        job_reader,
                        writer,
                        os.getpid(),
                    ),
                )
            )
        ranks = _Ranks(procs, jobs, readers, store)
        try:
            for p, child_ends in zip(procs, ends):
                p.start()
                for end in child_ends:
                    end.close()  # the child holds these; a rank that dies closes its pipe
        except BaseException:
            ranks.stop(gracefully=False)
            raise
        return ranks
