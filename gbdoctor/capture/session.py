"""Capturing graph breaks: the only module that talks to Dynamo internals.

``torch._dynamo.explain`` cannot be used as is: it calls the function directly (so it would
trace a block *without* the FSDP/EP hooks that sit outside the compiled region in training, or
with them inside when they are not), it resets Dynamo, it suppresses the user stacks of the
``graph_breaks`` log, and it reports 0 graphs / -1 breaks for a break inside an AC region.
So gbdoctor does what explain does internally, at the place where training compiles: every
compiled region gets a graph-accumulating backend (graph and op counts, as explain's), and every
break Dynamo logs is recorded from ``InstructionTranslatorBase.log_graph_break`` (gb_type,
hop, real user stack) with the ``graph_breaks`` log stream as a fallback, plus
``counters["graph_break"]`` as a cross-check for breaks that reach neither.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch._dynamo
import torch.nn as nn

from gbdoctor import causes
from gbdoctor.capture import cudagraphs
from gbdoctor.capture.break_log import GB_LOGGER as _GB_LOGGER
from gbdoctor.capture.locate import user_function
from gbdoctor.causes import is_torch_file
from gbdoctor.records import Location, RawBreak

_CAPTURE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__)) + os.sep


def _between_dynamo_and_caller(path: str) -> bool:
    """Code between Dynamo and the caller of the frame it compiles: torch, gbdoctor's capture
    (the interception), the standard library (not the packages installed beneath it)."""
    path = os.path.abspath(path)
    if causes.is_torch_file(path) or path.startswith(_CAPTURE_DIR):
        return True
    return path.startswith(_STDLIB_DIR) and "-packages" + os.sep not in path


def _caller_outside_torch() -> Location | None:
    """The innermost frame of the live Python stack that is neither torch, this package nor the
    standard library: the code that called the frame Dynamo is compiling.

    Dynamo's user stack starts at the frame it compiles. When that frame is torch's own, the
    stack has no user frame: on torch 2.11 an EP hook's ``ep_mesh.get_group()`` (run eagerly
    after its frame broke) compiles ``DeviceMesh.get_group`` as a frame of its own, which breaks
    in ``_get_pg_from_name`` (``dict.get``); its caller, the hook's line, is where to look
    (issue 34). Only such all-torch stacks get the caller."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _between_dynamo_and_caller(frame.f_code.co_filename):
            code = frame.f_code
            return Location(file=code.co_filename, line=frame.f_lineno, function=code.co_name)
        frame = frame.f_back
    return None


CodeKey = tuple[str, int, str]
"""(file, first line, name) of a code object: how Dynamo's compilation metrics name a frame."""


@dataclass
class RawCapture:
    """What one capture saw, before classification."""

    graphs: dict[str, list[int]] = field(default_factory=dict)
    """Region FQN -> op count of each graph Dynamo produced for it."""
    entered: set[str] = field(default_factory=set)
    """Regions that were called during the capture."""
    ran_compiled: set[str] = field(default_factory=set)
    """Regions in which compiled code ran: their own graphs, or a graph Dynamo's cache reused
    from another region with the same code (two RMSNorm children share one compiled forward
    when every guard passes: no new graph, but the region did not run eagerly)."""
    breaks: list[tuple[RawBreak, str]] = field(default_factory=list)
    """(break, region fqn) pairs, one per break Dynamo logged."""
    frame_skips: list[tuple[RawBreak, str]] = field(default_factory=list)
    seen: list[tuple[Any, tuple[Location, ...], int]] = field(default_factory=list)
    """(gb_type + instance, user frames, index in ``breaks``) of every statement recorded."""
    break_frames: dict[int, set[CodeKey]] = field(default_factory=dict)
    """Index in ``breaks`` -> the frames (code objects) Dynamo was compiling when it met it."""
    counter_types: dict[str, int] = field(default_factory=dict)
    """gb_type -> count from ``counters["graph_break"]`` (cross-check)."""
    cudagraph_findings: list[Any] = field(default_factory=list)
    """CUDA-graph readiness findings of every graph compiled during the capture."""
    aten_graphs: int = 0
    """AOTAutograd forward + backward graphs compiled during the capture."""
    aten_graphs_by_region: dict[str, int] = field(default_factory=dict)
    """The same per region FQN (a whole-model capture splits them per block: DeepSpeed)."""
    compiled: set[CodeKey] = field(default_factory=set)
    """Frames Dynamo compiled (a scratch capture's re-trace, ``CaptureSession.scratch``)."""
    error: str | None = None
    error_traceback: str | None = None


