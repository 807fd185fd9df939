"""Model factories that misbehave on purpose, for the bad-input corpus and the fault tests.

``build(flavor)`` picks the misbehaviour from the flavor. ``<what>-rank<N>`` misbehaves on rank N
only (the others build the clean tiny model); ``<what>`` misbehaves everywhere. The fault tests
set ``GBDOCTOR_FAULT_DIR``: every rank then writes ``rank<N>.ready`` there once it is building,
so a test knows when to send its signal. The faults under test are the ranks': the main process
also builds the model once, on the meta device, for the memory estimate that decides between real
ranks and a simulation (``scan.estimate``); there it builds the clean tiny model.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "models"))
import tiny_custom

_held: list[object] = []


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _mark_ready() -> None:
    where = os.environ.get("GBDOCTOR_FAULT_DIR")
    if where:
        Path(where, f"rank{_rank()}.ready").write_text(str(os.getpid()))


def _fork_deaf_child() -> None:
    """A child that outlives the model's build and ignores SIGTERM, as the fork of a
    multi-threaded process that deadlocks does; it marks itself in ``GBDOCTOR_FORK_DIR``."""
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        where = os.environ.get("GBDOCTOR_FORK_DIR")
        if where:
            Path(where, f"forked.{os.getpid()}").write_text("")
        time.sleep(600)
        ctypes.CDLL(None)._exit(0)


def _sleep_through() -> None:
    while True:
        try:
            time.sleep(600)
        except BaseException:  # noqa: BLE001, S112 - swallowing the deadline on purpose
            continue


def _misbehave(what: str) -> object:
    if what == "sysexit0":
        sys.exit(0)
    if what == "exit-builtin":
        exit(0)  # noqa: PLR1722 - the site builtin on purpose
    if what == "osexit0":
        os._exit(0)
    if what == "osexit1":
        os._exit(1)
    if what == "native-exit0":  # the C library's _exit: no Python hook can intercept it
        ctypes.CDLL(None)._exit(0)
    if what == "sigkill":  # killed outright, as the out-of-memory killer does
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "sigstop":  # frozen: alive to the kernel and its launcher, silent to its peers
        os.kill(os.getpid(), signal.SIGSTOP)
    if what == "semaphore-sigkill":  # a named semaphore as tqdm's lock in torch.fx makes one
        _held.append(multiprocessing.RLock())
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "sleep":
        time.sleep(600)
    if what == "keyboard-interrupt":  # raised by the code itself, no signal involved
        raise KeyboardInterrupt
    if what == "raise":
        raise RuntimeError("the factory failed on purpose")
    if what == "none":
        return None
    if what == "no-layers":
        return nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 4))
    if what == "empty-layers":
        model = nn.Module()
        model.emb = nn.Embedding(8, 4)
        model.layers = nn.ModuleList()
        return model
    if what == "no-embedding":
        model = nn.Module()
        model.layers = nn.ModuleList([nn.Linear(4, 4)])
        return model
    if what in (
        "forward-sysexit",
        "forward-osexit0",
    ):  # the clean model, exiting in its first block
        model = tiny_custom.build("tiny")
        exit_fn = (lambda: sys.exit(0)) if what == "forward-sysexit" else (lambda: os._exit(0))
        model.layers[0].register_forward_pre_hook(lambda module, args: exit_fn())
        return model
    if what == "clean":
        return tiny_custom.build("tiny")
    if what == "forward-sleep":  # the clean model, hanging in its first block's forward
        model = tiny_custom.build("tiny")
        model.layers[0].register_forward_pre_hook(lambda module, args: time.sleep(600))
        return model
    if what == "forward-sleep-stubborn":  # ... and swallowing whatever interrupts it
        model = tiny_custom.build("tiny")
        model.layers[0].register_forward_pre_hook(lambda module, args: _sleep_through())
        return model
    if what == "mp-process":  # a non-daemon multiprocessing child that never ends
        multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,)).start()
        return tiny_custom.build("tiny")
    if what in ("thread", "fork", "fork-and-thread", "fork-and-forward-sleep"):
        if "thread" in what:  # a non-daemon thread that never ends
            threading.Thread(target=threading.Event().wait, name="user-thread").start()
        if "fork" in what:
            _fork_deaf_child()
        model = tiny_custom.build("tiny")
        if "sleep" in what:
            model.layers[0].register_forward_pre_hook(lambda module, args: time.sleep(600))
        return model
    if what == "recursion":
        return _misbehave(what)
    raise ValueError(f"unknown misbehaviour {what!r}")


def build(flavor: str) -> object:
    if os.environ.get("GBDOCTOR_FAULT_DIR") and "RANK" not in os.environ:
        return tiny_custom.build("tiny")  # the main process's meta build for the estimate
    _mark_ready()
    what, _, rank = flavor.partition("-rank")
    if rank and int(rank) != _rank():
        return tiny_custom.build("tiny")
    return _misbehave(what)


not_callable = 42
from os import system as reexported_system  # noqa: E402,F401 - a stdlib function, local name
