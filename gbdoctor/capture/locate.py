"""Map code locations to the model: which module a frame belongs to, who installed a hook.

A break's user stack is a list of (file, line, function). To say *which module* broke and
*which setup component* put that code there (an EP dispatch hook, an FSDP hook, the load
balancer, a user's hook, or the model itself), frames are matched against the code objects of
every module's ``forward`` and of every hook found on the modules.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import linecache
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from gbdoctor.causes import is_torch_file
from gbdoctor.causes.generated_names import resume_names, user_function
from gbdoctor.models.custom import portable_module_names
from gbdoctor.models.structure import find_moe_layers, hidden_size
from gbdoctor.records import Component, Location
from gbdoctor.usercode import stdlib_file

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FSDP_DIR = os.path.join(_TORCH_DIR, "distributed", "fsdp") + os.sep
_TP_CODE = (
    os.path.join(_TORCH_DIR, "distributed", "tensor", "parallel") + os.sep,
    os.path.join(_TORCH_DIR, "distributed", "tensor", "_redistribute.py"),
)
"""TP styles' hooks and DTensor redistribution: code the ``tp`` component put in the model."""


def _package_dir(name: str) -> str | None:
    """Directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.abspath(list(spec.submodule_search_locations)[0]) + os.sep


_DEEPSPEED_DIR = _package_dir("deepspeed")
_NVTX_FILE = os.path.join(_DEEPSPEED_DIR, "utils", "nvtx.py") if _DEEPSPEED_DIR else None
_LIBRARY_COMPONENTS: tuple[tuple[str, str], ...] = tuple(
    (path, component)
    for path, component in (
        (_FSDP_DIR, Component.FSDP),
        *((path, Component.TP) for path in _TP_CODE),
        # ZeRO's parameter gather/release and pre-backward hooks (stage 3) and its coordinator.
        (
            os.path.join(_DEEPSPEED_DIR, "runtime", "zero") + os.sep if _DEEPSPEED_DIR else "",
            Component.ZERO,
        ),
        # After ZeRO's directory (first match wins): the engine's own forward hooks.
        (_DEEPSPEED_DIR or "", Component.DEEPSPEED),
    )
    if path
)
"""Library directories whose code is a setup component of its own (the installer of its hooks)."""


def library_component(path: str) -> str | None:
    """``fsdp``, ``tp``, ``zero`` or ``deepspeed`` for a file of those libraries' code, else None."""
    full = os.path.abspath(path)
    for prefix, component in _LIBRARY_COMPONENTS:
        if full.startswith(prefix):
            return component
    return None


HOOK_DICTS = (
    ("forward_pre", "_forward_pre_hooks"),
    ("forward", "_forward_hooks"),
    ("backward", "_backward_hooks"),
    ("backward_pre", "_backward_pre_hooks"),
)
_WRAPPER_ATTRS = ("_orig_mod", "_checkpoint_wrapped_module")


def clean_fqn(name: str) -> str:
    """Drop wrapper attributes (compile, checkpoint) from a module path."""
    return ".".join(p for p in name.split(".") if p and p not in _WRAPPER_ATTRS)


def portable_path(path: str, root: str | None = None) -> str:
    """Report paths that depend neither on the machine, the virtual environment nor the working
    directory: an installed library's file from ``site-packages/`` on (also when the virtual
    environment lives inside the repository, as CI's ``.venv`` does); else relative to ``root``
    (the spec's repository, ``Spec.root``) when under it, so CI annotations land on the diff;
    else named by module: the path from the outermost package holding it (``copy.py``,
    ``json/decoder.py`` for the standard library, ``model.py`` for a factory file outside the
    repository). Without a root, the working directory stands in (library callers that have no
    spec)."""
    full = os.path.abspath(path)
    marker = os.sep + "site-packages" + os.sep
    if marker in full:
        return full.split(marker, 1)[1].replace(os.sep, "/")
    base = os.path.abspath(root if root else os.getcwd()) + os.sep
    if full.startswith(base):
        return os.path.relpath(full, base).replace(os.sep, "/")
    if not os.path.isabs(path) or not os.path.exists(full):
        return path.replace(os.sep, "/")  # not a file of this machine (``<string>``, generated)
    return _module_path(full)


