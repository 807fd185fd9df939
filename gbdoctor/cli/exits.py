"""How a command ends: library errors, signals and user code that exits become one line on
stderr and the documented exit code (``errors.ExitCode``); ``--debug`` (or ``GBDOCTOR_DEBUG=1``)
adds the traceback."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

import typer

from gbdoctor.cli.output import err_console, say
from gbdoctor.errors import DEBUG_ENV, ExitCode, GbdoctorError, exception_line

app_debug = [False]
"""The app's ``--debug``, set by the app callback each time the CLI runs (typer gives the
command no click context to read it from)."""


def debug_enabled() -> bool:
    """``gbdoctor --debug COMMAND`` (the app option) or ``GBDOCTOR_DEBUG=1``."""
    return app_debug[0] or os.environ.get(DEBUG_ENV) == "1"


@contextlib.contextmanager
def _debug_env(debug: bool) -> Iterator[None]:
    """``--debug`` as ``GBDOCTOR_DEBUG=1`` for the command's duration: spawned ranks inherit it
    (a block that does not trace prints its traceback to stderr)."""
    old = os.environ.get(DEBUG_ENV)
    if debug:
        os.environ[DEBUG_ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = old


@contextlib.contextmanager
def no_empty_cache_dirs() -> Iterator[None]:
    """Remove the empty ``torchinductor_<user>/`` trees that torch creates in the temporary
    directory on import or first compile and that this command left empty (issue 32): gbdoctor
    captures with Dynamo, and an inductor compile that wrote something keeps its cache. Only
    directories that did not exist before the command and hold no file are removed."""
    root = tempfile.gettempdir()

    def caches() -> set[str]:
        try:
            return {e for e in os.listdir(root) if e.startswith("torchinductor_")}
        except OSError:
            return set()

    before = caches()
    try:
        yield
    finally:
        for name in caches() - before:
            for path, _, _ in sorted(os.walk(os.path.join(root, name)), reverse=True):
                with contextlib.suppress(OSError):  # not empty, or not ours: kept
                    os.rmdir(path)


class Interrupted(KeyboardInterrupt):
    """SIGINT arrived (Ctrl-C). A subclass, so that code catching KeyboardInterrupt still
    unwinds on it; a plain KeyboardInterrupt is then one that user code raised itself."""


def on_sigint(signum: int, frame: FrameType | None) -> None:
    raise Interrupted()


def install_signal_handlers() -> None:
    """SIGTERM unwinds like Ctrl-C (children stopped, exit 143); SIGINT is told apart from a
    KeyboardInterrupt that user code raises. A SIGINT the parent ignored (a background job)
    stays ignored."""
    signal.signal(signal.SIGTERM, on_sigterm)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)
    previous = sys.unraisablehook

    def terminated_where_python_cannot_raise(unraisable: Any) -> None:
        # The handler ran inside a finalizer or callback (Python prints "Exception ignored in"
        # with a traceback and goes on): end here, as the unwinding would have.
        if isinstance(unraisable.exc_value, Terminated):
            from gbdoctor.contain import end_now

            end_now(signal_exit(signal.SIGTERM))
        previous(unraisable)

    sys.unraisablehook = terminated_where_python_cannot_raise


def _from_user_code(exc: KeyboardInterrupt) -> bool:
    """A KeyboardInterrupt no SIGINT raised: user code raised it. Knowable when SIGINT is
    ignored (started in the background: no Ctrl-C can arrive) or when
    :func:`install_signal_handlers` ran, as the console script does."""
    handler = signal.getsignal(signal.SIGINT)
    if handler is signal.SIG_IGN:
        return True
    return handler is on_sigint and not isinstance(exc, Interrupted)


class Terminated(BaseException):
    """SIGTERM arrived (CI cancel or timeout): unwound like Ctrl-C, so every child is stopped."""


SIGNAL_EXIT = {"interrupted": 130, "terminated": 143}
"""Exit status after Ctrl-C (SIGINT) and SIGTERM: 128 + the signal number, as a shell reports it."""


def signal_exit(signum: int) -> int:
    """Say that ``signum`` (SIGTERM or SIGINT) ended the command; its exit status."""
    if signum == signal.SIGINT:
        say("Interrupted.")
        return SIGNAL_EXIT["interrupted"]
    _SIGTERM["said"] = True
    say("Terminated.")
    return SIGNAL_EXIT["terminated"]


_SIGTERM: dict[str, bool] = {"seen": False, "said": False}
"""``seen``: :func:`on_sigterm` ran. The exception it raises can land where code swallows it (a
finalizer or callback whose exceptions Python only prints, an ``except BaseException`` in a
library while torch imports), and the command then ran on to exit 0 (measured: 2 of 6 runs of a
SIGTERM 0.5 s after start). ``said``: :func:`signal_exit` reported it."""


def sigterm_unreported() -> bool:
    """SIGTERM arrived but its exception was swallowed: the exit status must still say so."""
    return _SIGTERM["seen"] and not _SIGTERM["said"]


def _importing(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    _SIGTERM["seen"] = True
    if _importing(frame):
        # Raised inside an import, the exception can cross torch's C++ module init, and the
        # process aborts ("terminate called after throwing ... pybind11::error_already_set",
        # measured with a SIGTERM 0.5 s after `gbdoctor run` started): nothing to unwind yet.
        from gbdoctor.contain import end_now

        end_now(signal_exit(signal.SIGTERM))
    raise Terminated()


def _print_traceback(text: str) -> None:
    err_console.print(text, markup=False, highlight=False)


Command = TypeVar("Command", bound=Callable[..., Any])


def handle_errors(fn: Command) -> Command:
    """Map library errors to one line and an exit code (traceback only with --debug).

    User code run by the command (a custom model's factory, forward, hooks) that calls
    ``sys.exit`` or ``os._exit`` is an error too (exit 3): a scan must never pass by exiting."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gbdoctor.usercode import exits_guarded

        debug = debug_enabled()
        try:
            with _debug_env(debug), exits_guarded():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.BadParameter):
            raise
        except GbdoctorError as exc:
            if debug:
                _print_traceback(traceback.format_exc())
                remote = getattr(exc, "remote_traceback", None)
                if remote:
                    _print_traceback(remote)
            say(f"Error: {exc.message}")
            if exc.hint:
                say(f"Hint: {exc.hint}")
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt as exc:
            if _from_user_code(exc):
                from gbdoctor.usercode import raised_at

                say(f"Error: user code raised KeyboardInterrupt at {raised_at(exc)}")
                say("Hint: a model, its factory and its hooks must return or raise an Exception")
                raise typer.Exit(int(ExitCode.ENVIRONMENT)) from None
            raise typer.Exit(signal_exit(signal.SIGINT)) from None
        except Terminated:
            raise typer.Exit(signal_exit(signal.SIGTERM)) from None
        except RecursionError:
            if debug:
                _print_traceback(traceback.format_exc())
            say("Error: input nested too deeply to read")
            raise typer.Exit(int(ExitCode.BAD_INPUT)) from None
        except Exception as exc:  # noqa: BLE001 - last line of defence: no raw traceback
            if debug:
                _print_traceback(traceback.format_exc())
            say(f"Error: internal error: {exception_line(exc)}")
            say("Hint: rerun with `gbdoctor --debug ...` and report the traceback")
            raise typer.Exit(int(ExitCode.ENVIRONMENT)) from None

    return wrapper  # type: ignore[return-value]  # functools.wraps keeps the signature typer reads
