"""Writing an output file safely (scan, plan, baseline, report): the other half of
``records.io``, which reads them.

:func:`check_writable` runs before a scan, so an output that cannot be written is bad input
(exit 2) found in a second, not after a scan whose result would then be lost.
:func:`write_atomic` writes a temporary file in the same directory, fsyncs it and renames it over
the target: a reader (or a later gate) sees the old file or the new one, never a truncated one,
even when the write fails part-way (disk full, file-size limit, kill -9). :func:`locked`
serialises read-merge-write updates of one file (``gate --update-baseline`` from two jobs at
once keeps both entries); it locks the directory, not a lock file, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gbdoctor.errors import ExitCode, GbdoctorError


class OutputError(GbdoctorError):
    """An output path that cannot be written (a directory, no permission, a file as parent)."""

    exit_code = ExitCode.BAD_INPUT


class WriteError(GbdoctorError):
    """Writing failed part-way (disk full, file-size limit, I/O error); the old file is kept."""

    exit_code = ExitCode.ENVIRONMENT


def _nearest_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return Path(".")


def _special_file(path: Path) -> os.stat_result | None:
    """The stat of what ``path`` names when that is not a regular file to replace: a device,
    a FIFO, a socket, or anything reached through ``/dev`` or ``/proc`` (``/dev/stdout`` is a
    link to the process's own descriptor). None for a regular file or a new path."""
    try:
        st = path.stat()  # follows links
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return st
    absolute = os.path.abspath(path)
    if absolute.startswith(_IN_PLACE_ROOTS) or os.path.realpath(path).startswith(_IN_PLACE_ROOTS):
        return st
    return None


_IN_PLACE_ROOTS = ("/dev/", "/proc/")
"""Paths written in place, never renamed over: renaming onto ``/dev/null`` (as root) would
replace the device node with a regular file for every process on the machine."""


def check_writable(
    path: str | os.PathLike[str], what: str = "output", *, inputs: tuple[Path, ...] = ()
) -> bool:
    """:class:`OutputError` unless ``path`` can be created or replaced, or written in place (a
    character device or a FIFO). ``inputs``: files the command reads; writing one of them would
    destroy it, so an output that is one of them is refused. Creates nothing. Returns whether
    the output is written in place (never renamed over)."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a directory", hint="give a file path")
    for source in inputs:
        if _same_file(path, source):
            raise OutputError(
                f"{what} {path} is also an input of this command ({source}); writing it would "
                "destroy the input",
                hint="write the output to another file",
            )
    special = _special_file(path)
    if special is not None:
        if stat.S_ISCHR(special.st_mode) or stat.S_ISFIFO(special.st_mode):
            if not os.access(path, os.W_OK):
                raise OutputError(f"{what} {path}: no permission to write it")
            return True
        if stat.S_ISREG(special.st_mode):
            return True  # a regular file reached through /dev or /proc (/dev/stdout > file)
        raise OutputError(
            f"{what} {path} is a {_kind(special)}, not a file",
            hint="give a regular file path (or /dev/stdout)",
        )
    existing = _nearest_existing(path.parent)
    if not existing.is_dir():
        raise OutputError(
            f"{what} {path}: {existing} is not a directory",
            hint="give a path whose parent is a directory",
        )
    # Replacing a file needs write access to its directory (rename), not to the file itself.
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(
            f"{what} {path}: no permission to write in {existing}",
            hint="choose a writable location (or fix the directory's permissions)",
        )
    return False


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _kind(st: os.stat_result) -> str:
    if stat.S_ISSOCK(st.st_mode):
        return "socket"
    if stat.S_ISBLK(st.st_mode):
        return "block device"
    return "special file"


def _new_file_mode(target: Path) -> int:
    """The target's current mode, or the umask's default for a new file (mkstemp uses 0600)."""
    try:
        return target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(
    path: str | os.PathLike[str],
    text: str,
    what: str = "output",
    *,
    inputs: tuple[Path, ...] = (),
) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically; create missing parent directories.

    A symlink is written through (its target is replaced, the link stays); a character device
    or a FIFO (``/dev/null``, ``/dev/stdout``, a pipe) is written in place, never renamed over.
    On any failure the previous file is untouched and the temporary file is removed:
    :class:`OutputError` (exit 2) when the location is not writable or is an input,
    :class:`WriteError` (exit 3) when writing failed part-way."""
    in_place = check_writable(path, what, inputs=inputs)
    data = text.encode("utf-8")
    if in_place:
        _write_in_place(Path(path), data, what)
        return
    target = Path(os.path.realpath(path))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"{what} {target}: cannot create {target.parent} ({exc.strerror or exc})"
        ) from None
    _remove_orphaned_temporaries(target)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent
    )
    try:
        try:
            _write_all(fd, data)
            if hasattr(os, "fchmod"):
                os.fchmod(fd, _new_file_mode(target))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _write_failure(exc, what, target, "; the previous file is unchanged") from None
        raise
    _fsync_dir(target.parent)


def _remove_orphaned_temporaries(target: Path) -> None:
    """Remove temporary files of earlier writes to ``target`` whose writer is gone (killed
    between creating and renaming it). The writer's pid is in the name, so a temporary file of
    a write in progress (another gbdoctor, same target) is never touched."""
    prefix = f".{target.name}."
    for candidate in target.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        pid = candidate.name[len(prefix) :].split(".", 1)[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            with contextlib.suppress(OSError):
                candidate.unlink()


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_in_place(path: Path, data: bytes, what: str) -> None:
    """Write to a device or FIFO through its own node. A FIFO is opened without blocking, so
    one that no process reads is an error instead of a hang."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OutputError(
                f"{what} {path}: no process is reading this FIFO",
                hint="start the reader first, or write to a regular file",
            ) from None
        raise _write_failure(exc, what, path, "") from None
    try:
        os.set_blocking(fd, True)
        _write_all(fd, data)
    except OSError as exc:
        raise _write_failure(exc, what, path, "") from None
    finally:
        os.close(fd)


def _write_failure(exc: OSError, what: str, target: Path, kept: str) -> GbdoctorError:
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EISDIR, errno.EROFS):
        return OutputError(f"writing {what} {target} failed ({exc.strerror or exc}){kept}")
    hint = {
        errno.ENOSPC: "free disk space or choose another location",
        errno.EDQUOT: "free space within your disk quota or choose another location",
        errno.EFBIG: "the file-size limit (ulimit -f) is too small for the output; raise it or "
        "choose another location",
    }.get(exc.errno or 0, "choose another location")
    return WriteError(f"writing {what} {target} failed ({exc.strerror or exc}){kept}", hint=hint)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX); not possible on every platform or filesystem."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive lock for a read-merge-write of ``path`` (blocks until it is free).

    The lock is ``flock`` on the file's directory: the file itself is replaced by rename, so a
    lock on it would not survive the update, and a lock file would be left behind. Where flock
    is unavailable (Windows) the update is not serialised."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    directory = Path(path).parent
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
