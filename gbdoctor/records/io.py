"""The one JSON reader for records, and their byte-stable JSON text: sorted keys, no
timestamps, fixed indentation, a trailing newline.

Reading checks, in order: the file is a regular file within :data:`MAX_READ_BYTES`
(:func:`read_regular_file`), the text parses, it is an object, its ``schema_version`` is the one
this gbdoctor reads (:func:`check_schema_version`), no key is unknown or missing
(:func:`from_dict`), and every leaf has its annotated type (:func:`check_types`). Every failure
is one :class:`~gbdoctor.errors.BaselineError` line naming the file and the JSON path.
Writing a file is ``records.atomic_write``'s.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import stat
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from gbdoctor.errors import BaselineError, GbdoctorError, exception_line
from gbdoctor.records.bounds import MAX_INT, Range, shown_number

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
    if origin is typing.Annotated:
        base, *extras = typing.get_args(tp)
        check_types(base, value, where, counts=counts)
        for extra in extras:
            if isinstance(extra, Range) and (problem := extra.problem(value)) is not None:
                raise BaselineError(f"{where}: {problem}")
        return
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
        hints = typing.get_type_hints(tp, include_extras=True)
        for f in dataclasses.fields(tp):
            check_types(hints[f.name], getattr(value, f.name), f"{where}.{f.name}", counts=counts)
        return
    expected = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}.get(tp)
    if expected is None:
        return
    if not isinstance(value, expected) or (tp is not bool and isinstance(value, bool)):
        raise BaselineError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
    if tp is str and not _valid_unicode(value):
        # JSON's \ud800 escapes make lone surrogates, which no file or page can hold.
        raise BaselineError(f"{where}: not valid Unicode text (a lone surrogate escape)")
    if tp is float and isinstance(value, int) and abs(value) > MAX_INT:
        # An integer where a float belongs: past 2**63 it is no measurement (and past ~1e308
        # float() itself fails).
        raise BaselineError(f"{where}: {shown_number(value)} is out of range (at most {MAX_INT})")
    if counts and tp is int and isinstance(value, int) and value < 0:
        raise BaselineError(f"{where}: {value} is negative (impossible here)")
    if tp is int and isinstance(value, int) and abs(value) > MAX_INT:
        raise BaselineError(f"{where}: {shown_number(value)} is out of range (at most {MAX_INT})")
    if counts and tp is float and isinstance(value, int | float) and not math.isfinite(value):
        raise BaselineError(f"{where}: {value} is not a finite number")


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
