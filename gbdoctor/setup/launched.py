"""Running as one rank of a job a launcher started (torchrun, deepspeed, srun): docs/launchers.md.

Every process is already a rank, so gbdoctor joins the launcher's process group instead of
spawning one. Rank 0 runs the command (reads the spec, decides, merges, writes output and the
exit text); each multi-rank job (``setup.dist.run_ranks``: a target and its payload) goes to
the other ranks through the group's store, every rank runs it, and rank 0 gathers the results
(``gather_object``). At the end rank 0 publishes its exit code and every rank exits with it,
so the launcher reports the job's result.

No rank may wait in a collective for a peer that will never come: a rank whose job raises posts
the failure to the store, and a watcher thread on every rank sees it and ends that rank (rank 0
prints the failure first, in the CLI's one-line form), with the failure's exit code on every
rank. Rank 0's watcher also stops the job at its timeout, naming the ranks that did not finish.
A rank that dies outright is the launcher's to see: torchrun and the DeepSpeed launcher stop
every rank (SIGTERM ends a rank at once during a job), ``srun --kill-on-bad-exit=1`` does the
same; otherwise the job timeout ends it. Ranks whose rank 0 vanished (its store is gone) exit.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

from gbdoctor.errors import DEBUG_ENV, ExitCode, GbdoctorError, SetupError, SpecError
from gbdoctor.launcher import Launched
from gbdoctor.records.enums import Launcher
from gbdoctor.setup.rank_protocol import (
    FAILURE_GRACE_S,
    deadline_error,
    failure_error,
    failure_message,
    loopback_interface,
    lost_peer,
    pg_timeout,
)
from gbdoctor.setup.rendezvous import rendezvous

POLL_S = 0.1
"""How often a waiting rank looks at the store (a job to run, a failure, its peers' exits)."""
EXIT_ACK_S = 30.0
"""How long rank 0 waits, after publishing the exit code, for the other ranks to read it (rank 0
may host the store: leaving first would make them fail to read it)."""
HEARTBEAT_S = 1.0
"""How often each rank's watcher thread tells the others it is alive (a counter in the store)."""
SILENCE_ENV = "GBDOCTOR_PEER_SILENCE_S"
SILENCE_S = 60.0
"""How long a rank may stay silent before its peers give up on it (``GBDOCTOR_PEER_SILENCE_S``
overrides it): a process that is stopped, or a node that vanished without closing its
connections, never ends a collective, and no launcher sees it."""
RENDEZVOUS_S = 1800.0
"""How long ranks wait for each other at the start, and for rank 0's next job: rank 0 reads
the spec and may decide and estimate before the first job."""


@dataclass
class Session:
    """This process's membership in the launcher's job."""

    launched: Launched
    store: Any
    """The control store (a PrefixStore over the launcher's rendezvous store)."""
    real_exit: Callable[[int], NoReturn]
    """``os._exit`` as it was at join time (the user-code guard replaces it during commands)."""
    jobs: int = 0
    ending: threading.Lock = field(default_factory=threading.Lock)
    """Taken by whoever reports the job's failure, so it is reported once."""
    deadline: tuple[int, float, float] | None = None
    """(job number, monotonic deadline, timeout in s) of the job running now; rank 0 watches it."""
    stopped: threading.Event = field(default_factory=threading.Event)
    """Set when the command is over: the watcher ends before the process does."""
    watcher: threading.Thread | None = None

    @property
    def rank(self) -> int:
        return self.launched.rank

    @property
    def world_size(self) -> int:
        return self.launched.world_size

    def post_failure(self, message: tuple[Any, ...]) -> tuple[Any, ...]:
        """Post this rank's failure unless another came first; returns the first failure."""
        if self.store.add("failures", 1) == 1:
            self.store.set("fail", _encode(message))
            return message
        return _decode(self.store.get("fail"))

    def end(self, message: tuple[Any, ...]) -> NoReturn:
        """End this process for the job's first failure (rank 0 prints it first)."""
        err = failure_error(message)
        if self.rank == 0:
            _say(f"Error: {err.message}")
            if err.hint:
                _say(f"Hint: {err.hint}")
            remote = getattr(err, "remote_traceback", None)
            if remote and os.environ.get(DEBUG_ENV) == "1":
                _say(remote)
        self.leave(int(err.exit_code))

    def leave(self, code: int) -> NoReturn:
        with contextlib.suppress(Exception):
            self.store.add("exited", 1)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self.real_exit(code)


_SESSION: list[Session] = []


def current() -> Session | None:
    """The session this process joined, or None (gbdoctor spawns its own ranks)."""
    return _SESSION[0] if _SESSION else None


def layout(world_size: int) -> tuple[Launcher, int, int]:
    """(launcher, nodes, ranks per node) of a job of ``world_size`` ranks run now."""
    session = current()
    if session is None:
        return Launcher.SELF, 1, world_size
    launched = session.launched
    return launched.launcher, launched.nodes, launched.local_world_size


def check_world(world_size: int) -> None:
    """SpecError (exit 2) when the spec's world size is not the launcher's."""
    session = current()
    if session is not None and world_size != session.world_size:
        launched = session.launched
        raise SpecError(
            f"the spec's world size is {world_size} but {launched.launcher} started "
            f"{launched.world_size} ranks",
            hint=f"start {world_size} ranks (torchrun --nproc-per-node {world_size} ...) or set "
            "the spec's [parallelism] degrees to the launcher's world size",
        )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _encode(obj: Any) -> str:
    return base64.b64encode(pickle.dumps(obj)).decode("ascii")


def _decode(raw: bytes) -> Any:
    return pickle.loads(base64.b64decode(raw))


def join(launched: Launched) -> Session:
    """Join the launcher's process group (gloo; with CUDA, nccl for CUDA tensors and one GPU per
    local rank) and start the watcher. Called once, before the command runs."""
    import torch
    import torch.distributed as dist

    silence_s = _silence_s()  # bad input before any rank waits for another

    if launched.launcher == Launcher.SLURM:
        # srun tells the rank in SLURM_* variables; torch's env:// reads these.
        os.environ.update(
            RANK=str(launched.rank),
            WORLD_SIZE=str(launched.world_size),
            LOCAL_RANK=str(launched.local_rank),
            MASTER_ADDR=launched.master_addr,
            MASTER_PORT=str(launched.master_port),
        )
    loopback = loopback_interface()
    if launched.nodes == 1 and loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
        # Every rank is on this machine: gloo's pairs listen on loopback, as for own ranks.
        # Across nodes the user's GLOO_SOCKET_IFNAME (or the hostname's interface) is needed.
        os.environ["GLOO_SOCKET_IFNAME"] = loopback
    backend = "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(launched.local_rank % torch.cuda.device_count())
        backend = "cpu:gloo,cuda:nccl"
    try:
        store = rendezvous(launched, RENDEZVOUS_S)
        dist.init_process_group(
            backend,
            store=dist.PrefixStore("gbdoctor/pg", store),
            rank=launched.rank,
            world_size=launched.world_size,
            timeout=timedelta(seconds=pg_timeout(RENDEZVOUS_S)),
        )
    except (RuntimeError, ValueError, OSError) as exc:
        raise SetupError(
            f"cannot join the {launched.launcher} job at "
            f"{launched.master_addr}:{launched.master_port} as rank {launched.rank}: "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
            hint="check MASTER_ADDR/MASTER_PORT and that every rank was started",
        ) from None
    session = Session(
        launched=launched,
        store=dist.PrefixStore("gbdoctor/ctl", store),
        real_exit=os._exit,
    )
    _SESSION[:] = [session]
    watcher_store = dist.PrefixStore("gbdoctor/ctl", store.clone())
    session.watcher = threading.Thread(
        target=_watch,
        args=(session, watcher_store, silence_s),
        name="gbdoctor-launch-watch",
        daemon=True,
    )
    session.watcher.start()
    return session


@dataclass
class _Heartbeats:
    """The watcher's view of its peers' heartbeats: the last count seen and when it changed."""

    ranks: list[int]
    silence_s: float
    counts: dict[int, int] = field(default_factory=dict)
    changed: dict[int, float] = field(default_factory=dict)
    next_beat: float = 0.0

    def tick(self, store: Any, rank: int, now: float) -> list[int]:
        """Beat for ``rank``; the watched ranks silent for longer than ``silence_s``."""
        if now < self.next_beat:
            return []
        self.next_beat = now + HEARTBEAT_S
        store.add(f"beat/{rank}", 1)
        silent = []
        for r in self.ranks:
            count = store.add(f"beat/{r}", 0)
            if self.counts.get(r) != count:
                self.counts[r], self.changed[r] = count, now
            elif now - self.changed[r] > self.silence_s:
                silent.append(r)
        return silent


def _silence_s() -> float:
    """``GBDOCTOR_PEER_SILENCE_S`` when set (read once, when the rank joins), else 60 s."""
    raw = os.environ.get(SILENCE_ENV, "").strip()
    if not raw:
        return SILENCE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SpecError(
            f"{SILENCE_ENV}={raw!r} is not a positive number of seconds",
            hint=f"unset it (default {SILENCE_S:g} s) or give e.g. {SILENCE_ENV}=120",
        )
    return value


def _watch(session: Session, store: Any, silence_s: float) -> None:
    """Every rank: end this process when another rank's job failed; beat. Rank 0: stop a job at
    its timeout, or when a rank went silent during it. Any rank but 0: exit when the store is
    gone (rank 0, which may host it, ended) or rank 0 went silent."""
    others = [r for r in range(session.world_size) if r != session.rank]
    beats = _Heartbeats(others if session.rank == 0 else [0], silence_s)
    while not session.stopped.wait(POLL_S):
        try:
            silent = beats.tick(store, session.rank, time.monotonic())
            failed = store.check(["fail"])
            message = _decode(store.get("fail")) if failed else None
            job = session.deadline
            missing = (
                [r for r in range(session.world_size) if not store.check([f"done/{job[0]}/{r}"])]
                if session.rank == 0 and job is not None and time.monotonic() > job[1]
                else []
            )
        except Exception:  # noqa: BLE001 - the store is gone: so is the job
            if session.rank != 0 and session.ending.acquire(blocking=False):
                _say(f"gbdoctor rank {session.rank}: lost rank 0's store (rank 0 ended)")
                session.leave(int(ExitCode.ENVIRONMENT))
            return
        if message is not None and message[1] != session.rank:
            if session.ending.acquire(blocking=False):
                session.end(message)
            return
        if silent and session.rank != 0 and session.ending.acquire(blocking=False):
            _say(
                f"gbdoctor rank {session.rank}: rank 0 sent no heartbeat for "
                f"{beats.silence_s:g} s (stopped, or its node is gone)"
            )
            session.leave(int(ExitCode.ENVIRONMENT))
        if silent and session.rank == 0 and job is not None and session.ending.acquire(False):
            gone = SetupError(
                f"rank(s) {silent} sent no heartbeat for {beats.silence_s:g} s while the job ran "
                "(a stopped process, or a node that vanished without closing its connections)",
                hint=f"check those ranks' nodes; {SILENCE_ENV} sets the silence allowed",
            )
            session.end(session.post_failure(failure_message(0, gone)))
        if missing and job is not None and session.ending.acquire(blocking=False):
            timeout = deadline_error(missing, job[2])
            session.end(session.post_failure(failure_message(0, timeout)))


@contextlib.contextmanager
def _job(session: Session, timeout_s: float) -> Iterator[int]:
    """One job on this rank: fresh Dynamo state, the report's stdout kept clean, SIGTERM (the
    launcher stopping the job after a peer died) ending the rank even inside a collective."""
    import torch

    n = session.jobs
    session.jobs += 1
    torch.compiler.reset()
    session.deadline = (n, time.monotonic() + timeout_s, timeout_s)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield n
    finally:
        signal.signal(signal.SIGTERM, previous)
        session.deadline = None


def _run_target(session: Session, n: int, target: Callable[[Any], Any], payload: Any) -> Any:
    """Run the job's target here (user code's exits are errors); a failure is posted, and
    reported as the job's first one."""
    from gbdoctor.usercode import exits_guarded

    try:
        with exits_guarded():
            out = target(payload)
    except BaseException as exc:  # noqa: BLE001 - posted so no peer waits for this rank
        gone = lost_peer(exc)
        if gone is not None:
            exc = _peer_gone(session, n, exc, gone)
        first = session.post_failure(failure_message(session.rank, exc))
        if session.rank != 0:
            if session.ending.acquire(blocking=False):
                session.end(first)
            session.leave(int(ExitCode.ENVIRONMENT))
        if not session.ending.acquire(blocking=False):
            time.sleep(3600)  # the watcher is ending this process with the first failure
        if first[1] == 0 and isinstance(exc, GbdoctorError | KeyboardInterrupt):
            raise exc  # not a bare raise: a lost peer replaced the exception caught
        raise failure_error(first) from None
    session.store.set(f"done/{n}/{session.rank}", "1")
    return out


def _peer_gone(session: Session, n: int, exc: BaseException, gone: str) -> BaseException:
    """This rank's collective failed because a peer went away: that peer's own failure, if it
    posts one within the grace time, is the job's first; otherwise a peer died outright
    (SIGKILL, a native crash) and this says so instead of blaming the model."""
    deadline = time.monotonic() + FAILURE_GRACE_S
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if session.store.check(["fail"]):
                return exc  # post_failure will return the peer's failure as the first
        time.sleep(POLL_S)
    unfinished = []
    for r in range(session.world_size):
        with contextlib.suppress(Exception):
            if r != session.rank and not session.store.check([f"done/{n}/{r}"]):
                unfinished.append(r)
    return SetupError(
        f"a peer rank went away while this rank waited for it in a collective ({gone}); "
        f"ranks not finished: {unfinished}",
        hint="the launcher's summary names the rank that died and how (SIGKILL: out of host "
        "memory?); run `gbdoctor --debug ...` for the traceback",
    )


def run_job(
    target: Callable[[Any], Any], payload: Any, *, world_size: int, timeout_s: float
) -> list[Any]:
    """Rank 0: run ``target(payload)`` on every rank of the launcher's job; results in rank order."""
    import torch.distributed as dist

    session = current()
    assert session is not None and session.rank == 0
    check_world(world_size)
    env = {k: v for k, v in os.environ.items() if k.startswith("GBDOCTOR_")}
    with _job(session, timeout_s) as n:
        session.store.set(f"job/{n}", _encode(("run", target, payload, timeout_s, env)))
        out = _run_target(session, n, target, payload)
        results: list[Any] = [None] * session.world_size
        dist.gather_object(out, results, dst=0)
    return results


def _next_message(session: Session, n: int) -> tuple[Any, ...]:
    key = f"job/{n}"
    while not session.store.check([key]):
        time.sleep(POLL_S)
    message: tuple[Any, ...] = _decode(session.store.get(key))
    return message


def serve(session: Session) -> NoReturn:
    """Ranks other than 0: run rank 0's jobs until it publishes the exit code, then exit with it."""
    import torch.distributed as dist

    from gbdoctor.setup.rank_protocol import apply_dynamo_pins

    # Ctrl-C and SIGTERM end a rank at once: rank 0 reports, the launcher stops the job.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        while True:
            message = _next_message(session, session.jobs)
            if message[0] == "exit":
                break
            _, target, payload, timeout_s, env = message
            for key in [k for k in os.environ if k.startswith("GBDOCTOR_")]:
                del os.environ[key]
            os.environ.update(env)
            apply_dynamo_pins()
            with _job(session, timeout_s) as n:
                out = _run_target(session, n, target, payload)
                dist.gather_object(out, None, dst=0)
    except Exception:  # noqa: BLE001 - the store or the group failed: rank 0 is gone
        if session.ending.acquire(blocking=False):
            _say(f"gbdoctor rank {session.rank}: the job ended under it")
            if os.environ.get(DEBUG_ENV) == "1":
                _say(traceback.format_exc())
            session.leave(int(ExitCode.ENVIRONMENT))
        time.sleep(3600)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    session.leave(int(message[1]))


def lead(session: Session, command: Callable[[], Any]) -> NoReturn:
    """Rank 0: run the command, then publish its exit code and wait for every rank to read it."""
    code: int = int(ExitCode.ENVIRONMENT)
    try:
        command()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        if session.ending.acquire(blocking=False):
            with contextlib.suppress(Exception):
                session.store.set(f"job/{session.jobs}", _encode(("exit", code)))
                deadline = time.monotonic() + EXIT_ACK_S
                while (
                    session.store.add("exited", 0) < session.world_size - 1
                    and time.monotonic() < deadline
                ):
                    time.sleep(POLL_S)
    session.stopped.set()
    if session.watcher is not None:
        session.watcher.join(5)
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # Not sys.exit: tearing down the interpreter destroys the store (which rank 0 may serve)
    # under its own threads, and the C++ runtime aborts ("terminate called without an active
    # exception", exit -6) instead of exiting with the command's code.
    session.real_exit(code)
