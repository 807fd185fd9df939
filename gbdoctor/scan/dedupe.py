"""Dedupe: blocks with the same structure are captured once; the others share that capture.

A block's structure is everything that can change what Dynamo sees in it (module classes,
local parameter shapes, buffers, hooks, wrappers, compiled regions, input shapes); blocks are
grouped by its hash, and distinct structures sharing a label get numbered kinds (``moe#2``).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import torch

from gbdoctor.capture import within
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
        hooks = tuple(
            len(getattr(module, a, {}))
            for a in (
                "_forward_pre_hooks",
                "_forward_hooks",
                "_backward_hooks",
                "_backward_pre_hooks",
            )
        )
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
