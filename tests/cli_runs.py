"""The CLI as the console script runs it, without paying a fresh interpreter for each call.

A ``python -m gbdoctor`` subprocess pays the torch import (2 to 3 s quiet, tens of seconds
loaded) before the command does anything; a test that only checks an exit code and a line of
stderr does not need that. Two ways to run ``gbdoctor.cli.main`` (the console script's entry
point) with the same argv, environment and working directory:

- :func:`in_process`: in the test's own process. The process-level parts of ``main`` are left
  out (they would act on pytest itself: the signal handlers, becoming the subreaper of its
  descendants, ``os._exit`` at the end); everything between them runs as written. What a
  command can leave behind is restored afterwards: the environment, Dynamo's and inductor's
  configs and compiled frames (``capture.job_state``, what a reused rank does between jobs), the
  working directory, ``sys.path``/``sys.argv``, signal handlers, logging handlers and levels,
  warning filters and the CLI's own per-run flags.
- :func:`in_child`: a real process forked from a server that imported the CLI and Dynamo once
  (``multiprocessing``'s forkserver), for what needs a process of its own (several commands at
  once against one lock, a resource limit) but not a fresh interpreter. ``main`` runs whole and
  ends the process with its exit code.

What needs a fresh interpreter stays a plain subprocess in its test: a read of
``/proc/self/environ`` (it shows the environment the process started with, not
``os.environ``), an input that must not hang (a subprocess has a timeout; the test process
would hang), signals, and the interpreter's own start and exit.
"""

from __future__ import annotations

import contextlib
import io
import logging
import multiprocessing
import os
import signal
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from unittest import mock


@dataclass(frozen=True)
class Done:
    """What a test reads of a finished command (the fields of ``subprocess.CompletedProcess``)."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class _Ended(BaseException):
    """``main`` reached its end (``contain.end_process``): the exit status, instead of
    ``os._exit``. A BaseException so that no ``except Exception`` of the command swallows it."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _end_process(code: int, on_signal: object) -> None:
    raise _Ended(code)


def _logging_state() -> dict[str, tuple[list[logging.Handler], int, bool, bool]]:
    loggers = [logging.getLogger()] + [
        logger
        for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]
    return {
        logger.name: (list(logger.handlers), logger.level, logger.propagate, logger.disabled)
        for logger in loggers
    }


def _restore_logging(saved: dict[str, tuple[list[logging.Handler], int, bool, bool]]) -> None:
    now = _logging_state()
    for name, state in saved.items():
        if now.get(name) == state:
            continue  # setLevel clears every logger's cache: only where something changed
        handlers, level, propagate, disabled = state
        logger = logging.getLogger(name) if name != "root" else logging.getLogger()
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate, logger.disabled = propagate, disabled


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)


