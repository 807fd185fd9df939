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
import errno
import json
import math
import os
import tempfile
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from gbdoctor.errors import BaselineError, ExitCode, GbdoctorError

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
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _build(args[0], value, where)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list):
            raise BaselineError(f"{where}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        return tuple(_build(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    return value


def from_dict(cls: type[T], data: Any, where: str = "$") -> T:
    """Rebuild a record from ``to_jsonable`` output; unknown or missing keys are BaselineErrors."""
    if not isinstance(data, dict):
        raise BaselineError(
            f"{where}: expected an object for {cls.__name__}, got {type(data).__name__}"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
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
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return check_types(args[0], value, where, counts=counts)
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
    if counts and tp is int and value < 0:
        raise BaselineError(f"{where}: {value} is negative (impossible here)")
    if counts and tp is float and not math.isfinite(value):
        raise BaselineError(f"{where}: {value} is not a finite number")


def read_text(path: str | Path, what: str, hint: str) -> str:
    """A JSON file's text; one-line BaselineError when it is missing (with ``hint``) or unreadable."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"{path}: no such {what} file", hint=hint) from None
    except IsADirectoryError:
        raise BaselineError(f"{path}: is a directory, not a {what} file", hint=hint) from None
    except UnicodeDecodeError:
        raise BaselineError(
            f"{path}: not a {what} file (binary data, not UTF-8 text)", hint=hint
        ) from None
    except OSError as exc:
        raise BaselineError(
            f"{path}: cannot read {what} ({exc.__class__.__name__}: {exc})"
        ) from None


def parse_json_object(text: str, name: str, hint: str | None = None) -> dict[str, Any]:
    """``text`` as a JSON object; BaselineError for malformed JSON or another JSON value."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"{name}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", hint=hint
        ) from None
    except RecursionError:
        raise BaselineError(f"{name}: JSON nested too deeply to read", hint=hint) from None
    if not isinstance(data, dict):
        raise BaselineError(f"{name}: expected a JSON object, got {type(data).__name__}", hint=hint)
    return data


def check_schema_version(
    data: dict[str, Any], expected: int | tuple[int, ...], name: str, what: str, hint: str
) -> None:
    """BaselineError unless ``data["schema_version"]`` is ``expected`` (or one of them: readers
    that keep reading older documents pass every version they accept); ``what`` names the
    document."""
    readable = (expected,) if isinstance(expected, int) else expected
    version = data.get("schema_version")
    if version is None:
        raise BaselineError(
            f"{name}: missing key 'schema_version' (not a gbdoctor {what}?)", hint=hint
        )
    if version not in readable:
        raise BaselineError(
            f"{name}: {what} schema_version {version!r}, this gbdoctor reads "
            f"{', '.join(map(str, readable))}",
            hint=hint,
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


def check_writable(path: str | os.PathLike[str], what: str = "output") -> None:
    """:class:`OutputError` unless ``path`` can be created or replaced. Creates nothing."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a directory", hint="give a file path")
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


def _new_file_mode(target: Path) -> int:
    """The target's current mode, or the umask's default for a new file (mkstemp uses 0600)."""
    try:
        return target.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path: str | os.PathLike[str], text: str, what: str = "output") -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically; create missing parent directories.

    On any failure the previous file is untouched and the temporary file is removed:
    :class:`OutputError` (exit 2) when the location is not writable, :class:`WriteError`
    (exit 3) when writing failed part-way."""
    target = Path(path)
    check_writable(target, what)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"{what} {target}: cannot create {target.parent} ({exc.strerror or exc})"
        ) from None
    data = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
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
            kind = (
                OutputError
                if exc.errno in (errno.EACCES, errno.EPERM, errno.EISDIR, errno.EROFS)
                else WriteError
            )
            raise kind(
                f"writing {what} {target} failed ({exc.strerror or exc}); the previous file is unchanged",
                hint="free disk space or choose another location",
            ) from None
        raise
    _fsync_dir(target.parent)


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