class _LogRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class CaptureSession:
    """Recording backend + break interception for one scan (one process).

    ``compile_fn`` is handed to ``setup.apply_setup`` so the setup compiles regions exactly
    where training would, but with a backend that records instead of optimizing. Scans always
    compile with ``fullgraph=False``: a break in a region planned as fullgraph is reported (it
    would be an error in training) instead of stopping the scan.
    """

    def __init__(self) -> None:
        self._current: RawCapture | None = None
        self._region_stack: list[str] = []
        self.locator: Any = None
        """Callable(frames, root) -> (module fqn, component); set by the scanner."""
        self._paused = False
        self._log_records: _LogRecords | None = None
        self.root = ""
        """FQN of the block being captured (frames are attributed inside it)."""
        self.module_names: dict[int, str] | None = None
        """id(module) -> FQN. When set (whole-model captures: DeepSpeed), a break is attributed
        to the module instance whose frame Dynamo was tracing (a real object in the frame's
        locals), and breaks at the same code in different instances stay apart: every layer
        shares its class's code, so frames alone cannot tell them apart."""
        self.graph_checks: list[GraphCheck] = []
        """More CUDA-graph readiness checks of every ATen graph, beside inductor's
        (``capture/cudagraphs.py``): a framework's own CUDA-graph wrapper sets one."""

    # ------------------------------------------------------------------ compile side
    def recording_backend(self, fqn: str) -> Any:
        """A Dynamo backend that counts each graph of region ``fqn``, then runs aot_eager (for
        frameworks that compile regions themselves, without region markers: DeepSpeed)."""
        return self._backend(lambda: fqn)

    @functools.cached_property
    def _region_backend(self) -> Any:
        """One recording backend for every region gbdoctor compiles itself, the region read
        from the marker around the compiled call. One object, as training passes one backend:
        Dynamo guards on the backend (BACKEND_MATCH), so per-region backends would make each
        layer's code look foreign to the next, and the dedupe proof would fail on that alone."""
        return self._backend(self._region)

    def _backend(self, region_of: Any) -> Any:
        session = self
        # aot_eager, not the graph's own forward: AOTAutograd functionalizes checkpoint regions
        # and in-place buffer updates the way a real backend does, so backward behaves as in
        # training (a plain eager replay of a checkpoint HOP double-applies in-place updates).
        # Called with recording forward/backward compilers: those graphs are what inductor would
        # compile, so they are where CUDA-graph readiness is read (capture/cudagraphs.py).
        from torch._dynamo.backends.debugging import aot_eager as inner_backend

        def recording_backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            current = session._current
            # Paused: the recompile probe's steps keep the counts those of the capture step.
            if current is None or session._paused:
                return inner_backend(gm, example_inputs)
            fqn = region_of()
            graphs = current.graphs.setdefault(fqn, [])
            graphs.append(count_ops(gm))
            index = len(graphs) - 1
            current.cudagraph_findings += cudagraphs.dynamo_graph_findings(
                gm, cudagraphs.GraphInfo(region=fqn, phase="dynamo", index=index)
            )
            names = tuple(n.name for n in gm.graph.nodes if n.op == "placeholder")
            compiled = inner_backend(
                gm,
                example_inputs,
                fw_compiler=_recording_compiler(
                    current, fqn, index, "forward", names, session.graph_checks
                ),
                bw_compiler=_recording_compiler(
                    current, fqn, index, "backward", checks=session.graph_checks
                ),
            )

            @functools.wraps(compiled)  # keeps ``_boxed_call``: Dynamo calls it the same way
            def run(*args: Any, **kwargs: Any) -> Any:
                target = session._current
                if target is not None and not session._paused:
                    target.ran_compiled.add(region_of())
                return compiled(*args, **kwargs)

            return run

        return recording_backend

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

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.in_region(fqn):
                return compiled(*args, **kwargs)

        module._compiled_call_impl = call

    def compile_fn(self, module: Any, fqn: str, fullgraph: bool) -> Any:
        if not isinstance(module, nn.Module):
            return self.compile_function(module, fqn, fullgraph)
        session = self
        compiled = torch.compile(module, backend=self._region_backend, fullgraph=False)

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
        import torch._logging
        from torch._dynamo import symbolic_convert
        from torch._dynamo.utils import counters

        result = RawCapture()
        torch._dynamo.reset()
        counters.clear()
        original = symbolic_convert.InstructionTranslatorBase.log_graph_break
        session = self

        def intercept(tracer: Any, code_options: Any, reason: str, exc: Any) -> None:
            target = session._current
            if not getattr(exc, "logged", False) and not session._paused and target is not None:
                try:
                    session._record(target, reason, exc, tracer)
                except Exception:  # noqa: BLE001 - never let bookkeeping break the traced code
                    logging.getLogger(__name__).debug("could not record a break", exc_info=True)
            return original(tracer, code_options, reason, exc)

        handler = _LogRecords()
        self._log_records = handler
        metrics_limit = _start_compile_metrics()
        gb_logger = logging.getLogger(_GB_LOGGER)
        old_propagate = gb_logger.propagate
        torch._logging.set_logs(graph_breaks=True)
        gb_logger.addHandler(handler)
        gb_logger.propagate = False  # keep the user's stderr clean
        symbolic_convert.InstructionTranslatorBase.log_graph_break = intercept
        self._current = result
        self._region_stack.clear()
        try:
            yield result
        finally:
            self._current = None
            symbolic_convert.InstructionTranslatorBase.log_graph_break = original
            gb_logger.removeHandler(handler)
            gb_logger.propagate = old_propagate
            torch._logging.set_logs()
            compiled = _end_compile_metrics(metrics_limit)
            if result.error is None:  # a block that did not trace reports its error instead
                self._record_abandoned_frames(result, compiled)
            for key, n in counters.get("graph_break", {}).items():
                gb_type = causes.parse_reason(key).gb_type
                result.counter_types[gb_type] = result.counter_types.get(gb_type, 0) + n
            if not result.breaks and not result.frame_skips:
                # Interception unavailable (other torch versions): fall back to the log text.
                for message in handler.messages:
                    self._record_from_log(result, message)
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
            self._record_abandoned_frames(scratch, compiled)

    def _record_abandoned_frames(self, result: RawCapture, metrics: list[Any]) -> None:
        """A frame skip for every frame Dynamo gave up on: its compile ended in an exception
        (``fail_type``) and left no compiled code, so the whole frame ran eagerly, whatever the
        construct (an import that fails, a context manager or generator Dynamo cannot trace, a
        break inside a loop). Read from Dynamo's compilation metrics, one per compiled frame."""
        for metric in metrics:
            if not getattr(metric, "fail_type", None) or not getattr(metric, "co_filename", None):
                continue
            function = user_function(metric.co_name or "")
            frame = Location(
                file=metric.co_filename, line=metric.co_firstlineno or 0, function=function
            )
            file = metric.fail_user_frame_filename or frame.file
            line = metric.fail_user_frame_lineno or frame.line
            same_code = file == frame.file and line >= frame.line
            statement = Location(file=file, line=line, function=function if same_code else "")
            reason = causes.parse_reason(metric.fail_reason or metric.fail_type)
            detail = (
                f"Dynamo abandoned frame {function} ({frame.file} line {frame.line}) and ran it "
                f"eagerly: {reason.gb_type}"
            )
            raw = self._raw(reason, metric.fail_reason or "", (frame, statement), None)
            result.frame_skips.append((replace(raw, context=detail), self.root))

    def _region(self) -> str:
        return self._region_stack[-1] if self._region_stack else ""

    def _raw(
        self,
        reason: Any,
        message: str,
        frames: tuple[Location, ...],
        hop: str | None,
        instance: str | None = None,
    ) -> RawBreak:
        module, component = (
            self.locator(frames, self.root) if self.locator else (self.root, "model")
        )
        if instance is not None:
            module = instance
        called = causes.called_function(reason.context)
        hook = self.locator.library_hook(called) if called and self.locator is not None else None
        if hook is not None:
            # The break is the call of a disabled library hook (ZeRO's parameter gather): the
            # hook is where it happens and its installer is the component. The frames end at
            # the call site in torch's module.py, so the hook's definition is appended.
            definition, component = hook
            frames = (*frames, definition)
        routing = self.locator.routing_state(frames, module) if self.locator else False
        hop = hop or reason.hop
        return RawBreak(
            gb_type=reason.gb_type,
            message=message,
            frames=frames,
            module=module,
            component=component,
            in_checkpoint=bool(hop and "checkpoint" in hop),
            hop=hop,
            explanation=reason.explanation,
            hints=tuple(reason.hints),
            context=reason.context,
            routing_state=routing,
        )

    def _record(self, result: RawCapture, reason: str, exc: Any, tracer: Any = None) -> None:
        stack = getattr(exc, "real_stack", None) or []
        frames = tuple(
            Location(file=f.filename, line=f.lineno or 0, function=user_function(f.name))
            for f in stack
        )
        if frames and all(causes.is_torch_file(f.file) for f in frames):
            caller = _caller_outside_torch()
            frames = (caller, *frames) if caller is not None else frames
        parts = causes.parse_reasons(reason)
        if len(parts) == 1 and causes.is_frame_skip(parts[0].gb_type):
            # "graph break in loop" alone: Dynamo chained the break that made it give up on the
            # frame (a data-dependent op inside the loop, ...) as the exception's cause. Report
            # that one as the break, and the skip as a frame_skipped event.
            underlying = _underlying_reason(exc)
            if underlying:
                reason = causes.chain_reasons(underlying, reason)
        instance = self._instance(tracer) if self.module_names is not None else None
        index = self._add(
            result, reason, frames, getattr(exc, "_hop_name", None), self._region(), instance
        )
        code = _compiled_code(tracer)
        if code is not None:
            result.break_frames.setdefault(index, set()).add(code)

    def _instance(self, tracer: Any) -> str | None:
        """FQN of the module whose frame Dynamo was tracing: the first module of the model among
        the frame's real locals (``self`` of ``_call_impl``/``forward``, the ``module`` argument
        of a hook), looking one level into tuples (a decorator's ``*args``)."""
        names = self.module_names or {}
        f_locals = getattr(tracer, "f_locals", None) or {}
        for value in f_locals.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, nn.Module) and id(item) in names:
                    return names[id(item)]
        return None

    def _add(
        self,
        result: RawCapture,
        reason: str,
        frames: tuple[Location, ...],
        hop: str | None,
        region: str,
        instance: str | None = None,
    ) -> int:
        """Record one break (unless it is a statement already recorded); its index in
        ``result.breaks``."""
        parts = causes.parse_reasons(reason)
        skips_frame = len(parts) > 1 or causes.is_frame_skip(parts[0].gb_type)
        key = (parts[0].gb_type, instance)
        statement = user_frames(frames)
        # One statement is one break, whatever frames Dynamo meets it in: again when it restarts
        # analysis (the same stack); once more when it traces the inner function as a frame of
        # its own (a custom autograd.Function's forward, traced first inside its HOP, then
        # alone; a helper after a break in its caller): then the user frames of one stack end
        # with those of the other. The longer stack is kept (it says which module called).
        for i, (seen_key, seen_frames, index) in enumerate(result.seen):
            if seen_key != key:
                continue
            if _is_suffix(statement, seen_frames):
                break
            if _is_suffix(seen_frames, statement):
                result.seen[i] = (key, statement, index)
                result.breaks[index] = (self._raw(parts[0], reason, frames, hop, instance), region)
                break
        else:
            index = len(result.breaks)
            result.seen.append((key, statement, index))
            result.breaks.append((self._raw(parts[0], reason, frames, hop, instance), region))
        # "Failed to handle graph break gracefully ... another graph break occurred": the first
        # part is the real break, the last one says the whole frame was skipped (GB7000).
        if skips_frame:
            result.frame_skips.append((self._raw(parts[-1], reason, frames, hop, instance), region))
        return index

    def _record_from_log(self, result: RawCapture, message: str) -> None:
        parsed = causes.parse_graph_break_log(message)
        if parsed is not None:
            reason, frames = parsed
            self._add(result, reason, frames, None, "")