def interruptible() -> None:
    """A subprocess's ``preexec_fn`` for tests that send it SIGINT: SIGINT back to its default,
    whatever the test run inherited. A shell without job control starts background commands
    (``pytest ... &``) with SIGINT ignored, children inherit that, and a process started that
    way rightly ignores Ctrl-C (the signal tests then timed out in such runs, and only there)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def in_process(*args: str, cwd: Path | str, **env: str) -> Done:
    """Run ``gbdoctor ARGS`` in this process from ``cwd`` with ``env`` added to the environment;
    its exit status and what it wrote to stdout and stderr."""
    from gbdoctor.capture.job_state import job_start_state, restore_job_start_state
    from gbdoctor.cli import exits, root

    start = job_start_state()  # the environment and both compiler configs
    saved_cwd, saved_path, saved_argv = os.getcwd(), list(sys.path), list(sys.argv)
    saved_signals = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    saved_hooks = (sys.unraisablehook, sys.excepthook)
    saved_logging = _logging_state()
    saved_warnings = list(warnings.filters)
    saved_flags = (list(exits.app_debug), dict(exits._SIGTERM))
    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    try:
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = ["gbdoctor", *args]  # click names the program after it, as the console script
        with (
            mock.patch.object(root, "install_signal_handlers", lambda: None),
            mock.patch.object(root, "adopt_orphans", lambda: None),
            mock.patch.object(root, "end_process", _end_process),
            # click names the program after argv[0] unless __main__ is a package's (pytest's
            # is): the console script's __main__ is a plain script.
            mock.patch.object(sys.modules["__main__"], "__package__", None),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                root.main(list(args))
            except _Ended as ended:
                code = ended.code
    finally:
        os.chdir(saved_cwd)
        sys.path[:], sys.argv[:] = saved_path, saved_argv
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
        signal.alarm(0)
        sys.unraisablehook, sys.excepthook = saved_hooks
        _restore_logging(saved_logging)
        warnings.filters[:] = saved_warnings
        exits.app_debug[:] = saved_flags[0]
        exits._SIGTERM.clear()
        exits._SIGTERM.update(saved_flags[1])
        # The environment, both configs, Dynamo's compiled frames and counters, as between two
        # jobs on a reused rank. Without its whole-heap collection (a second with torch loaded):
        # that frees a rank's previous model before the next; here the collector does it later.
        with mock.patch("gc.collect", lambda generation=2: 0):
            restore_job_start_state(start)
    assert code is not None, "main returned without ending the process"
    return Done(tuple(args), code, out.getvalue(), err.getvalue())


# --------------------------------------------------------------------------- forked children

_PRELOAD = ["gbdoctor.cli", "torch._dynamo"]


def _context() -> multiprocessing.context.ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    # Only honoured before the session's forkserver starts; later calls change nothing.
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def scan_key(spec: object, options: dict, framework: object) -> str:
    """What makes two scans the same scan: the loaded spec (its file's content, overrides and
    path), every option ``scan`` is given (strategy, decision, recompile probe, shapes, ...)
    but its progress callback, the framework, the working directory and the environment (the
    recompile probe's default, the memory pin, Dynamo's and torch's settings; pytest's
    per-test variable left out)."""
    import hashlib
    import pickle

    env = sorted((k, v) for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST")
    name = getattr(framework, "name", None)
    what = (spec, sorted(options.items()), name, os.getcwd(), env)
    return hashlib.sha256(pickle.dumps(what)).hexdigest()


def _share_scans(folder: str) -> None:
    """In this child, ``gbdoctor.scan.scan`` answers a scan that another child of the session
    already made with the same :func:`scan_key` from its saved report (a pickle of the frozen
    record: the very object, not a JSON reading), and saves every report it makes. For commands
    that show one scan in several formats (the docs' excerpts): the scan runs once, and each
    command still parses its own argv, loads its spec, renders and prints."""
    import pickle

    import gbdoctor.scan as scan_package

    real_scan = scan_package.scan

    def scan(spec, *, progress=None, framework=None, **options):
        saved = Path(folder) / f"{scan_key(spec, options, framework)}.pickle"
        if saved.exists():
            return pickle.loads(saved.read_bytes())
        report = real_scan(spec, progress=progress, framework=framework, **options)
        partial = saved.with_suffix(f".{os.getpid()}")
        partial.write_bytes(pickle.dumps(report))
        partial.replace(saved)  # whole or absent, for a child running beside this one
        return report

    scan_package.scan = scan


def _child_main(
    args: tuple[str, ...], cwd: str, env: dict[str, str], out: object, err: object,
    fsize: int | None, scans: str | None,
) -> None:  # fmt: skip
    # Pipes, as a subprocess's captured streams are: a file-size limit does not apply to them.
    for fd, pipe in ((1, out), (2, err)):
        os.dup2(pipe.fileno(), fd)  # type: ignore[attr-defined]
        pipe.close()  # type: ignore[attr-defined]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["gbdoctor", *args]  # click names the program after it, as the console script
    if fsize is not None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    if scans is not None:
        _share_scans(scans)
    from gbdoctor.cli import main

    main(list(args))  # ends this process with the command's exit status


def _drain(fd: int, into: list[bytes]) -> None:
    with open(fd, "rb", closefd=True) as stream:
        into.append(stream.read())


class Child:
    """One ``gbdoctor ARGS`` in a forked process; :meth:`wait` gives its :class:`Done`.
    ``shared_scans``: a folder where the children given it share their scans
    (:func:`_share_scans`)."""

    def __init__(
        self, *args: str, cwd: Path | str, env: dict[str, str] | None = None,
        file_size_limit: int | None = None, shared_scans: Path | None = None,
    ) -> None:  # fmt: skip
        ctx = _context()
        self.args = args
        (out_r, out_w), (err_r, err_w) = ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_child_main,
            args=(
                args,
                str(cwd),
                {**os.environ, **(env or {})},
                out_w,
                err_w,
                file_size_limit,
                None if shared_scans is None else str(shared_scans),
            ),  # fmt: skip
        )
        self._process.start()
        out_w.close()
        err_w.close()
        self._streams: tuple[list[bytes], list[bytes]] = ([], [])
        self._readers = []
        for conn, into in zip((out_r, err_r), self._streams):
            fd = os.dup(conn.fileno())
            conn.close()
            self._readers.append(threading.Thread(target=_drain, args=(fd, into), daemon=True))
        for reader in self._readers:
            reader.start()

    def wait(self, timeout: float = 300) -> Done:
        self._process.join(timeout)
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join()
            raise AssertionError(f"gbdoctor {' '.join(self.args)}: still running after {timeout} s")
        for reader in self._readers:
            reader.join(60)
        out, err = (b"".join(chunks).decode(errors="replace") for chunks in self._streams)
        return Done(self.args, self._process.exitcode, out, err)


def in_child(*args: str, cwd: Path | str, file_size_limit: int | None = None, **env: str) -> Done:
    """:class:`Child` started and waited for."""
    return Child(*args, cwd=cwd, env=env, file_size_limit=file_size_limit).wait()
