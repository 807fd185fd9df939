"""Turning what Dynamo reports about a graph break into ``RawBreak`` records: the exception and
its real user stack met in ``log_graph_break``, a ``graph_breaks`` log message (the fallback),
or a frame Dynamo abandoned (its compilation metrics), each attributed to a module and the setup
component that installed the code, one record per statement."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from types import FrameType
from typing import Any

import torch.nn as nn

from gbdoctor import causes
from gbdoctor.capture.locate import user_function
from gbdoctor.capture.raw_capture import CodeKey, RawCapture, code_key
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
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if not _between_dynamo_and_caller(frame.f_code.co_filename):
            code = frame.f_code
            return Location(file=code.co_filename, line=frame.f_lineno, function=code.co_name)
        frame = frame.f_back
    return None


class BreakRecorder:
    """Records breaks into a ``RawCapture``, attributing each to a module (``CaptureSession``
    is one; the scanner sets the attribution below)."""

    def __init__(self) -> None:
        self.locator: Any = None
        """Callable(frames, root) -> (module fqn, component); set by the scanner."""
        self.root = ""
        """FQN of the block being captured (frames are attributed inside it)."""
        self.module_names: dict[int, str] | None = None
        """id(module) -> FQN. When set (whole-model captures: DeepSpeed), a break is attributed
        to the module instance whose frame Dynamo was tracing (a real object in the frame's
        locals), and breaks at the same code in different instances stay apart: every layer
        shares its class's code, so frames alone cannot tell them apart."""

    def record_abandoned_frames(self, result: RawCapture, metrics: list[Any]) -> None:
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

    def record(
        self, result: RawCapture, reason: str, exc: Any, tracer: Any = None, region: str = ""
    ) -> None:
        """One break Dynamo met (``log_graph_break``'s reason and exception), in ``region``."""
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
        index = self._add(result, reason, frames, getattr(exc, "_hop_name", None), region, instance)
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

    def record_from_log(self, result: RawCapture, message: str) -> None:
        """One break read from a ``graph_breaks`` log message (no region, no tracer)."""
        parsed = causes.parse_graph_break_log(message)
        if parsed is not None:
            reason, frames = parsed
            self._add(result, reason, frames, None, "")


def _compiled_code(tracer: Any) -> CodeKey | None:
    """The frame Dynamo was compiling (the root of the inlining tracers) when it met a break."""
    root = getattr(getattr(tracer, "output", None), "root_tx", None) or tracer
    code = getattr(root, "f_code", None)
    if code is None:
        return None
    return code_key(code.co_filename, code.co_firstlineno, code.co_name)


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


def user_frames(frames: tuple[Location, ...]) -> tuple[Location, ...]:
    """The frames of a stack outside PyTorch (torch's own frames between two user frames depend
    on how Dynamo reached the statement: ``autograd.Function``'s HOP wrapper, ``_call_impl``)."""
    user = tuple(f for f in frames if not is_torch_file(f.file))
    return user or frames


def _is_suffix(short: tuple[Location, ...], long: tuple[Location, ...]) -> bool:
    return len(short) <= len(long) and tuple(long[len(long) - len(short) :]) == tuple(short)
