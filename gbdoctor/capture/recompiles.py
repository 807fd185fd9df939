"""Recording recompiles: Dynamo's ``recompiles`` log stream as :class:`Recompile` records.

One small, reusable piece (``run`` tags each record with its training step, ``scan`` with the
probe step of a block, and the DeepSpeed path can use it the same way)::

    with watch_recompiles() as watch:
        for step in range(n):
            watch.tag(step=step, measured=step >= warmup)
            train_step(...)
    watch.records      # [Recompile(step, measured, function, reason, location, hint, ...)]
    watch.limit_hit    # Dynamo hit recompile_limit and ran some frame eagerly afterwards

It enables only the ``recompiles`` logging artifact (other ``torch._logging`` settings, such as
the ``graph_breaks`` stream a scan capture enables, are left as they are) and keeps the records
off the user's stderr. Dynamo checks ``log_state.is_artifact_enabled("recompiles")`` on every
guard failure, so entering the watcher mid-run works; the ``recompile_limit`` warning comes from
``torch._dynamo.convert_frame``'s logger. Part of ``capture/``, the only stage that talks to
Dynamo internals.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator

from gbdoctor.models.custom import portable_module_names
from gbdoctor.records import Recompile

RECOMPILES_LOGGER = "torch._dynamo.guards.__recompiles"
LIMIT_LOGGER = "torch._dynamo.convert_frame"
_ARTIFACT = "recompiles"

PathFn = Callable[[str], str]


class RecompileWatch(logging.Handler):
    """Collects recompile log records, tagged with the step set by :meth:`tag`."""

    def __init__(self, path_fn: PathFn | None = None) -> None:
        super().__init__(logging.DEBUG)
        self.step = 0
        self.measured = False
        self.records: list[Recompile] = []
        self.limit_hit = False
        self._path_fn = path_fn

    def tag(self, *, step: int, measured: bool) -> None:
        """Tag the records that follow with this step (and whether it is a measured/steady one)."""
        self.step, self.measured = step, measured

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record never breaks training
            return
        if record.name == LIMIT_LOGGER:
            limit = parse_recompile_limit(
                text, step=self.step, measured=self.measured, path_fn=self._path_fn
            )
            if limit is not None:  # the logger's other warnings are not ours
                self.limit_hit = True
                self.records.append(limit)
            return
        self.records.append(
            parse_recompile(text, step=self.step, measured=self.measured, path_fn=self._path_fn)
        )


@contextlib.contextmanager
def watch_recompiles(path_fn: PathFn | None = None) -> Iterator[RecompileWatch]:
    """Record every recompile (and ``recompile_limit`` hit) inside the block.

    ``path_fn`` rewrites file paths in the records (scans pass ``locate.portable_path`` so that
    their JSON does not depend on the machine).
    """
    from torch._logging._internal import log_state

    watch = RecompileWatch(path_fn)
    rec_logger = logging.getLogger(RECOMPILES_LOGGER)
    limit_logger = logging.getLogger(LIMIT_LOGGER)
    was_enabled = log_state.is_artifact_enabled(_ARTIFACT)
    old_level, old_propagate = rec_logger.level, rec_logger.propagate
    log_state.enable_artifact(_ARTIFACT)
    rec_logger.setLevel(logging.DEBUG)
    rec_logger.propagate = False  # keep the user's stderr clean
    rec_logger.addHandler(watch)
    limit_logger.addHandler(watch)
    try:
        yield watch
    finally:
        rec_logger.removeHandler(watch)
        limit_logger.removeHandler(watch)
        rec_logger.setLevel(old_level)
        rec_logger.propagate = old_propagate
        if not was_enabled:
            log_state.artifact_names.discard(_ARTIFACT)


_ENTRY = re.compile(r"^\d+/\d+: ")
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_HEADER = re.compile(r"Recompiling function (\S+) in (.+):(\d+)$")
_OBJECT_ID = re.compile(r"(___check_(?:type|obj)_id\([^,()]+(?:\([^()]*\))?[^,()]*), \d+\)")
_LIMIT = re.compile(r"hit config\.(\w+) \((\d+)\)")
_LIMIT_FUNCTION = re.compile(r"function: '([^']+)' \(([^)]+?)(?::(\d+))?\)")
_LIMIT_REASON = re.compile(r"last reason: (.*)")


def _stable(reason: str) -> str:
    """A guard without the object ids Dynamo prints (``___check_type_id(x, 9393...)`` ->
    ``___check_type_id(x)``): they differ from process to process; and a factory file's
    classes by the file's module name, not the digest of its absolute path."""
    return portable_module_names(_OBJECT_ID.sub(r"\1)", reason))


def parse_recompile(
    text: str, *, step: int, measured: bool, path_fn: PathFn | None = None
) -> Recompile:
    """A :class:`Recompile` from one ``recompiles`` log message (torch 2.13 layout)::

    Recompiling function forward in /path/model.py:86
        triggered by the following guard failure(s):
        - 0/2: self.tag == 'b'   # code  # path:89 in forward (HINT: ...)
        - User stack trace:
        -   File "/path/model.py", line 89, in forward
        - 0/1: ...
    """
    fix = path_fn or (lambda p: p)
    lines = text.splitlines()
    function = lines[0].strip() if lines else ""
    m = _HEADER.match(function)
    if m:
        function = f"{m.group(1)} at {fix(m.group(2))}:{m.group(3)}"
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
            location = f"{fix(fm.group(1))}:{fm.group(2)}"
    return Recompile(
        step=step,
        measured=measured,
        function=function,
        reason=reason[:400] or head.strip()[:400],
        location=location,
        hint=hint[:400],
        failed_entries=len(entries),
    )


def _entry_index(entry: list[str]) -> int:
    m = re.match(r"^\d+/(\d+): ", entry[0])
    return int(m.group(1)) if m else -1


def parse_recompile_limit(
    text: str, *, step: int, measured: bool, path_fn: PathFn | None = None
) -> Recompile | None:
    """A ``limit_hit`` :class:`Recompile` from a ``convert_frame`` warning (torch 2.13)::

        torch._dynamo hit config.recompile_limit (8)
           function: '_pre_backward_module_hook' (/path/parameter_offload.py:410)
           last reason: 28/7: tensor 'args[1]' size mismatch at index 0. expected 64, actual 256
        To log all recompilation reasons, use TORCH_LOGS="recompiles".

    None for the logger's other warnings. From then on Dynamo runs that code eagerly.
    """
    m = _LIMIT.search(text)
    if m is None:
        return None
    fix = path_fn or (lambda p: p)
    fm = _LIMIT_FUNCTION.search(text)
    if fm is None:
        function = "unknown"
    else:
        line = f":{fm.group(3)}" if fm.group(3) else ""
        function = f"{fm.group(1)} at {fix(fm.group(2))}{line}"
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
