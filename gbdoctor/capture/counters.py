"""What ``run`` and DeepSpeed scans read from Dynamo while training: the ``recompiles`` log
stream (with the step each recompile happened in), the recompile-limit warnings (they arrive on
the ``torch._dynamo.convert_frame`` WARNING logger, not on the recompiles or graph-break streams:
measured under DeepSpeed ZeRO-3, reference/deepspeed-cpu-probe.md), Dynamo's graph and break
counters, its frame-compile time, and the kind of a failure (a Dynamo exception class).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

from gbdoctor.records import Recompile

RECOMPILES_LOGGER = "torch._dynamo.guards.__recompiles"
LIMIT_LOGGER = "torch._dynamo.convert_frame"


class RecompileRecorder(logging.Handler):
    """Collects recompile log records, tagged with the training step they happened in."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.step = 0
        self.measured = False
        self.records: list[Recompile] = []
        self.limit_hit = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record never breaks training
            return
        if record.name == LIMIT_LOGGER:
            limit = parse_recompile_limit(text, step=self.step, measured=self.measured)
            if limit is not None:
                self.limit_hit = True
                self.records.append(limit)
            return
        self.records.append(parse_recompile(text, step=self.step, measured=self.measured))


_ENTRY = re.compile(r"^\d+/\d+: ")
_OBJECT_ID = re.compile(r"(___check_(?:type|obj)_id\([^,()]+(?:\([^()]*\))?[^,()]*), \d+\)")
_LIMIT = re.compile(r"hit config\.(\w+) \((\d+)\)")
_LIMIT_FUNCTION = re.compile(r"function: '([^']+)' \(([^)]+)\)")
_LIMIT_REASON = re.compile(r"last reason: (.*)")


def _stable(reason: str) -> str:
    """A guard without the object ids Dynamo prints (``___check_type_id(x, 9393...)`` ->
    ``___check_type_id(x)``): they differ from process to process."""
    return _OBJECT_ID.sub(r"\1)", reason)


_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_HEADER = re.compile(r"Recompiling function (\S+) in (.+)$")


def parse_recompile(text: str, *, step: int, measured: bool) -> Recompile:
    """A :class:`Recompile` from one ``recompiles`` log message (torch 2.13 layout)::

    Recompiling function forward in /path/model.py:86
        triggered by the following guard failure(s):
        - 0/2: self.tag == 'b'   # code  # path:89 in forward (HINT: ...)
        - User stack trace:
        -   File "/path/model.py", line 89, in forward
        - 0/1: ...
    """
    lines = text.splitlines()
    function = lines[0].strip() if lines else ""
    m = _HEADER.match(function)
    if m:
        function = f"{m.group(1)} at {m.group(2)}"
    entries: list[list[str]] = []
    for line in lines[1:]:
        item = line.strip()
        if not item.startswith("-"):
            continue
        item = item[1:].strip()
        if _ENTRY.match(item):
            entries.append([item])
        elif entries:
            entries[-1].append(item)
    if not entries:
        rest = " ".join(line.strip() for line in lines[1:] if line.strip())
        return Recompile(
            step=step, measured=measured, function=function, reason=rest[:400] or "unknown"
        )
    # The failure of the newest cache entry (highest N in "F/N"); Dynamo lists entries newest
    # first with its LRU cache on, oldest first with it off (as under AC).
    first = max(entries, key=_entry_index)
    head = _ENTRY.sub("", first[0])
    hint = ""
    if "(HINT:" in head:
        head, _, hint = head.partition("(HINT:")
        hint = hint.strip().rstrip(")").strip()
    reason = _stable(" ".join(head.split("#", 1)[0].split()))
    location = None
    for item in first[1:]:
        fm = _FILE_LINE.search(item)
        if fm:
            location = f"{fm.group(1)}:{fm.group(2)}"
    return Recompile(
        step=step,
        measured=measured,
        function=function,
        reason=reason[:400] or head.strip()[:400],
        location=location,
        hint=hint[:400],
        failed_entries=len(entries),
    )


