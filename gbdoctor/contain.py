"""User code run in the gbdoctor process itself is contained like a spawned rank (issue 32).

A world-size-1 job runs the model in this process (``setup.dist.single_process_group``), and
its forward, hooks and factory can do anything: sleep forever, start a non-daemon thread, fork.
Spawned ranks are bounded by their job's deadline and die with their parent; this module gives
the in-process job the same bounds, without the cost of a process of its own:

- :func:`time_limited`: the job's ``[gbdoctor] timeout_s``. At the deadline SIGALRM raises the
  job's error in the main thread (it unwinds like any failure); if the job still has not ended
  :data:`GRACE_S` later (stuck in native code, or user code swallowed the error), a watchdog
  thread prints the error and ends the process with its exit code.
- :func:`adopt_orphans`: this process becomes the child subreaper, so a process that user code
  forks (here or in a rank) and that outlives its parent is re-parented to gbdoctor instead of
  init, where :func:`end_descendants` finds it.
- :func:`end_process`: the command's last act. Every descendant is killed (but the
  multiprocessing resource tracker, which unlinks what killed ranks left in /dev/shm and exits
  by itself), and the process ends with ``os._exit``: a stray non-daemon thread cannot hold the
  exit (``threading``'s shutdown joins them), and no C++ destructor runs under a live thread
  (torch's store and compile pool aborted with "terminate called without an active exception").

No torch import here: ``diff`` and ``causes`` end through :func:`end_process` too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

from gbdoctor.errors import GbdoctorError

GRACE_S = 10.0
"""After the deadline, how long the job may take to unwind before the process ends without it."""

ATEXIT_S = 30.0
"""How long the atexit handlers may take once a command is done."""

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_real_exit = os._exit  # the user-code guard replaces os._exit while commands run


def adopt_orphans() -> None:
    """Make this process the subreaper of its descendants (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            out[int(entry)] = int(stat.rpartition(b")")[2].split()[1])
    return out


def descendants(pid: int | None = None) -> set[int]:
    """Every process below ``pid`` (this process by default); empty where /proc is missing."""
    root = os.getpid() if pid is None else pid
    if not os.path.isdir("/proc"):
        return set()
    parents = _parents()
    found: set[int] = set()
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for child, of in parents.items():
            if of == parent and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def _resource_tracker_pid() -> int | None:
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    return getattr(getattr(tracker, "_resource_tracker", None), "_pid", None)


def end_descendants() -> None:
    """SIGKILL every descendant of this process but the resource tracker, and reap them.
    Repeated: a process killed here may leave children that are re-parented to this one."""
    keep = {_resource_tracker_pid()}
    for _ in range(3):
        found = descendants() - keep
        if not found:
            return
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in found:
            with contextlib.suppress(OSError):  # not our child (a grandchild): its parent reaps
                os.waitpid(pid, 0)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe (``| head``) or a closed stream
            stream.flush()


def end_now(code: int) -> NoReturn:
    """End this process with ``code`` at once: every descendant killed, streams flushed, no
    atexit handlers (a signal ends the command)."""
    end_descendants()
    _flush()
    _real_exit(code)


def end_process(code: int, on_signal: Callable[[int], int]) -> NoReturn:
    """End this process with ``code`` after the command finished: a signal arriving now is
    handed to ``on_signal`` (which says what happened and returns the exit code) and ends the
    process at once; the atexit handlers run (logging, multiprocessing's finalizers, torch's
    compile pool); every descendant is killed; ``os._exit``."""

    def at_once(signum: int, frame: object) -> None:
        end_descendants()
        end_now(on_signal(signum))

    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, at_once)
    import atexit

    # Bounded: multiprocessing's handler joins the non-daemon processes user code started.
    stuck = threading.Timer(ATEXIT_S, end_now, (code,))
    stuck.daemon = True
    stuck.start()
    atexit._run_exitfuncs()
    end_now(code)


@contextlib.contextmanager
def time_limited(timeout_s: float, error: Callable[[], GbdoctorError]) -> Iterator[None]:
    """Run the body for at most ``timeout_s`` seconds (see the module docstring); ``error``
    makes the exception the deadline raises."""
    done = threading.Event()

    def watchdog() -> None:
        if done.wait(timeout_s + GRACE_S):
            return
        err = error()
        lines = [f"Error: {err.message}", *([f"Hint: {err.hint}"] if err.hint else [])]
        with contextlib.suppress(OSError):  # the CLI's own format: one line each, unwrapped
            os.write(2, "".join(line + "\n" for line in lines).encode())
        end_now(int(err.exit_code))

    def on_alarm(signum: int, frame: object) -> None:
        raise error()

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, on_alarm) if in_main else None
    if in_main:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    threading.Thread(target=watchdog, name="gbdoctor-job-deadline", daemon=True).start()
    try:
        yield
    finally:
        done.set()
        if in_main:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
