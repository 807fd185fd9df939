"""What ``gbdoctor timeline`` reads from Dynamo step by step (a ``capture/`` module: the only
stage that touches Dynamo internals; ``capture.recompiles`` gives the guard text).

Three sources, each chosen because it is reliable on torch 2.13:

* ``torch._dynamo.utils.get_compilation_metrics()``: one ``CompilationMetrics`` per frame
  conversion attempt (compile id ``F/N``, function, cache size before it, frame compile time,
  failure type: a ``recompile_limit`` hit is a failed attempt with no graph), and one per lazily
  compiled backward graph. Dynamo appends to a module-level deque of 64; :class:`CompileLog`
  swaps in a larger one (same contents) so a step with many compiles (ZeRO-3's first step has
  about 40) loses none, and reads what is new after each step. The structured trace
  (``torch.__trace``) carries the same record, but enabling it makes Dynamo render every graph
  as a payload, which would be charged to the compile times measured here.
* A counting backend: the spec's backend, wrapped so that every compiled graph counts its runs
  per frame (``CompileContext.current_compile_id().frame_id`` at compile time). After a frame
  hits ``recompile_limit`` Dynamo runs it with ``RUN_ONLY``: a call that matches no cache entry
  runs eagerly and logs nothing, so fewer graph runs in a step is the only trace it leaves.
* ``torch._C._dynamo.eval_frame._debug_get_cache_entry_list(code)`` for every code object
  Dynamo has seen (``convert_frame.input_codes``): the cache size per frame after each step.

Callers get plain values (:class:`CompileEvent`, dicts keyed by frame id), never Dynamo objects.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

PathFn = Callable[[str], str]

_METRICS_CAPACITY = 100_000
"""Compiles kept in Dynamo's metrics deque while a timeline runs (its default keeps 64)."""


@dataclass(frozen=True)
class CompileEvent:
    """One ``CompilationMetrics`` record: a frame compile (or failed attempt), or a backward
    graph compiled lazily on the first backward."""

    frame_id: int
    """``F`` of the compile id ``F/N``: one per code object Dynamo converts; -1 when unknown."""
    attempt: int
    """``N`` of ``F/N``: 0 for the first compile of the frame, k for its k-th recompile."""
    function: str
    """``forward at path/model.py:35`` ("" for a backward graph or a failed attempt: Dynamo
    leaves the code fields empty there; the frame id names the function)."""
    forward: bool
    cache_size: int | None
    """Cache entries of the frame before this compile (Dynamo's own count)."""
    compile_s: float
    """Seconds this compile took (frame compile for a forward, backward compile otherwise)."""
    failure: str
    """Dynamo's failure type (``Unsupported`` for a ``recompile_limit`` hit), "" on success."""
    recompile_reason: str
    """The first failed guard that caused this recompile, as Dynamo recorded it ("" if none)."""


def _compile_id(text: str | None) -> tuple[int, int]:
    head = (text or "").split()[0] if text else ""
    frame, _, attempt = head.partition("/")
    try:
        return int(frame), int(attempt.split("_")[0])
    except ValueError:
        return -1, -1


def _event(m: Any, path_fn: PathFn) -> CompileEvent:
    frame, attempt = _compile_id(m.compile_id)
    function = ""
    if m.co_name:
        function = f"{m.co_name} at {path_fn(m.co_filename or '?')}:{m.co_firstlineno}"
    forward = m.is_forward is not False
    if forward:
        seconds = float(m.entire_frame_compile_time_s or 0.0)
    else:
        seconds = float(m.backward_cumulative_compile_time_us or m.duration_us or 0) / 1e6
    return CompileEvent(
        frame_id=frame,
        attempt=attempt,
        function=function,
        forward=forward,
        cache_size=m.cache_size,
        compile_s=seconds,
        failure=m.fail_type or "",
        recompile_reason=" ".join((m.recompile_reason or "").split())[:400],
    )


class CompileLog:
    """New ``CompilationMetrics`` since the last :meth:`take` (see the module docstring)."""

    def __init__(self, path_fn: PathFn) -> None:
        self._path_fn = path_fn
        self._seen = 0
        self.lost = 0
        """Steps read with the deque full (some records may be missing; never seen so far)."""

    def take(self) -> list[CompileEvent]:
        from torch._dynamo import utils

        current = list(utils._compilation_metrics)
        if len(current) >= _METRICS_CAPACITY:  # full: it drops from the left from now on
            self.lost += 1
        new = current[self._seen :]
        self._seen = len(current)
        return [_event(m, self._path_fn) for m in new]