def _module_path(full: str) -> str:
    """``full`` from the directory above its outermost package (``__init__.py`` directories)."""
    parts = [os.path.basename(full)]
    directory = os.path.dirname(full)
    while os.path.exists(os.path.join(directory, "__init__.py")):
        parts.append(os.path.basename(directory))
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return "/".join(reversed(parts))


_ABSOLUTE_PATH = re.compile(r"(?<![\w./~-])(/[\w.+@~-]+(?:/[\w.+@~-]+)+)")
"""An absolute POSIX path inside free text (Dynamo's messages quote files and directories)."""


def portable_text(text: str, root: str | None = None) -> str:
    """``text`` with every absolute path of an existing file or directory made portable
    (:func:`portable_path`): Dynamo's contexts and messages quote them (``skip reason: file
    matches MOD_SKIPLIST (/.../site-packages/torch/_dynamo)``, a frame's file), factory
    modules by their file's name, and Dynamo's resume functions by the user's function."""
    text = portable_module_names(text)
    text = resume_names(text)
    if "/" not in text:
        return text

    def replace(match: re.Match[str]) -> str:
        found = match.group(1)
        return portable_path(found, root) if os.path.exists(found) else found

    return _ABSOLUTE_PATH.sub(replace, text)


def is_library_file(path: str) -> bool:
    """Code the user did not write: PyTorch, an installed package, the standard library."""
    full = os.path.abspath(path)
    return (
        is_torch_file(path)
        or os.sep + "site-packages" + os.sep in full
        or os.sep + "dist-packages" + os.sep in full
        or stdlib_file(full)
    )


_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_MODEL_AND_SETUP_DIRS = tuple(os.path.join(_OWN_DIR, d) + os.sep for d in ("models", "setup"))
"""gbdoctor's package; in it, the bundled models and the training setup's code (EP dispatch, TP
styles), which stand where a user's model and training setup would."""


def _without_harness_callers(frames: tuple[Location, ...]) -> tuple[Location, ...]:
    """``frames`` less the outermost ones in gbdoctor's own harness (scan, run, timeline): the
    caller of the compiled region, the user's training step in a real run, never where a break
    is."""
    for i, frame in enumerate(frames):
        full = os.path.abspath(frame.file)
        if not full.startswith(_OWN_DIR) or full.startswith(_MODEL_AND_SETUP_DIRS):
            return frames[i:]
    return frames


def innermost_user_location(
    frames: tuple[Location, ...], root: str | None = None, component: str = ""
) -> Location | None:
    """Where a human would look: the innermost frame of user code (not PyTorch, an installed
    package or the standard library); else, for a library component (``fsdp``), that library's
    innermost frame; else the innermost frame outside torch; else the innermost. Paths
    portable. For ``zero`` and ``deepspeed`` that library's innermost frame even below user
    code: the hook itself rather than a decorator it is wrapped in (DeepSpeed's nvtx)."""
    frames = _without_harness_callers(frames)
    hook = (
        next((f for f in reversed(frames) if library_component(f.file) == component), None)
        if component
        else None
    )
    user = _innermost_user_index(frames)
    if hook is not None and component in (Component.ZERO, Component.DEEPSPEED):
        chosen: Location | None = hook
    elif user is not None:
        chosen = frames[user]
    else:
        # No model code on the stack: a hook the setup put on the module (FSDP2's pre-forward
        # inside an activation-checkpoint region Accelerate compiled whole) is the place.
        chosen = hook
    chosen = chosen or next(
        (f for f in reversed(frames) if not is_torch_file(f.file)), frames[-1] if frames else None
    )
    return None if chosen is None else _portable(chosen, root)


def library_via(
    frames: tuple[Location, ...], root: str | None = None, component: str = ""
) -> Location | None:
    """The library frame (outside torch) the innermost user frame called into, where the break
    was raised (``copy.py:153`` under ``copy.deepcopy``); None when there is none."""
    frames = _without_harness_callers(frames)
    user = _innermost_user_index(frames)
    if user is None or component in (Component.ZERO, Component.DEEPSPEED):
        return None
    deeper = [f for f in frames[user + 1 :] if not is_torch_file(f.file)]
    return _portable(deeper[-1], root) if deeper else None


def _innermost_user_index(frames: tuple[Location, ...]) -> int | None:
    return next(
        (i for i in reversed(range(len(frames))) if not is_library_file(frames[i].file)), None
    )


def _portable(frame: Location, root: str | None) -> Location:
    return Location(
        file=portable_path(frame.file, root),
        line=frame.line,
        function=user_function(frame.function),
    )


