"""Parsing Dynamo's graph-break reason text and ``graph_breaks`` log records into parts
(gb_type, explanation, hints, context, HOP, user frames). With ``rules``, the only code that
reads message text."""

from __future__ import annotations

import re
from typing import NamedTuple

from gbdoctor.causes.gb_registry import gb_id_for
from gbdoctor.records import Location

# --------------------------------------------------------------------------- parsing


class Reason(NamedTuple):
    """Dynamo's reason text split into its parts (a plain tuple for callers)."""

    gb_type: str
    explanation: str
    hints: tuple[str, ...]
    context: str
    hop: str | None


DATA_DEPENDENT_BRANCHING = "Data-dependent branching"

_HEADER = re.compile(r"^Graph break\b.*\bin user code at ")
_REASON_PREFIX = "Graph Break Reason:"
_STOP = (
    "User code traceback:",
    "Stack variable source attribution:",
    "from user code:",
    "Set TORCHDYNAMO_VERBOSE=1",
)
_NEXT_REASON = "*** While handling this graph break, another graph break occurred: ***"
_FIELD = re.compile(
    r"^\s*(Higher Order Operator|Explanation|Hint|Developer debug context):\s?(.*)$"
)
_MORE = re.compile(r"^\s*For more details about this graph break")
GUARD_DATA_DEPENDENT = "Could not guard on data-dependent expression"
DATA_DEPENDENT_SPECIALIZATION = (
    "Could not extract specialized integer from data-dependent expression"
)
"""Dynamo's text (no registry entry) when a data-dependent value (an unbacked ``u0``) is used
where a Python int is needed, e.g. indexing with an element of ``nonzero()``'s output; the
``u0 (unhinted: u0)`` tail varies, so this stable prefix is the gb_type."""
_TRACE_HEADER = re.compile(r"^Encountered graph break when attempting to trace .*:$")
FRAME_SKIP_LOOP = "graph break in loop"
"""GB7000: Dynamo gave up on the whole frame because a break happened inside a loop."""


def chain_reasons(first: str, then: str) -> str:
    """The text Dynamo writes when handling one break led to another (``then``, e.g. GB7000
    "graph break in loop"): :func:`parse_reasons` splits it back into both."""
    return f"{first}\n\n{_NEXT_REASON}\n\n{then}"


def is_frame_skip(gb_type: str) -> bool:
    """Whether a gb_type says Dynamo skipped the whole frame (GB7000, "graph break in loop")."""
    return gb_type.strip() == FRAME_SKIP_LOOP or gb_id_for(gb_type) == "GB7000"


def parse_reasons(text: str) -> list[Reason]:
    """Every reason in a text: a log record can chain a second one (``graph break in loop``)."""
    return [_parse_one(chunk) for chunk in (text or "").split(_NEXT_REASON)]


def parse_reason(text: str) -> Reason:
    """Split one Dynamo reason (or a whole ``graph_breaks`` log record) into its parts.

    Layout: ``<gb_type>``, optional ``  Higher Order Operator: X``, ``  Explanation: ...``,
    repeated ``  Hint: ...``, ``  Developer debug context: ...``, then the "For more
    details" URL. The log record's header lines and trailing traceback are skipped; of a
    chained record only the first reason is read (:func:`parse_reasons` reads all). The
    ``generic_jump``/"Could not guard on data-dependent expression" form (no registry
    layout) becomes ``Data-dependent branching``. Never raises: odd text gives its first
    line as gb_type and empty fields.
    """
    return _parse_one((text or "").split(_NEXT_REASON)[0])


def _body_lines(text: str) -> list[str]:
    lines: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if any(stripped.startswith(s) for s in _STOP):
            break
        if _HEADER.match(stripped) or _TRACE_HEADER.match(stripped):
            continue
        if stripped.startswith(_REASON_PREFIX):
            rest = stripped[len(_REASON_PREFIX) :].strip()
            # "Encountered graph break when attempting to trace CALL: ...:" is a header;
            # "Graph Break Reason: Data-dependent branching" carries the gb_type inline.
            if not rest or rest.endswith(":"):
                continue
            line = rest
        lines.append(line.rstrip())
    while lines and not lines[0].strip():
        lines.pop(0)
    return lines