@contextlib.contextmanager
def compile_log(path_fn: PathFn) -> Iterator[CompileLog]:
    """A :class:`CompileLog` over an enlarged metrics deque (restored on exit)."""
    from torch._dynamo import utils

    old = utils._compilation_metrics
    utils._compilation_metrics = collections.deque(old, maxlen=_METRICS_CAPACITY)
    log = CompileLog(path_fn)
    log._seen = len(utils._compilation_metrics)
    try:
        yield log
    finally:
        utils._compilation_metrics = collections.deque(
            utils._compilation_metrics, maxlen=old.maxlen
        )


@dataclass(frozen=True)
class GraphShapes:
    """One compiled graph of a frame: which input dims Dynamo compiled as symbols, and the calls
    in which it first ran at an input shape it had not run at before. Under CUDA graphs
    (``mode="reduce-overhead"``) each of those is a recording: cudagraph trees record a graph
    once per distinct shape of its dynamic inputs (pytorch#188150)."""

    frame_id: int
    index: int
    """Its number among the frame's graphs, in compile order."""
    compiled_at: int
    """The call (:attr:`GraphRunCounter.call`) in which it was compiled."""
    dynamic: tuple[str, ...]
    """Input dims compiled as symbols: ``L['x'] dim 1``."""
    new_shape_calls: tuple[int, ...]


def _dynamic_dims(gm: Any) -> tuple[str, ...]:
    import torch

    out: list[str] = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("example_value")
        if not isinstance(value, torch.Tensor):
            continue
        arg = node.meta.get("grapharg")
        name = arg.source.name if arg is not None and arg.source is not None else node.name
        out.extend(
            f"{name} dim {i}"
            for i, size in enumerate(value.shape)
            if isinstance(size, torch.SymInt)
        )
    return tuple(out)


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """A call's input shapes: tensor sizes and the int arguments (Dynamo passes a dynamic
    size as an int argument too)."""
    import torch

    return tuple(
        tuple(a.shape) if isinstance(a, torch.Tensor) else a if isinstance(a, int) else None
        for a in args
    )


class GraphRunCounter:
    """A Dynamo backend: ``inner`` (a name or a backend), whose compiled graphs count their runs
    per frame id in :attr:`runs` (read and reset with :meth:`take`), and remember the distinct
    input shapes each graph ran at (:meth:`graph_shapes`; set :attr:`call` before each call of
    the model)."""

    def __init__(self, inner: str | Callable[..., Any]) -> None:
        self.inner = inner
        self.runs: collections.Counter[int] = collections.Counter()
        self.graphs: collections.Counter[int] = collections.Counter()
        """Graphs compiled per frame id (a graph break gives a frame several)."""
        self.call = 0
        self._graphs: list[tuple[int, int, int, tuple[str, ...], dict[Any, int]]] = []

    def __call__(self, gm: Any, example_inputs: Any) -> Callable[..., Any]:
        from torch._dynamo.backends.registry import lookup_backend
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
        frame = cid.frame_id if cid is not None and cid.frame_id is not None else -1
        compiled = lookup_backend(self.inner)(gm, example_inputs)
        runs = self.runs
        first_seen: dict[Any, int] = {}
        self._graphs.append((frame, self.graphs[frame], self.call, _dynamic_dims(gm), first_seen))
        self.graphs[frame] += 1

        def run(*args: Any) -> Any:
            runs[frame] += 1
            first_seen.setdefault(_signature(args), self.call)
            return compiled(*args)

        return run

    def take(self) -> dict[int, int]:
        out = dict(self.runs)
        self.runs.clear()
        return out

    def graph_shapes(self) -> list[GraphShapes]:
        return [
            GraphShapes(
                frame_id=frame,
                index=index,
                compiled_at=at,
                dynamic=dynamic,
                new_shape_calls=tuple(sorted(seen.values())),
            )
            for frame, index, at, dynamic, seen in self._graphs
        ]


def cache_sizes(path_fn: PathFn) -> dict[str, int]:
    """Cache entries per code object Dynamo has converted (those with at least one), keyed
    ``function at path:line``."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.convert_frame import input_codes

    sizes: dict[str, int] = {}
    for ref in list(input_codes.seen):
        code = ref()
        if code is None:
            continue
        n = len(_debug_get_cache_entry_list(code))
        if n:
            key = f"{code.co_name} at {path_fn(code.co_filename)}:{code.co_firstlineno}"
            sizes[key] = sizes.get(key, 0) + n
    return sizes


def recompile_limit() -> int:
    import torch._dynamo

    return int(torch._dynamo.config.recompile_limit)
