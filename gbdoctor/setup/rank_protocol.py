"""What a rank process and the process waiting for it agree on, whoever started the rank
(``setup.dist.run_ranks``'s spawned ranks, or a launcher's: ``setup.launched``): the group's
timeout and its loopback transport, the Dynamo settings a rank inherits, how a rank reports a
failure and how the waiting process turns it back into an error, and which failure came first.
"""

from __future__ import annotations

import importlib
import os
import re
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

from gbdoctor.errors import DeadlineError, GbdoctorError, SetupError

ProgressSink = Callable[[str, int, int], None]
"""(message, done, total): what a rank says it is doing, for the waiting process's progress."""

_progress_sink: ProgressSink | None = None


def set_rank_progress(sink: ProgressSink | None) -> None:
    """Where this rank's job reports its stages (its pipe to the parent); None: nowhere."""
    global _progress_sink
    _progress_sink = sink


def rank_progress() -> ProgressSink | None:
    """The current job's progress callback on this rank, or None (a launcher's rank, a test)."""
    return _progress_sink


def pg_timeout(timeout_s: float) -> float:
    """Collective/rendezvous timeout of the ranks: the job's limit, at least 30 s (gloo's own
    default), so a slow collective is reported by the job deadline, not as a gloo error."""
    return max(30.0, min(timeout_s, 7 * 24 * 3600.0))


def loopback_interface() -> str | None:
    """Name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS), for gloo's transport."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):
        return None
    return next((n for n in names if n in ("lo", "lo0")), None)


def apply_dynamo_pins() -> None:
    """Dynamo settings the parent pinned (``gate.pinned_dynamo``): spawned ranks start from
    torch's defaults, so the pins travel in the environment."""
    pins = os.environ.get("GBDOCTOR_DYNAMO_PINS")
    if pins:
        import json

        from gbdoctor.torch_compat import dynamo_config

        config = dynamo_config()
        for name, value in json.loads(pins).items():
            setattr(config, name, value)


def failure_message(rank: int | None, exc: BaseException) -> tuple[Any, ...]:
    """What a rank reports when its job raised (picklable; :func:`failure_error` reads it):
    ``gbdoctor`` (a GbdoctorError, re-raised with its class) or ``crash``, each with the wall
    time it happened at, so the first failure can be told from its echoes. ``rank`` None: the
    job's own failure (a timeout), not one rank's."""
    if isinstance(exc, GbdoctorError):
        return (
            "gbdoctor",
            rank,
            (type(exc).__module__, type(exc).__name__, exc.message, exc.hint),
            time.time(),
        )
    return ("crash", rank, f"{type(exc).__name__}: {exc}", traceback.format_exc(), time.time())


_LOST_PEER = re.compile(
    r"(?:Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited"
    r"|NCCL communicator was aborted)(?:(?!\. )[^;()\n])*"
)
"""How a collective fails on a rank whose peer died (gloo's TCP pair, NCCL's watchdog): an echo
of the peer's death, not a failure of this rank's work."""


def lost_peer(exc: BaseException) -> str | None:
    """The words saying a peer rank went away, when ``exc`` (or the error text it carries,
    e.g. a warm-up failure) says so; else None."""
    text = exc.message if isinstance(exc, GbdoctorError) else str(exc)
    found = _LOST_PEER.search(text)
    return found.group(0).strip() if found else None


def failure_error(message: tuple[Any, ...]) -> GbdoctorError:
    """The error the command raises for a rank's :func:`failure_message`."""
    rank = message[1]
    if message[0] == "gbdoctor":
        module, name, text, hint = message[2]
        cls = getattr(importlib.import_module(module), name, SetupError)
        if not (isinstance(cls, type) and issubclass(cls, GbdoctorError)):
            cls = SetupError
        return cls(text if rank is None else f"rank {rank}: {text}", hint)
    detail, tb = message[2], message[3]
    err = SetupError(
        f"rank {rank} failed: {detail}", hint="run `gbdoctor --debug ...` for the traceback"
    )
    err.remote_traceback = tb  # type: ignore[attr-defined]
    return err


def deadline_error(
    missing: list[int], timeout_s: float, stages: dict[int, str] | None = None
) -> DeadlineError:
    """The error of a job whose ranks ``missing`` had not finished at its deadline; ``stages``:
    where each rank said it was (``rank_main.report_stage``: the block it was capturing)."""
    where = "; ".join(f"rank {r} at {stages[r]}" for r in missing if stages and r in stages)
    return DeadlineError(
        f"rank(s) {missing} did not finish within {timeout_s:g} s"
        + (f" ({where})" if where else ""),
        hint="a rank hung or is very slow; raise --set gbdoctor.timeout_s=... or use "
        "`gbdoctor --debug ...`",
    )


FAILURE_GRACE_S = 3.0
"""After the first failure, how long to wait for the other ranks' reports before choosing which
failure came first (a rank that dies takes its peers' collectives down a moment later)."""
