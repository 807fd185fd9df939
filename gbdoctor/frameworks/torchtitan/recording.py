"""Where torchtitan compiles: while its ``parallelize_fn`` runs, ``nn.Module.compile`` and
``torch.compile`` are gbdoctor's recording compile (a capture session's), so a region is compiled
exactly where torchtitan compiles it, with a backend that records; then each block found by
structure gets the regions inside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn

from gbdoctor.setup.apply import BlockSlot


def _is_checkpoint_wrapper(module: nn.Module) -> bool:
    return hasattr(module, "_checkpoint_wrapped_module")


def _unwrap(module: nn.Module) -> nn.Module:
    while True:
        inner = getattr(module, "_checkpoint_wrapped_module", None) or getattr(
            module, "_orig_mod", None
        )
        if inner is None:
            return module
        module = inner


class RecordingCompile:
    """``nn.Module.compile`` / ``torch.compile`` as gbdoctor's recording compile while
    torchtitan's ``parallelize_fn`` runs; records every region it compiled."""

    def __init__(self, model: nn.Module, session: Any) -> None:
        self.model = model
        self.session = session
        self.compiled: dict[str, bool] = {}
        """Region FQN -> fullgraph, the latest compile of each."""
        self.in_place: dict[str, nn.Module] = {}

    @property
    def regions(self) -> list[tuple[str, bool]]:
        """Compiled regions, less in-place compiles undone since (a plan's eager layers, set
        by gbdoctor's strategy or by an emitted ``parallelize`` wrapper)."""
        return [
            (fqn, fullgraph)
            for fqn, fullgraph in self.compiled.items()
            if fqn not in self.in_place or self.in_place[fqn]._compiled_call_impl is not None
        ]

    def _fqn(self, obj: Any) -> str:
        for name, module in self.model.named_modules():
            if module is obj:
                return ".".join(
                    p
                    for p in name.split(".")
                    if p not in ("_checkpoint_wrapped_module", "_orig_mod")
                )
        return getattr(obj, "__qualname__", type(obj).__name__)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        original_module_compile = nn.Module.compile
        original_compile = torch.compile
        recorder = self

        def module_compile(module: nn.Module, *args: Any, **kwargs: Any) -> None:
            fqn = recorder._fqn(module)
            fullgraph = bool(kwargs.get("fullgraph", False))
            recorder.compiled[fqn] = fullgraph
            recorder.in_place[fqn] = module
            if recorder.session is None:
                return original_module_compile(module, *args, **kwargs)
            with recorder.originals():  # the session calls the real ones
                recorder.session.compile_in_place(module, fqn, fullgraph)

        def compile_(target: Any = None, **kwargs: Any) -> Any:
            if target is None:  # decorator form
                return lambda fn: compile_(fn, **kwargs)
            fqn = recorder._fqn(target)
            fullgraph = bool(kwargs.get("fullgraph", False))
            recorder.compiled[fqn] = fullgraph
            if recorder.session is None:
                return original_compile(target, **kwargs)
            with recorder.originals():
                return recorder.session.compile_fn(target, fqn, fullgraph)

        self._originals = (original_module_compile, original_compile)
        self._recording = (module_compile, compile_)
        self._swap(self._recording)
        try:
            yield
        finally:
            self._swap(self._originals)

    @staticmethod
    def _swap(pair: tuple[Any, Any]) -> None:
        nn.Module.compile, torch.compile = pair  # type: ignore[method-assign,assignment]

    @contextlib.contextmanager
    def originals(self) -> Iterator[None]:
        self._swap(self._originals)
        try:
            yield
        finally:
            self._swap(self._recording)


def block_slots(
    model: nn.Module, regions: list[tuple[str, bool]], ac_label: str
) -> list[BlockSlot]:
    """Blocks and MoE layers found by structure (``models.structure``), as for any model."""
    from gbdoctor.models.structure import find_blocks, find_moe_layers, hidden_size

    hidden = hidden_size(model)
    out = []
    for fqn, key, outer in find_blocks(model).items():
        inner = _unwrap(outer)
        mine = [(r, fg) for r, fg in regions if r == fqn or r.startswith(fqn + ".")]
        ac = (
            ("",)
            if _is_checkpoint_wrapper(outer)
            else tuple(
                name.replace("._checkpoint_wrapped_module", "")
                for name, m in outer.named_modules()
                if name and _is_checkpoint_wrapper(m)
            )
        )
        moe = bool(find_moe_layers(inner, hidden))
        kind = ("moe" if moe else "dense") + (f"+{ac_label}" if ac else "")
        out.append(
            BlockSlot(
                fqn=fqn,
                key=str(key),
                block=inner,
                outer=outer,
                is_moe=moe,
                kind=kind,
                ac_wrapped=ac,
                regions=tuple(r for r, _ in mine),
                fullgraph_regions=tuple(r for r, fg in mine if fg),
            )
        )
    return out