def parse_recompile_limit(text: str, *, step: int, measured: bool) -> Recompile | None:
    """A ``limit_hit`` :class:`Recompile` from a ``convert_frame`` warning (torch 2.13)::

        torch._dynamo hit config.recompile_limit (8)
           function: '_pre_backward_module_hook' (/path/parameter_offload.py:410)
           last reason: 28/7: tensor 'args[1]' size mismatch at index 0. expected 64, actual 256
        To log all recompilation reasons, use TORCH_LOGS="recompiles".

    None for the logger's other warnings.
    """
    m = _LIMIT.search(text)
    if m is None:
        return None
    fm = _LIMIT_FUNCTION.search(text)
    function = f"{fm.group(1)} at {fm.group(2)}" if fm else "unknown"
    rm = _LIMIT_REASON.search(text)
    reason = _ENTRY.sub("", rm.group(1).strip()) if rm else ""
    reason = _stable(" ".join(reason.split("#", 1)[0].split()))
    return Recompile(
        step=step,
        measured=measured,
        function=function,
        reason=(reason or "unknown")[:400],
        hint=f"hit config.{m.group(1)} ({m.group(2)})",
        failed_entries=int(m.group(2)),
        limit_hit=True,
    )


def _entry_index(entry: list[str]) -> int:
    m = re.match(r"^\d+/(\d+): ", entry[0])
    return int(m.group(1)) if m else -1


@contextlib.contextmanager
def record_recompiles() -> Iterator[RecompileRecorder]:
    """Route the ``recompiles`` stream and the recompile-limit warnings into a recorder (and not
    to the user's stderr: the records carry what they said) for the duration of the block."""
    import torch._logging

    recorder = RecompileRecorder()
    rec_logger = logging.getLogger(RECOMPILES_LOGGER)
    limit_logger = logging.getLogger(LIMIT_LOGGER)
    old_propagate = rec_logger.propagate, limit_logger.propagate
    torch._logging.set_logs(recompiles=True)
    rec_logger.addHandler(recorder)
    rec_logger.propagate = limit_logger.propagate = False  # keep the user's stderr clean
    limit_logger.addHandler(recorder)
    try:
        yield recorder
    finally:
        rec_logger.removeHandler(recorder)
        limit_logger.removeHandler(recorder)
        rec_logger.propagate, limit_logger.propagate = old_propagate
        torch._logging.set_logs()


CUDAGRAPHS_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"
"""Inductor's ``cudagraphs`` artifact log: "skipping cudagraphs due to ..." (one per skip)."""


class CudagraphSkipRecorder(logging.Handler):
    """Inductor's cudagraph skip reasons (first line of each), in the order they were logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record never breaks training
            return
        if "cudagraph" in text:
            self.reasons.append((text.strip().splitlines() or [""])[0][:300])


@contextlib.contextmanager
def record_cudagraph_skips() -> Iterator[CudagraphSkipRecorder]:
    """Route inductor's cudagraph skip messages into a recorder for the duration of the block.

    Entered inside ``record_recompiles``: ``set_logs`` replaces the whole log state, so the
    ``recompiles`` stream is kept on here and left on at exit."""
    import torch._logging

    recorder = CudagraphSkipRecorder()
    logger = logging.getLogger(CUDAGRAPHS_LOGGER)
    torch._logging.set_logs(recompiles=True, cudagraphs=True)
    logger.addHandler(recorder)
    logger.propagate = False
    try:
        yield recorder
    finally:
        logger.removeHandler(recorder)
        logger.propagate = True
        torch._logging.set_logs(recompiles=True)


def failure_kind(exc: BaseException) -> str:
    import torch._dynamo.exc as dexc

    if isinstance(exc, getattr(dexc, "FailOnRecompileLimitHit", ())):
        return "recompile-limit"  # fullgraph=True turns hitting recompile_limit into an error
    if isinstance(exc, dexc.Unsupported):
        return "graph-break"
    if isinstance(exc, dexc.TorchDynamoException):
        return "compile"
    return "runtime"


def counter_totals() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


def dynamo_compile_s() -> float:
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(compilation_time_metrics.get("_compile.compile_inner", [])))