@dataclass(frozen=True)
class CodeSpan:
    file: str
    name: str
    first: int
    last: int

    def contains(self, loc: Location) -> bool:
        # Dynamo names the continuation after a break ``torch_dynamo_resume_in_<fn>_at_<line>``.
        name_ok = loc.function == self.name or loc.function.startswith(
            f"torch_dynamo_resume_in_{self.name}_at_"
        )
        return (
            name_ok
            and os.path.abspath(loc.file) == self.file
            and self.first <= loc.line <= self.last
        )


def _undecorated(fn: Any) -> Any:
    """The function inside a library decorator that does not use ``functools.wraps``:
    DeepSpeed's ``instrument_w_nvtx`` (it wraps ZeRO's hooks) keeps it in the closure cell
    ``func``, so the hook is ZeRO's, not a ``wrapped_fn`` of unknown origin."""
    code = getattr(fn, "__code__", None)
    closure = getattr(fn, "__closure__", None)
    if (
        _NVTX_FILE
        and code is not None
        and closure
        and os.path.abspath(code.co_filename) == _NVTX_FILE
    ):
        cells = dict(zip(code.co_freevars, closure, strict=True))
        if "func" in cells:
            return cells["func"].cell_contents
    return fn


def code_span(fn: Any) -> CodeSpan | None:
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = _undecorated(inspect.unwrap(getattr(fn, "__func__", fn)))
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    lines = [ln for _, _, ln in code.co_lines() if ln is not None] or [code.co_firstlineno]
    return CodeSpan(
        os.path.abspath(code.co_filename), code.co_name, code.co_firstlineno, max(lines)
    )


@dataclass(frozen=True)
class FoundHook:
    module: str
    kind: str
    installer: str
    name: str


def _hook_installer(fn: Any, known: dict[int, str]) -> str:
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    for candidate in (fn, target, getattr(target, "__func__", None)):
        if candidate is not None and id(candidate) in known:
            return known[id(candidate)]
    span = code_span(fn)
    module = getattr(target, "__module__", "") or ""
    if "fsdp" in module or (span is not None and span.file.startswith(_FSDP_DIR)):
        return Component.FSDP
    if "tensor.parallel" in module:
        return Component.TP
    return (library_component(span.file) if span is not None else None) or Component.USER


def _hook_name(fn: Any) -> str:
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    target = _undecorated(target)
    return getattr(target, "__qualname__", type(target).__name__)


def find_hooks(model: nn.Module, installed: Iterable[Any]) -> list[FoundHook]:
    """Every module hook in ``model`` with its installer (``installed``: setup's InstalledHook
    records, whose ``fn`` identity marks gbdoctor's own EP/load-balancing hooks)."""
    # Bound methods are recreated on attribute access, so EP hooks also match by __func__.
    known: dict[int, str] = {}
    for rec in installed:
        known[id(rec.fn)] = rec.installer
        if hasattr(rec.fn, "__func__"):
            known[id(rec.fn.__func__)] = rec.installer
    found = []
    for name, module in model.named_modules():
        for kind, attr in HOOK_DICTS:
            for fn in getattr(module, attr, {}).values():
                installer = _hook_installer(fn, known)
                found.append(
                    FoundHook(
                        module=clean_fqn(name), kind=kind, installer=installer, name=_hook_name(fn)
                    )
                )
    return found


def within(fqn: str, root: str) -> bool:
    """``fqn`` is ``root`` or inside it (an empty root contains everything)."""
    return not root or fqn == root or fqn.startswith(root + ".")


_COUNTING_OP = re.compile(r"\b(bincount|histc|scatter_add_?|index_add_?|scatter_reduce_?)\s*\(")
"""Ops that count tokens per expert (their output is sized by the expert count, not by data)."""
_IN_PLACE = re.compile(
    r"\.(add_|sub_|mul_|copy_|zero_|fill_|index_add_|scatter_add_|scatter_|index_put_|clamp_)\s*\(|"
    r"(\+=|-=|\*=)"
)


def source_line(loc: Location) -> str:
    """The source text at ``loc`` (empty when the file cannot be read)."""
    return linecache.getline(loc.file, loc.line).strip()