def _parse_one(text: str) -> Reason:
    lines = _body_lines(text)
    if not lines:
        return Reason("", "", (), "", None)

    hop = None
    for line in lines:
        m = _FIELD.match(line)
        if m and m.group(1) == "Higher Order Operator":
            hop = m.group(2).strip() or None
            break

    first_field = next(
        (
            i
            for i, line in enumerate(lines)
            if (m := _FIELD.match(line)) and m.group(1) != "Higher Order Operator"
        ),
        None,
    )
    if first_field is None:
        return _parse_unstructured(lines, hop)

    gb_type = ""
    for line in reversed(lines[:first_field]):
        if line.strip() and not _FIELD.match(line):
            gb_type = line.strip()
            break

    explanation: list[str] = []
    hints: list[list[str]] = []
    context: list[str] = []
    current: list[str] | None = None
    for line in lines[first_field:]:
        if _MORE.match(line):
            break
        m = _FIELD.match(line)
        if m:
            name, value = m.group(1), m.group(2).strip()
            if name == "Explanation":
                current = explanation
            elif name == "Hint":
                hints.append([])
                current = hints[-1]
            elif name == "Developer debug context":
                current = context
            else:
                current = None
                continue
            if value:
                current.append(value)
        elif not line.strip():
            current = None
        elif current is not None:
            current.append(line.strip())
    return Reason(
        gb_type=gb_type,
        explanation=stable_text("\n".join(explanation)),
        hints=tuple(stable_text("\n".join(h)) for h in hints if h),
        context=stable_text("\n".join(context)),
        hop=hop,
    )


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_FUNCTION_REPR = re.compile(r"<function ([\w.<>]+)>")


def stable_text(text: str) -> str:
    """Message text without process-specific object addresses (``<function f at 0x7f...>``),
    so that the same scan twice gives the same records."""
    return _ADDRESS.sub("", text)


def called_function(context: str) -> str:
    """Qualified name of the function a "Skip calling torch.compiler.disable()d function" break
    (GB0098) was about to call, from its context (``<function Cls.<locals>.hook at 0x..>``),
    or "" when the context names none."""
    m = _FUNCTION_REPR.search(stable_text(context))
    return m.group(1) if m else ""


def _parse_unstructured(lines: list[str], hop: str | None) -> Reason:
    first = lines[0].strip()
    body = "\n".join(lines)
    if first.startswith(DATA_DEPENDENT_SPECIALIZATION):
        caused_by = next((ln.strip() for ln in lines if ln.strip().startswith("Caused by:")), "")
        return Reason(DATA_DEPENDENT_SPECIALIZATION, first, (), caused_by, hop)
    if first.startswith("generic_jump") or GUARD_DATA_DEPENDENT in body:
        explanation = next((ln.strip() for ln in lines if GUARD_DATA_DEPENDENT in ln), "")
        caused_by = next((ln.strip() for ln in lines if ln.strip().startswith("Caused by:")), "")
        context = first if first.startswith("generic_jump") else caused_by
        return Reason(DATA_DEPENDENT_BRANCHING, explanation, (), context, hop)
    rest = [ln.strip() for ln in lines[1:] if ln.strip() and not _MORE.match(ln)]
    return Reason(first, "\n".join(rest), (), "", hop)


_TRACEBACK_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')


def parse_graph_break_log(message: str) -> tuple[str, tuple[Location, ...]] | None:
    """A ``graph_breaks`` log record -> (reason text, user traceback frames outermost first).

    Used only when the structured interception in ``capture.py`` is unavailable. Returns None
    for records that are not graph-break records.
    """
    if "Graph Break Reason:" not in (message or ""):
        return None
    reason = message.split("Graph Break Reason:", 1)[1]
    body, _, trace = reason.partition("User code traceback:")
    frames = tuple(
        Location(file=m["file"], line=int(m["line"]), function=m["fn"])
        for m in (_TRACEBACK_FRAME.match(line) for line in trace.splitlines())
        if m
    )
    return body.strip(), frames
