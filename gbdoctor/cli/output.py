"""Where a command's output goes: the report to stdout or ``--output FILE``, everything else
(notices, progress, one-line errors) to stderr, so that stdout holds only the report."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gbdoctor.records.enums import OutputFormat

if TYPE_CHECKING:
    from gbdoctor.records import Spec
    from gbdoctor.report.formats import Printout

err_console = Console(stderr=True)


def say(line: str) -> None:
    """One line on stderr, never wrapped (rich wraps at 80 columns when stderr is a pipe)."""
    sys.stderr.write(line.replace("\n", " ") + "\n")
    sys.stderr.flush()


def print_err(text: str) -> None:
    """``text`` on stderr as written: no rich markup or highlighting, no wrapping."""
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)


def emit(text: str, output: Path | None) -> None:
    """The report: to stdout, or atomically to ``output`` (with a ``wrote FILE`` line)."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        from gbdoctor.records.atomic_write import write_atomic

        write_atomic(output, text)
        print_err(f"wrote {output}")


def table_width(output: Path | None) -> int | None:
    """The terminal's columns for a table printed to it; None (the report's fixed width) for a
    file, so that a file reads the same on every machine."""
    if output is not None:
        return None
    from gbdoctor.report.table import terminal_width

    return terminal_width()


def notice(notes: Iterable[str], output: Path | None, format: str) -> None:
    """An automatic simulation's notice, also on stderr when the report does not go to the
    terminal as a table (whose header carries it)."""
    if output is not None or format != OutputFormat.TABLE:
        for note in notes:
            if note.startswith("notice:"):
                print_err(note)


def preflight(
    format: str | None,
    printout: Printout,
    *outputs: Path | None,
    inputs: Iterable[Path | str | None] = (),
) -> None:
    """Check the options that need no model before any work: the format name (one of those
    ``report.formats`` has for the command's ``printout``) and every output location (a bad
    one is exit 2 in a second, instead of a lost scan). ``inputs``: the files the command
    reads; an output that is one of them would destroy it (``scan s.toml -o s.toml``), so it
    is refused here."""
    from gbdoctor.records.atomic_write import check_writable
    from gbdoctor.report.formats import check_format

    if format is not None:
        check_format(printout, format, named="--format")
    read = tuple(Path(path) for path in inputs if path is not None)
    written = [path for path in outputs if path is not None]
    for i, path in enumerate(written):
        in_place = check_writable(path, inputs=read)
        # Two outputs onto one file (``timeline -o a.json --plot a.json``): the second would
        # silently replace the first. A device or FIFO (/dev/null, /dev/stdout) takes both.
        twin = next((other for other in written[:i] if _same_file(path, other)), None)
        if twin is not None and not in_place:
            from gbdoctor.records.atomic_write import OutputError

            raise OutputError(
                f"output {path} is also another output of this command ({twin}); the second "
                "write would replace the first",
                hint="give each output its own file",
            )


def _same_file(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def spare_model_code(spec: Spec, *outputs: Path | None) -> None:
    """Refuse an output that is part of the code ``spec`` imports (its factory's module, the
    package around it, the siblings a factory file may import): ``scan s.toml -o
    models/model.py`` replaced the model's source with the report (issue 45). Run right after the
    spec loads, before any model is built."""
    from gbdoctor.cli.inputs import model_code
    from gbdoctor.records.atomic_write import OutputError

    code = model_code(spec)
    for path in outputs:
        if path is None or not path.exists():
            continue  # a new file destroys nothing
        where = Path(os.path.realpath(path))
        for item in code:
            if where == item.path or (item.tree and item.holds(where)):
                raise OutputError(
                    f"output {path} is part of the model code the spec imports "
                    f"({spec.model.factory}); writing it would destroy that code",
                    hint="write the output to another file",
                )


PLAIN_PROGRESS_EVERY_S = 5.0
"""In a log (stderr a file or pipe), the least time between two progress lines."""


def _stderr_is_a_log() -> bool:
    """stderr is a file or pipe (a CI log, ``2> file``), not a terminal: a live bar draws
    nothing there. An in-memory stream (a test runner's) has no descriptor and is neither."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return not sys.stderr.isatty()


class ProgressBar:
    """A rich progress bar on stderr driven by the library's ``Progress`` callback
    (message, done, total).

    While it is shown, Python-level prints (a model's own ``print`` calls, which scans run) go
    to stderr, so that stdout holds only the report (``--format json`` stays parseable).

    Where stderr is a log instead of a terminal, it writes a plain ``[elapsed] message`` line
    when the message changes, at most one per ``PLAIN_PROGRESS_EVERY_S`` (the first always),
    so that a CI log shows a long price or run progressing instead of minutes of silence.
    """

    def __init__(self) -> None:
        self._plain = _stderr_is_a_log()
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
            disable=self._plain,
        )
        self._task: TaskID | None = None
        self._started = time.monotonic()
        self._last_line: tuple[float, str] | None = None

    def __enter__(self) -> ProgressBar:
        self._redirect = contextlib.redirect_stdout(sys.stderr)
        self._redirect.__enter__()
        self._progress.__enter__()
        self._task = self._progress.add_task("starting", total=1)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)
        self._redirect.__exit__(*exc)

    def __call__(self, message: str, done: int, total: int) -> None:
        assert self._task is not None, "ProgressBar is called inside its with-block only"
        self._progress.update(self._task, description=message, completed=done, total=max(total, 1))
        if self._plain:
            self._log_line(message)

    def _log_line(self, message: str) -> None:
        now = time.monotonic()
        if self._last_line is not None:
            at, said = self._last_line
            if message == said or now - at < PLAIN_PROGRESS_EVERY_S:
                return
        self._last_line = (now, message)
        say(f"[{now - self._started:6.1f} s] {message}")
