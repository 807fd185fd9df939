"""Capturing graph breaks: the only module that talks to Dynamo internals.

``torch._dynamo.explain`` cannot be used as is: it calls the function directly (so it would
trace a block *without* the FSDP/EP hooks that sit outside the compiled region in training, or
with them inside when they are not), it resets Dynamo, it suppresses the user stacks of the
``graph_breaks`` log, and it reports 0 graphs / -1 breaks for a break inside an AC region.
So gbdoctor does what explain does internally, at the place where training compiles: every
compiled region gets a graph-accumulating backend (graph and op counts, as explain's), and every
break Dynamo logs is recorded from ``InstructionTranslatorBase.log_graph_break`` (gb_type,
hop, real user stack) with the ``graph_breaks`` log stream as a fallback, plus
``counters["graph_break"]`` as a cross-check for breaks that reach neither. The backend is
``capture.recording_backend``'s; turning a break into a record, ``capture.break_records``'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch._dynamo
import torch.nn as nn

from gbdoctor import causes
from gbdoctor.capture import cudagraphs
from gbdoctor.capture.break_log import LoggedMessages, graph_break_log
from gbdoctor.capture.break_records import BreakRecorder
from gbdoctor.capture.raw_capture import RawCapture, compiled_frames
from gbdoctor.capture.recording_backend import GraphCheck, make_recording_backend


class CaptureSession(BreakRecorder):
    """Recording backend + break interception for one scan (one process).

    ``compile_fn`` is handed to ``setup.apply_setup`` so the setup compiles regions exactly
    where training would, but with a backend that records instead of optimizing. Scans always
    compile with ``fullgraph=False``: a break in a region planned as fullgraph is reported (it
    would be an error in training) instead of stopping the scan.
    """

    def __init__(self) -> None:
        super().__init__()
        self._current: RawCapture | None = None
        self._region_stack: list[str] = []
        self._paused = False
        self._log_records: LoggedMessages | None = None
        self.graph_checks: list[GraphCheck] = []
        """More CUDA-graph readiness checks of every ATen graph, beside inductor's
        (``capture/cudagraphs.py``): a framework's own CUDA-graph wrapper sets one."""

    def recording(self) -> RawCapture | None:
        """The capture being recorded; None outside a capture or while it is paused."""
        return None if self._paused else self._current

    # ------------------------------------------------------------------ compile side
    def recording_backend(self, fqn: str) -> Any:
        """A Dynamo backend that counts each graph of region ``fqn``, then runs aot_eager (for
        frameworks that compile regions themselves, without region markers: DeepSpeed)."""
        return make_recording_backend(self, lambda: fqn)

    @functools.cached_property
    def _region_backend(self) -> Any:
        """One recording backend for every region gbdoctor compiles itself, the region read
        from the marker around the compiled call. One object, as training passes one backend:
        Dynamo guards on the backend (BACKEND_MATCH), so per-region backends would make each
        layer's code look foreign to the next, and the dedupe proof would fail on that alone."""
        return make_recording_backend(self, self._region)

    @contextlib.contextmanager
    def in_region(self, fqn: str) -> Iterator[None]:
        """Mark code run inside as region ``fqn`` (breaks are attributed to it)."""
        if self._current is not None and not self._paused:
            self._current.entered.add(fqn)
        self._region_stack.append(fqn)
        try:
            yield
        finally:
            if self._region_stack:
                self._region_stack.pop()

    def compile_function(self, fn: Any, fqn: str, fullgraph: bool) -> Any:
        """``torch.compile(fn)`` with the recording backend, as region ``fqn`` (torchtitan
        v0.2.x compiles the experts' grouped-mm function on its own)."""
        compiled = torch.compile(fn, backend=self._region_backend, fullgraph=False)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.in_region(fqn):
                return compiled(*args, **kwargs)

        return call

    def compile_in_place(self, module: nn.Module, fqn: str, fullgraph: bool) -> None:
        """``module.compile()`` (in place, as torchtitan >= 0.3 compiles blocks) with the
        recording backend. The region marker wraps the compiled call from outside: hooks
        registered on ``module`` itself run inside the compiled ``_call_impl``, where Dynamo
        would trace them."""
        module.compile(backend=self._region_backend, fullgraph=False)
        compiled = module._compiled_call_impl
        assert compiled is not None  # set by module.compile() just above

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.in_region(fqn):
                return compiled(*args, **kwargs)

        module._compiled_call_impl = call

    def compile_fn(self, module: Any, fqn: str, fullgraph: bool) -> Any:
        if not isinstance(module, nn.Module):
            return self.compile_function(module, fqn, fullgraph)
        session = self
        # torch.compile of a module returns an OptimizedModule (an nn.Module, with hooks); its
        # stub only says a callable.
        compiled = cast(
            nn.Module, torch.compile(module, backend=self._region_backend, fullgraph=False)
        )

        def enter(mod: nn.Module, args: Any) -> None:
            # Not while paused: the recompile probe's eager steps enter every region.
            if session._current is not None and not session._paused:
                session._current.entered.add(fqn)
            session._region_stack.append(fqn)

        def leave(mod: nn.Module, args: Any, out: Any) -> None:
            if session._region_stack:
                session._region_stack.pop()

        compiled.register_forward_pre_hook(enter)
        compiled.register_forward_hook(leave, always_call=True)
        return compiled

    # ------------------------------------------------------------------ capture side
    @contextlib.contextmanager
    def capture(self) -> Iterator[RawCapture]:
        """Fresh Dynamo state; every break logged inside is recorded into the yielded object."""
        import torch._dynamo
        from torch._dynamo import symbolic_convert
        from torch._dynamo.utils import counters

        result = RawCapture()
        torch._dynamo.reset()
        counters.clear()
        # Dynamo's class as Any: replacing its method (with a looser signature) is the point
        # here, and mypy rejects assigning to a method.
        translator: Any = symbolic_convert.InstructionTranslatorBase
        original = translator.log_graph_break
        session = self

        def intercept(tracer: Any, code_options: Any, reason: str, exc: Any) -> None:
            target = session._current
            if not getattr(exc, "logged", False) and not session._paused and target is not None:
                try:
                    session.record(target, reason, exc, tracer, session._region())
                except Exception:  # noqa: BLE001 - never let bookkeeping break the traced code
                    logging.getLogger(__name__).debug("could not record a break", exc_info=True)
            return original(tracer, code_options, reason, exc)

        metrics_limit = _start_compile_metrics()
        logged: list[str] = []  # the fallback where interception is unavailable
        try:
            with graph_break_log() as log:
                self._log_records, logged = log, log.messages
                translator.log_graph_break = intercept
                self._current = result
                self._region_stack.clear()
                try:
                    yield result
                finally:
                    self._current = None
                    translator.log_graph_break = original
        finally:
            compiled = _end_compile_metrics(metrics_limit)
            result.cudagraph_findings += cudagraphs.released_static_inputs(result.static_inputs)
            result.static_inputs.clear()
            if result.error is None:  # a block that did not trace reports its error instead
                self.record_abandoned_frames(result, compiled)
            for key, n in counters.get("graph_break", {}).items():
                gb_type = causes.parse_reason(key).gb_type
                result.counter_types[gb_type] = result.counter_types.get(gb_type, 0) + n
            if not result.breaks and not result.frame_skips:
                # Interception unavailable (other torch versions): fall back to the log text.
                for message in logged:
                    self.record_from_log(result, message)
            torch._dynamo.reset()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Inside a capture: run more steps without recording their graphs or breaks (the scan's
        recompile probe; what they compile again is what ``capture.recompiles`` records)."""
        from torch._dynamo import utils as dynamo_utils
        from torch._dynamo.utils import counters

        breaks = dict(counters.get("graph_break", {}))
        logged = len(self._log_records.messages) if self._log_records else 0
        compiles = list(dynamo_utils.get_compilation_metrics())
        self._paused = True
        try:
            yield
        finally:
            self._paused = False
            dynamo_utils.clear_compilation_metrics()
            dynamo_utils._compilation_metrics.extend(compiles)
            counters["graph_break"].clear()
            counters["graph_break"].update(breaks)
            if self._log_records:
                del self._log_records.messages[logged:]

    @contextlib.contextmanager
    def scratch(self) -> Iterator[RawCapture]:
        """Inside ``paused()``: record what Dynamo traces into a separate capture (the dedupe
        proof's re-trace of another layer), leaving the block's own records untouched."""
        from torch._dynamo import utils as dynamo_utils

        own, paused = self._current, self._paused
        scratch = RawCapture()
        before = len(dynamo_utils.get_compilation_metrics())
        self._current, self._paused = scratch, False
        try:
            yield scratch
        finally:
            self._current, self._paused = own, paused
            compiled = list(dynamo_utils.get_compilation_metrics())[before:]
            scratch.compiled = compiled_frames(compiled)
            self.record_abandoned_frames(scratch, compiled)

    def _region(self) -> str:
        return self._region_stack[-1] if self._region_stack else ""


def _start_compile_metrics() -> int | None:
    """Empty Dynamo's compilation metrics and let them hold every compile of one capture
    (64 by default: a whole-model capture compiles more frames). Returns the old limit."""
    from torch._dynamo import utils as dynamo_utils

    metrics = getattr(dynamo_utils, "_compilation_metrics", None)
    if metrics is None or not hasattr(dynamo_utils, "set_compilation_metrics_limit"):
        return None  # other torch versions: no frame skips from metrics
    limit = metrics.maxlen
    dynamo_utils.clear_compilation_metrics()
    dynamo_utils.set_compilation_metrics_limit(1 << 16)
    return limit


def _end_compile_metrics(limit: int | None) -> list[Any]:
    """The metrics of the capture's compiles; the old limit back."""
    from torch._dynamo import utils as dynamo_utils

    if limit is None:
        return []
    metrics = list(dynamo_utils.get_compilation_metrics())
    dynamo_utils.clear_compilation_metrics()
    dynamo_utils.set_compilation_metrics_limit(limit)
    return metrics


@contextlib.contextmanager
def strict_breaks() -> Iterator[None]:
    """Dynamo's strict check: every graph break raises (``fullgraph=True`` is not a zero-break
    test: it silently enables scalar and dynamic-shape capture)."""
    with torch._dynamo.error_on_graph_break(True):
        yield