def code_key(file: str, first_line: int, name: str) -> CodeKey:
    return (file, first_line, name)


def _compiled_code(tracer: Any) -> CodeKey | None:
    """The frame Dynamo was compiling (the root of the inlining tracers) when it met a break."""
    root = getattr(getattr(tracer, "output", None), "root_tx", None) or tracer
    code = getattr(root, "f_code", None)
    if code is None:
        return None
    return code_key(code.co_filename, code.co_firstlineno, code.co_name)


def compiled_frames(metrics: list[Any]) -> set[CodeKey]:
    """Every frame Dynamo compiled, by its compilation metrics."""
    return {
        code_key(m.co_filename, m.co_firstlineno or 0, m.co_name or "")
        for m in metrics
        if getattr(m, "co_filename", None)
    }


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


def _underlying_reason(exc: BaseException) -> str:
    """The message of the innermost exception chained under a frame-skip ``Unsupported``."""
    seen: set[int] = {id(exc)}
    inner = exc.__cause__ or exc.__context__
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        text = str(inner).strip()
        if text and not causes.is_frame_skip(causes.parse_reason(text).gb_type):
            return text
        inner = inner.__cause__ or inner.__context__
    return ""


GraphCheck = Callable[
    [torch.fx.GraphModule, Sequence[Any], Sequence[int], "cudagraphs.GraphInfo"],
    list[Any],
]
"""(ATen graph, example inputs, static input indices, which graph) -> readiness findings."""