class Locator:
    """Frames -> (module FQN, component) for one model as set up."""

    def __init__(self, model: nn.Module, installed: Iterable[Any]) -> None:
        # MoE layers by structure (router + experts) with the buffers each holds: routing
        # statistics live there, whatever they are called.
        self._moe_buffers: dict[str, frozenset[str]] = {}
        for moe in find_moe_layers(model, hidden_size(model)):
            layer = model.get_submodule(moe.path) if moe.path else model
            self._moe_buffers[clean_fqn(moe.path)] = frozenset(
                name.rsplit(".", 1)[-1] for name, _ in layer.named_buffers()
            )
        self._spans: list[tuple[CodeSpan, str]] = []
        seen: set[tuple[int, str]] = set()
        for name, module in model.named_modules():
            fqn = clean_fqn(name)
            span = code_span(type(module).forward)
            if span is not None and not is_torch_file(span.file) and (id(module), fqn) not in seen:
                seen.add((id(module), fqn))
                self._spans.append((span, fqn))
        self._hooks: list[tuple[CodeSpan, str, str]] = []
        installed = list(installed)
        for rec in installed:
            span = code_span(rec.fn)
            if span is not None:
                self._hooks.append((span, rec.module, rec.installer))
        known = {id(r.fn): r.installer for r in installed}
        self._library_hooks: dict[str, tuple[CodeSpan, str]] = {}
        """Qualified name -> (code, installer) of hooks a library (ZeRO) installed."""
        for name, module in model.named_modules():
            for _, attr in HOOK_DICTS:
                for fn in getattr(module, attr, {}).values():
                    span = code_span(fn)
                    if span is None or is_torch_file(span.file) or id(fn) in known:
                        continue
                    component = library_component(span.file)
                    if component is not None:
                        self._library_hooks.setdefault(_hook_name(fn), (span, component))
                    if not any(s == span for s, _, _ in self._hooks):
                        self._hooks.append(
                            (span, clean_fqn(name), component or Component.USER_HOOK)
                        )

    def library_hook(self, qualname: str) -> tuple[Location, str] | None:
        """(definition, installer) of a library hook by its qualified name: a break that *calls*
        a disabled hook (GB0098) has no frame inside it, only its name in Dynamo's context."""
        found = self._library_hooks.get(qualname)
        if found is None:
            return None
        span, component = found
        return Location(file=span.file, line=span.first, function=span.name), component

    def routing_state(self, frames: tuple[Location, ...], module: str) -> bool:
        """Whether the innermost user frame keeps MoE routing statistics: ``module`` sits in an
        MoE layer and the source line counts tokens per expert (bincount, histc, scatter_add,
        index_add) or updates one of that layer's buffers in place."""
        layers = [path for path in self._moe_buffers if within(module, path)]
        user = [f for f in frames if not is_torch_file(f.file)]
        if not layers or not user:
            return False
        line = source_line(user[-1])
        if _COUNTING_OP.search(line):
            return True
        if not _IN_PLACE.search(line):
            return False
        buffers = set().union(*(self._moe_buffers[p] for p in layers))
        return any(re.search(rf"\b{re.escape(b)}\b", line) for b in buffers)

    def __call__(self, frames: tuple[Location, ...], root: str = "") -> tuple[str, str]:
        """``root``: the FQN of the block being captured; frames are matched inside it only
        (every layer shares its class's code, so code alone cannot tell layers apart)."""
        component: str = (
            Component.MODEL if any(not is_torch_file(f.file) for f in frames) else Component.TORCH
        )
        module = root
        for frame in frames:  # outermost first: the last match is the innermost module
            component = library_component(frame.file) or component
            hooks = [
                (owner, installer)
                for span, owner, installer in self._hooks
                if span.contains(frame) and within(owner, root)
            ]
            if hooks:
                # One hook function may serve many modules (every layer's experts): take the
                # one inside the module matched so far.
                inside = [
                    h
                    for h in hooks
                    if not module or h[0] == module or h[0].startswith(module + ".")
                ]
                module, component = min(inside or hooks)
            candidates = [
                fqn for span, fqn in self._spans if span.contains(frame) and within(fqn, root)
            ]
            if candidates:
                # Several instances of one class share a forward: prefer the one inside the
                # module matched so far, and the shallowest such (nearest descendant).
                nested = [
                    c for c in candidates if not module or c == module or c.startswith(module + ".")
                ]
                pool = nested or candidates
                module = min(pool, key=lambda c: (c.count("."), c))
        return module, component
