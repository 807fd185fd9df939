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
import functools
import json
import math
import os
import stat
import types
import typing
from collections.abc import Callable
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


Builder = Callable[[Any, str], Any]
Checker = Callable[[Any, str], None]
"""A reader or checker of one annotated type, made once per type (:func:`_builder`,
:func:`_checker`): a scan with 600k breaks is millions of values, and working out what a type
asks for at each of them made reading it take minutes (issue 45)."""


def _build(tp: Any, value: Any, where: str) -> Any:
    return _builder(tp)(value, where)


@functools.cache
def _builder(tp: Any) -> Builder:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        member = _builder(next(a for a in typing.get_args(tp) if a is not type(None)))
        return lambda value, where: None if value is None else member(value, where)
    if origin is tuple:
        args = typing.get_args(tp)
        variadic = len(args) == 2 and args[1] is Ellipsis
        items = [_builder(a) for a in (args[:1] if variadic else args)]

        def build_tuple(value: Any, where: str) -> Any:
            if not isinstance(value, list):
                raise BaselineError(f"{where}: expected a list, got {type(value).__name__}")
            if variadic:
                return tuple(items[0](v, f"{where}[{i}]") for i, v in enumerate(value))
            return tuple(b(v, f"{where}[{i}]") for i, (b, v) in enumerate(zip(items, value)))

        return build_tuple
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return lambda value, where: from_dict(tp, value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = {m.value: m for m in tp}

        def build_enum(value: Any, where: str) -> Any:
            try:
                return members[value]
            except (KeyError, TypeError):
                raise BaselineError(f"{where}: {value!r} is not one of {list(members)}") from None

        return build_enum
    return lambda value, where: value


@functools.cache
def _type_hints(cls: Any, *, extras: bool) -> dict[str, Any]:
    """A record class's field types, evaluated once: ``get_type_hints`` compiles every string
    annotation on each call, which was 3/4 of reading a scan with many breaks (issue 45)."""
    return typing.get_type_hints(cls, include_extras=extras)


def from_dict(cls: type[T], data: Any, where: str = "$") -> T:
    """Rebuild a record from ``to_jsonable`` output; unknown or missing keys are BaselineErrors."""
    if not isinstance(data, dict):
        raise BaselineError(
            f"{where}: expected an object for {cls.__name__}, got {type(data).__name__}"
        )
    fields = _record_fields(typing.cast("Any", cls))
    if not data.keys() <= fields.keys():
        unknown = sorted(set(data) - set(fields))
        raise BaselineError(f"{where}: unknown key(s) {unknown} for {cls.__name__}")
    kwargs = {}
    for name, (build, required) in fields.items():
        if name in data:
            kwargs[name] = build(data[name], f"{where}.{name}")
        elif required:
            raise BaselineError(f"{where}: missing key '{name}' for {cls.__name__}")
    return cls(**kwargs)


@functools.cache
def _record_fields(cls: Any) -> dict[str, tuple[Builder, bool]]:
    """Each field's builder, and whether the JSON must have it (no default)."""
    hints = _type_hints(cls, extras=False)
    return {
        f.name: (
            _builder(hints[f.name]),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    }


def check_types(tp: Any, value: Any, where: str = "$", *, counts: bool = False) -> None:
    """Type check of a rebuilt record against its annotations (from_dict does not check leaves).

    ``counts``: every int of the record is a count, size, line or version and every float a
    share or measurement, so a negative int or a NaN/infinite float is impossible and refused
    (scan and plan files; run reports keep non-finite losses, which they flag)."""
    _checker(tp, counts)(value, where)


def _no_check(value: Any, where: str) -> None:
    return None


@functools.cache
def _checker(tp: Any, counts: bool) -> Checker:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, *extras = typing.get_args(tp)
        inner = _checker(base, counts)
        ranges = [extra for extra in extras if isinstance(extra, Range)]

        def check_range(value: Any, where: str) -> None:
            inner(value, where)
            for allowed in ranges:
                if (problem := allowed.problem(value)) is not None:
                    raise BaselineError(f"{where}: {problem}")

        return check_range
    if origin in (typing.Union, types.UnionType):
        nullable = type(None) in typing.get_args(tp)
        member = _checker(next(a for a in typing.get_args(tp) if a is not type(None)), counts)

        def check_member(value: Any, where: str) -> None:
            if not (value is None and nullable):
                member(value, where)

        return check_member
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            item = _checker(args[0], counts)
            if item is _no_check:
                return _no_check

            def check_items(value: Any, where: str) -> None:
                for i, v in enumerate(value):
                    item(v, f"{where}[{i}]")

            return check_items
        items = [_checker(a, counts) for a in args]

        def check_fixed(value: Any, where: str) -> None:
            if len(value) != len(items):
                raise BaselineError(f"{where}: expected {len(items)} items, got {len(value)}")
            for i, (check, v) in enumerate(zip(items, value, strict=True)):
                check(v, f"{where}[{i}]")

        return check_fixed
    if dataclasses.is_dataclass(tp):
        hints = _type_hints(tp, extras=True)  # type: ignore[arg-type]
        fields = [(f.name, _checker(hints[f.name], counts)) for f in dataclasses.fields(tp)]
        fields = [(name, check) for name, check in fields if check is not _no_check]

        def check_record(value: Any, where: str) -> None:
            for name, check in fields:
                check(getattr(value, name), f"{where}.{name}")

        return check_record
    expected = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}.get(tp)
    if expected is None:
        return _no_check
    return functools.partial(_check_leaf, tp, expected, counts)


def _check_leaf(tp: type, expected: tuple[type, ...], counts: bool, leaf: Any, where: str) -> None:
    if not isinstance(leaf, expected) or (tp is not bool and isinstance(leaf, bool)):
        raise BaselineError(f"{where}: expected {tp.__name__}, got {type(leaf).__name__}")
    value: Any = leaf  # checked against ``tp`` above, which isinstance cannot tell mypy
    if tp is str:
        if not value.isascii() and not _valid_unicode(value):
            # JSON's \ud800 escapes make lone surrogates, which no file or page can hold.
            raise BaselineError(f"{where}: not valid Unicode text (a lone surrogate escape)")
        return
    if tp is float and isinstance(value, int) and abs(value) > MAX_INT:
        # An integer where a float belongs: past 2**63 it is no measurement (and past ~1e308
        # float() itself fails).
        raise BaselineError(f"{where}: {shown_number(value)} is out of range (at most {MAX_INT})")
    if counts and tp is int and value < 0:
        raise BaselineError(f"{where}: {value} is negative (impossible here)")
    if tp is int and abs(value) > MAX_INT:
        raise BaselineError(f"{where}: {shown_number(value)} is out of range (at most {MAX_INT})")
    if counts and tp is float and not math.isfinite(value):
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
