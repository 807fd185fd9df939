"""Dedupe: blocks with the same structure are captured once; the others share that capture.

A block's structure is everything that can change what Dynamo sees in it (module classes,
local parameter shapes, buffers, hooks, wrappers, compiled regions, input shapes); blocks are
grouped by its hash, and distinct structures sharing a label get numbered kinds (``moe#2``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn as nn

from gbdoctor.capture import within
from gbdoctor.capture.locate import HOOK_DICTS
from gbdoctor.records import BlockKind, BlockReport
from gbdoctor.setup.apply import Setup


def _rebase_fqn(name: str, old: str, new: str) -> str:
    return new + name[len(old) :] if old and within(name, old) else name


def rebase(report: BlockReport, old: str, new: str) -> BlockReport:
    """A representative's capture, re-addressed to another layer that shares it."""
    re_fqn = lambda name: _rebase_fqn(name, old, new)  # noqa: E731
    return replace(
        report,
        fqn=new,
        breaks=tuple(
            replace(b, module=re_fqn(b.module), region=re_fqn(b.region)) for b in report.breaks
        ),
        events=tuple(replace(e, module=re_fqn(e.module)) for e in report.events),
        regions=tuple(re_fqn(r) for r in report.regions),
        fullgraph_regions=tuple(re_fqn(r) for r in report.fullgraph_regions),
        region_ops=tuple((re_fqn(r), n) for r, n in report.region_ops),
        cudagraphs=None
        if report.cudagraphs is None
        else replace(
            report.cudagraphs,
            findings=tuple(replace(f, region=re_fqn(f.region)) for f in report.cudagraphs.findings),
        ),
    )


def _shape_sig(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return ("T", tuple(obj.shape), str(obj.dtype), obj.requires_grad)
    if isinstance(obj, (tuple, list)):
        return tuple(_shape_sig(x) for x in obj)
    if isinstance(obj, dict):
        return tuple(sorted((k, _shape_sig(v)) for k, v in obj.items()))
    return type(obj).__name__


def structure_signature(slot: Any, inputs: Any) -> str:
    """Hash of everything that can change what Dynamo sees in a block: module classes and
    names, local parameter shapes/dtypes, buffers, hooks, wrappers, compiled regions, inputs."""
    rel = lambda regions: tuple(r[len(slot.fqn) :] for r in regions)  # noqa: E731
    items: list[Any] = [
        slot.kind,
        slot.ac_wrapped,
        rel(slot.regions),
        rel(slot.fullgraph_regions),
        _shape_sig(inputs),
    ]
    for name, module in slot.outer.named_modules():
        params = tuple(
            (n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters(recurse=False)
        )
        buffers = tuple(
            (n, tuple(b.shape), str(b.dtype)) for n, b in module.named_buffers(recurse=False)
        )
        hooks = tuple(len(getattr(module, attr, {})) for _, attr in HOOK_DICTS)
        items.append((name, type(module).__qualname__, params, buffers, hooks))
    return hashlib.sha256(repr(items).encode()).hexdigest()[:16]


def group_blocks(setup: Setup, store: dict[str, Any]) -> list[list[str]]:
    """Blocks grouped by structural signature, in layer order; the first member is captured."""
    groups: dict[str, list[str]] = {}
    for slot in setup.blocks:
        groups.setdefault(structure_signature(slot, store.get(slot.fqn)), []).append(slot.fqn)
    return list(groups.values())


def kind_labels(setup: Setup, groups: list[list[str]]) -> dict[str, str]:
    """Representative fqn -> kind label; distinct structures sharing a label get ``#2``, ``#3``."""
    by_fqn = {s.fqn: s for s in setup.blocks}
    seen: dict[str, int] = {}
    labels = {}
    for members in groups:
        kind = BlockKind.parse(by_fqn[members[0]].kind)
        seen[kind.label] = seen.get(kind.label, 0) + 1
        labels[members[0]] = str(replace(kind, variant=seen[kind.label]))
    return labels


_NO_ATTR = object()


def shortcut_repeated_blocks(setup: Setup) -> Callable[[], None]:
    """For the warm-up step: a block that repeats one which already ran in this forward pass -
    the same structure (``structure_signature`` without inputs) and inputs of the same shapes -
    returns that block's output instead of computing its own. Returns the undo.

    Only one representative per kind is captured, with the inputs the first layer of the kind
    received, so computing the repeats only cost time: the warm-up through every layer was most
    of a deep model's scan. What still runs for every block is everything around its
    ``forward``: the input-recording pre-hook and FSDP's pre/post-forward hooks (all-gather,
    reshard, backward hooks), so collectives and FSDP state stay as in a full step. Later layers
    receive the shortcut output (an earlier layer's values, the same shapes).
    """
    signatures = {slot.fqn: structure_signature(slot, None) for slot in setup.blocks}
    ran: dict[tuple[str, Any], Any] = {}
    patched: list[tuple[nn.Module, Any]] = []
    for slot in setup.blocks:
        outer = slot.outer
        patched.append((outer, outer.__dict__.get("forward", _NO_ATTR)))

        def forward(
            *args: Any, _inner: Any = outer.forward, _sig: str = signatures[slot.fqn], **kwargs: Any
        ) -> Any:
            key = (_sig, _shape_sig((args, kwargs)))
            if key not in ran:
                ran[key] = _inner(*args, **kwargs)
            return ran[key]

        outer.forward = forward
    new_pass = setup.model.register_forward_pre_hook(lambda *_: ran.clear())

    def restore() -> None:
        new_pass.remove()
        ran.clear()
        for outer, previous in patched:
            if previous is _NO_ATTR:
                del outer.forward
            else:
                outer.forward = previous

    return restore
