"""The one JSON reader/writer for records. Byte-stable output: sorted keys, no timestamps,
fixed indentation, a trailing newline.

Reading checks, in order: the text parses, it is an object, its ``schema_version`` is the one
this gbdoctor reads (:func:`check_schema_version`), no key is unknown or missing
(:func:`from_dict`), and every leaf has its annotated type (:func:`check_types`). Every failure
is one :class:`~gbdoctor.errors.BaselineError` line naming the file and the JSON path.

Writing: :func:`check_writable` runs before a scan, so an output that cannot be written is bad
input (exit 2) found in a second, not after a scan whose result would then be lost.
:func:`write_atomic` writes a temporary file in the same directory, fsyncs it and renames it over
the target: a reader (or a later gate) sees the old file or the new one, never a truncated one,
even when the write fails part-way (disk full, file-size limit, kill -9). :func:`locked`
serialises read-merge-write updates of one file (``gate --update-baseline`` from two jobs at
once keeps both entries); it locks the directory, not a lock file, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import glob
import json
import math
import os
import stat
import tempfile
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from gbdoctor.errors import BaselineError, ExitCode, GbdoctorError, exception_line

T = TypeVar("T")


def to_jsonable(obj: Any) -> Any:
    """Dataclass records (nested) to dicts/lists of plain values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