def _recording_compiler(
    current: RawCapture,
    fqn: str,
    index: int,
    phase: str,
    input_names: tuple[str, ...] = (),
    checks: Sequence[GraphCheck] = (),
) -> Any:
    """An AOTAutograd forward/backward compiler that reads the graph for CUDA-graph readiness
    and then runs it as aot_eager does. Static inputs as inductor's cudagraph path takes them:
    forward, AOTAutograd's ``static_input_indices`` (parameters, buffers); backward, every input
    before the tangents (saved by a cudagraphed forward)."""
    from functorch.compile import make_boxed_func
    from torch._guards import TracingContext

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        if phase == "forward":
            context = TracingContext.try_get()
            metadata = getattr(context, "fw_metadata", None) if context is not None else None
            static = list(getattr(metadata, "static_input_indices", None) or [])
        else:
            static = list(range(_count_fixed_backward_inputs(gm)))
        try:
            info = cudagraphs.GraphInfo(region=fqn, phase=phase, index=index)
            found = cudagraphs.aten_graph_findings(gm, example_inputs, static, info, input_names)
            seen = {(f.node, f.kind, f.effect) for f in found}
            for check in checks:  # a finding inductor's check made already is not repeated
                found += [
                    f
                    for f in check(gm, example_inputs, static, info)
                    if (f.node, f.kind, f.effect) not in seen
                ]
            current.cudagraph_findings += found
            current.aten_graphs += 1
            current.aten_graphs_by_region[fqn] = current.aten_graphs_by_region.get(fqn, 0) + 1
        except Exception:  # noqa: BLE001 - readiness is advisory; never fail the capture for it
            logging.getLogger(__name__).debug("could not analyse a %s graph", phase, exc_info=True)
        return make_boxed_func(gm.forward)

    return compile_graph


