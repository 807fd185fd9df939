"""The one JSON reader/writer for records. Byte-stable output: sorted keys, no timestamps,
fixed indentation, a trailing newline.

Reading checks, in order: the text parses, it is an object, its ``schema_version`` is the one
this gbdoctor reads (:func:`check_schema_version`), no key is unknown or missing
(:func:`from_dict`), and every leaf has its annotated type (:func:`check_types`). Every failure
is one :class:`~gbdoctor.errors.BaselineError` line naming the file and the JSON path.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from gbdoctor.errors import BaselineError

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


def check_types(tp: Any, value: Any, where: str = "$") -> None:
    """Type check of a rebuilt record against its annotations (from_dict does not check leaves)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return check_types(args[0], value, where)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            for i, item in enumerate(value):
                check_types(args[0], item, f"{where}[{i}]")
            return
        if len(value) != len(args):
            raise BaselineError(f"{where}: expected {len(args)} items, got {len(value)}")
        for i, (arg, item) in enumerate(zip(args, value)):
            check_types(arg, item, f"{where}[{i}]")
        return
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            check_types(hints[f.name], getattr(value, f.name), f"{where}.{f.name}")
        return
    expected = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}.get(tp)
    if expected is None:
        return
    if not isinstance(value, expected) or (tp is not bool and isinstance(value, bool)):
        raise BaselineError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")


def read_text(path: str | Path, what: str, hint: str) -> str:
    """A JSON file's text; one-line BaselineError when it is missing (with ``hint``) or unreadable."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"{path}: no such {what} file", hint=hint) from None
    except (OSError, UnicodeDecodeError) as exc:
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
    if not isinstance(data, dict):
        raise BaselineError(f"{name}: expected a JSON object, got {type(data).__name__}", hint=hint)
    return data


def check_schema_version(
    data: dict[str, Any],
    expected: int,
    name: str,
    what: str,
    hint: str,
    readable: tuple[int, ...] = (),
) -> None:
    """BaselineError unless ``data["schema_version"]`` is ``expected`` (or one of the older
    ``readable`` versions); ``what`` names the document."""
    version = data.get("schema_version")
    if version is None:
        raise BaselineError(
            f"{name}: missing key 'schema_version' (not a gbdoctor {what}?)", hint=hint
        )
    if version != expected and version not in readable:
        older = f" (and {', '.join(str(v) for v in readable if v != expected)})" if readable else ""
        raise BaselineError(
            f"{name}: {what} schema_version {version!r}, this gbdoctor reads {expected}{older}",
            hint=hint,
        )


def load_record(cls: type[T], data: dict[str, Any], name: str, ignore: tuple[str, ...] = ()) -> T:
    """A record of type ``cls`` from a parsed JSON object (keys in ``ignore`` are derived and
    dropped); every problem is a BaselineError prefixed with ``name``."""
    data = {k: v for k, v in data.items() if k not in ignore}
    try:
        rec = from_dict(cls, data, "$")
        check_types(cls, rec, "$")
    except BaselineError as exc:
        raise BaselineError(f"{name}: {exc.message}", hint=exc.hint) from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise BaselineError(f"{name}: malformed {cls.__name__} ({exc})") from None
    return rec
