"""A failed Dynamo guard said in plain words, for the one line per kind a terminal report gives
recompiles (the detail tables and the JSON keep the guard as Dynamo wrote it). No torch."""

from __future__ import annotations

import re

__all__ = ["guard_in_words"]

_SIZE = re.compile(
    r"tensor '(?P<name>.+)' size mismatch at index (?P<dim>\d+)\. "
    r"expected (?P<old>\d+), actual (?P<new>\d+)"
)
_STRIDE = re.compile(r"tensor '(?P<name>[^']+)' stride mismatch at index (?P<dim>\d+)")
_TYPE_ID = re.compile(r"___check_type_id\((?P<name>[^)]+)\)(?:, type=<class '(?P<cls>[^']+)'>)?")
_OBJ_ID = re.compile(r"___check_obj_id\((?P<name>[^)]+)\)")
_LEN = re.compile(r"^len\((?P<name>.+)\) == (?P<old>\d+)$")
_EQUALS = re.compile(r"^(?P<name>[\w.\[\]'\"]+(?: \w+)*) == (?P<old>.+)$")
_GLOBAL = re.compile(r"GLOBAL_STATE changed: (?P<what>.+)")
_NOT_TENSOR = re.compile(
    r"expected type of '(?P<name>[^']+)' to be a tensor type.*found <class '(?P<cls>[^']+)'>"
)


def guard_in_words(reason: str) -> str:
    """``tensor 'x' size mismatch at index 1. expected 64, actual 32`` -> ``the size of x
    (dim 1) changed: 64 -> 32``; a guard of no known shape is returned as it is."""
    if m := _SIZE.search(reason):
        return f"the size of {m['name']} (dim {m['dim']}) changed: {m['old']} -> {m['new']}"
    if m := _STRIDE.search(reason):
        return f"the stride of {m['name']} (dim {m['dim']}) changed"
    if m := _NOT_TENSOR.search(reason):
        return f"{m['name']} is a {m['cls'].rpartition('.')[2]} now, not a tensor"
    if m := _TYPE_ID.search(reason):
        was = f" (was {m['cls'].rpartition('.')[2]})" if m["cls"] else ""
        return f"the type of {m['name']} changed{was}"
    if m := _OBJ_ID.search(reason):
        return f"{m['name']} is another object"
    if m := _LEN.match(reason):
        return f"the length of {m['name']} changed (was {m['old']})"
    if m := _GLOBAL.search(reason):
        return f"global state changed ({m['what']})"
    if m := _EQUALS.match(reason):
        return f"the value of {m['name']} changed (was {m['old']})"
    return reason