def _count_fixed_backward_inputs(gm: torch.fx.GraphModule) -> int:
    """Inputs of a backward graph before its first tangent (inductor's ``count_tangents``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        if "tangents" in node.name:
            return i
    return len(placeholders)


def user_frames(frames: tuple[Location, ...]) -> tuple[Location, ...]:
    """The frames of a stack outside PyTorch (torch's own frames between two user frames depend
    on how Dynamo reached the statement: ``autograd.Function``'s HOP wrapper, ``_call_impl``)."""
    user = tuple(f for f in frames if not is_torch_file(f.file))
    return user or frames


def _is_suffix(short: tuple[Location, ...], long: tuple[Location, ...]) -> bool:
    return len(short) <= len(long) and tuple(long[len(long) - len(short) :]) == tuple(short)


def count_ops(gm: torch.fx.GraphModule) -> int:
    """``call_function`` nodes, including those inside higher-order-op bodies (a checkpoint
    region is one HOP node in the outer graph; its ops live in a nested GraphModule)."""
    total = 0
    for sub in gm.modules():
        if isinstance(sub, torch.fx.GraphModule):
            total += sum(1 for n in sub.graph.nodes if n.op == "call_function")
    return total


@contextlib.contextmanager
def strict_breaks() -> Iterator[None]:
    """Dynamo's strict check: every graph break raises (``fullgraph=True`` is not a zero-break
    test: it silently enables scalar and dynamic-shape capture)."""
    with torch._dynamo.error_on_graph_break(True):
        yield