def dumps(obj: Any) -> str:
    """Stable JSON text of a record or plain value (trailing newline included)."""
    return json.dumps(to_jsonable(obj), sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def _build(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _build(members[0], value, where)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list):
            raise BaselineError(f"{where}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        return tuple(_build(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise BaselineError(
                f"{where}: {value!r} is not one of {[m.value for m in tp]}"
            ) from None
    return value


def from_dict(cls: type[T], data: Any, where: str = "$") -> T:
    """Rebuild a record from ``to_jsonable`` output; unknown or missing keys are BaselineErrors."""
    if not isinstance(data, dict):
        raise BaselineError(
            f"{where}: expected an object for {cls.__name__}, got {type(data).__name__}"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(typing.cast("type[Any]", cls))}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise BaselineError(f"{where}: unknown key(s) {unknown} for {cls.__name__}")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _build(hints[name], data[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise BaselineError(f"{where}: missing key '{name}' for {cls.__name__}")
    return cls(**kwargs)


def check_types(tp: Any, value: Any, where: str = "$", *, counts: bool = False) -> None:
    """Type check of a rebuilt record against its annotations (from_dict does not check leaves).

    ``counts``: every int of the record is a count, size, line or version and every float a
    share or measurement, so a negative int or a NaN/infinite float is impossible and refused
    (scan and plan files; run reports keep non-finite losses, which they flag)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        return check_types(members[0], value, where, counts=counts)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            for i, item in enumerate(value):
                check_types(args[0], item, f"{where}[{i}]", counts=counts)
            return
        if len(value) != len(args):
            raise BaselineError(f"{where}: expected {len(args)} items, got {len(value)}")
        for i, (arg, item) in enumerate(zip(args, value, strict=True)):
            check_types(arg, item, f"{where}[{i}]", counts=counts)
        return
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            check_types(hints[f.name], getattr(value, f.name), f"{where}.{f.name}", counts=counts)
        return
    expected = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}.get(tp)
    if expected is None:
        return
    if not isinstance(value, expected) or (tp is not bool and isinstance(value, bool)):
        raise BaselineError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
    if counts and tp is int and isinstance(value, int) and value < 0:
        raise BaselineError(f"{where}: {value} is negative (impossible here)")
    if tp is int and isinstance(value, int) and abs(value) > MAX_INT:
        raise BaselineError(f"{where}: {value} is out of range (at most {MAX_INT})")
    if counts and tp is float and isinstance(value, int | float) and not math.isfinite(value):
        raise BaselineError(f"{where}: {value} is not a finite number")


MAX_INT = 2**63 - 1
"""The largest integer a record holds (a count, size or line); JSON may spell any integer."""

MAX_READ_BYTES = 256 * 2**20
"""The largest file gbdoctor reads as input (a spec, scan, plan or baseline; a 48-layer scan is
well under 1 MiB): a larger one, or ``/dev/zero``, is refused before it is read, not read until
memory runs out (docs/security.md)."""


def read_regular_file(
    path: str | Path,
    what: str,
    hint: str,
    *,
    error: type[GbdoctorError] = BaselineError,
) -> bytes:
    """The bytes of the regular file ``path``, at most :data:`MAX_READ_BYTES`; one-line
    ``error`` (exit 2) when it is missing (with ``hint``), unreadable, a directory, not a
    regular file (a FIFO would block, ``/dev/zero`` never ends) or larger than the limit."""
    path = Path(path)
    try:
        # Opened without blocking (a FIFO with no writer would block the open itself), then
        # checked through the descriptor: what is read is what was checked.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise error(f"{path}: is a directory, not a {what} file", hint=hint)
            if not stat.S_ISREG(info.st_mode):
                raise error(
                    f"{path}: not a regular file (a device, FIFO or socket), not a {what} file",
                    hint=hint,
                )
            if info.st_size > MAX_READ_BYTES:
                raise error(
                    f"{path}: {info.st_size} bytes, larger than the "
                    f"{MAX_READ_BYTES // 2**20} MiB a {what} file may have",
                    hint=hint,
                )
            os.set_blocking(fd, True)
            return handle.read(MAX_READ_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file (not found)", hint=hint) from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a {what} file", hint=hint) from None
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc})") from None


def read_text(path: str | Path, what: str, hint: str) -> str:
    """A JSON file's text (:func:`read_regular_file`, decoded); BaselineError when it is not
    UTF-8 text."""
    try:
        return read_regular_file(path, what, hint).decode("utf-8")
    except UnicodeDecodeError:
        raise BaselineError(
            f"{path}: not a {what} file (binary data, not UTF-8 text)", hint=hint
        ) from None


def parse_json_object(text: str, name: str, hint: str | None = None) -> dict[str, Any]:
    """``text`` as a JSON object; BaselineError for malformed JSON or another JSON value."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"{name}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", hint=hint
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits (int_max_str_digits)
        raise BaselineError(f"{name}: not valid JSON ({exception_line(exc)})", hint=hint) from None
    except RecursionError:
        raise BaselineError(f"{name}: JSON nested too deeply to read", hint=hint) from None
    if not isinstance(data, dict):
        raise BaselineError(f"{name}: expected a JSON object, got {type(data).__name__}", hint=hint)
    return data


def check_schema_version(
    data: dict[str, Any], expected: int | tuple[int, ...], name: str, what: str, hint: str
) -> None:
    """BaselineError unless ``data["schema_version"]`` is ``expected`` (or one of them);
    ``what`` names the document."""
    version = data.get("schema_version")
    if version is None:
        raise BaselineError(
            f"{name}: missing key 'schema_version' (not a gbdoctor {what}?)", hint=hint
        )
    accepted = expected if isinstance(expected, tuple) else (expected,)
    # ``True == 1`` in Python: a boolean is not a version, however it compares
    if isinstance(version, bool) or version not in accepted:
        readable = ", ".join(map(str, accepted))
        raise BaselineError(
            f"{name}: {what} schema_version {version!r}, this gbdoctor reads {readable}", hint=hint
        )


def load_record(
    cls: type[T],
    data: dict[str, Any],
    name: str,
    ignore: tuple[str, ...] = (),
    *,
    counts: bool = False,
) -> T:
    """A record of type ``cls`` from a parsed JSON object (keys in ``ignore`` are derived and
    dropped); every problem is a BaselineError prefixed with ``name``. ``counts``: refuse
    impossible values too (see :func:`check_types`)."""
    data = {k: v for k, v in data.items() if k not in ignore}
    try:
        rec = from_dict(cls, data, "$")
        check_types(cls, rec, "$", counts=counts)
    except BaselineError as exc:
        raise BaselineError(f"{name}: {exc.message}", hint=exc.hint) from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise BaselineError(f"{name}: malformed {cls.__name__} ({exc})") from None
    return rec


# --------------------------------------------------------------------------- writing


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
