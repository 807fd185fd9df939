"""Dedupe: a layer shares another's capture only when that is proven; otherwise it is captured.

Candidates come from structure: everything that can change what Dynamo sees in a block (module
classes, local parameter shapes, buffers, hooks, wrappers, compiled regions, input shapes);
blocks are grouped by its hash, and distinct structures sharing a label get numbered kinds
(``moe#2``). Structure is not behaviour: a forward that branches on a plain attribute (its
layer index, a per-layer flag) traces differently in layers that look alike. So the proof: right
after the representative's capture, with Dynamo's caches still holding its compiled code, each
other candidate runs forward and backward under ``set_stance("fail_on_recompile")``. Dynamo then
runs the cached code only where every guard of every frame passes on that layer's module and
inputs, and raises, naming the failed guard, where it would have to trace again. A layer that
runs through is what the representative's capture describes; one that does not is captured
itself (and proves the candidates after it in turn). The proof costs one eager-speed step per
layer (``benchmarks/dedupe_proof.py``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn as nn

from gbdoctor.capture import CaptureSession, RawCapture, within
from gbdoctor.capture.break_records import user_frames
from gbdoctor.capture.locate import HOOK_DICTS
from gbdoctor.capture.raw_capture import CodeKey
from gbdoctor.errors import first_line
from gbdoctor.records import BlockKind, BlockReport, DedupeProof
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


@dataclass(frozen=True)
class Proof:
    """Whether a layer may share the representative's capture, and why (``BlockReport.dedupe``)."""

    method: DedupeProof
    detail: str
    compiled_other_code: bool = False
    """The proof re-traced this layer and it broke differently: Dynamo's caches now hold code
    that is not the representative's, so no further layer can be proven on them."""
    failed_guard: str = ""
    """Set when a guard failed on the unchanged code: the layer may still be re-traced
    (:func:`retrace_shared`)."""

    @property
    def shared(self) -> bool:
        return self.method in (DedupeProof.GUARDS_PASS, DedupeProof.RETRACED_SAME)


_RECOMPILE = "fail_on_recompile"
_GUARD_FAILURE = re.compile(r"^\s*-\s*\d+/\d+:\s*(.+?)\s*(?:#.*)?$")
"""One failed guard (``- 3/0: ___stack0 == 0.45   # source``); the user stack after it is not."""


def prove_shared(rep: str, run: Callable[[], None], on_failure: Callable[[], None]) -> Proof:
    """Run a layer (``run``: its forward and backward on fresh inputs) on the compiled code
    Dynamo holds for ``rep``: every guard passes, and the layer shares ``rep``'s capture as is;
    else the failed guard (``failed_guard``), for :func:`retrace_shared`. Compiles nothing.
    ``on_failure`` puts the model back to idle after a failed run."""
    import torch

    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            run()
    except Exception as exc:  # noqa: BLE001 - a failed proof is data: capture the layer
        on_failure()
        message = str(exc)
        if _RECOMPILE not in message:
            return Proof(
                DedupeProof.GUARDS_FAIL,
                f"{rep}'s compiled code does not run here ({type(exc).__name__}: "
                f"{first_line(exc)[:200]})",
            )
        guard = _first_guard(message)
        return Proof(
            DedupeProof.GUARDS_FAIL, f"{rep}'s guards fail here: {guard}", failed_guard=guard
        )
    return Proof(
        DedupeProof.GUARDS_PASS,
        f"{rep}'s compiled code runs here unchanged: every Dynamo guard passes on this layer's "
        "module and inputs",
    )


def retrace_shared(
    rep: str,
    run: Callable[[], None],
    session: CaptureSession,
    rep_capture: RawCapture,
    on_failure: Callable[[], None],
    guard: str,
) -> Proof:
    """After a guard failed (a per-layer attribute, a run-time value stored on the module or
    handed across a break): run the layer with Dynamo free to re-trace the frames whose guards
    failed; it shares ``rep``'s capture only if, in exactly those frames, Dynamo meets the
    breaks ``rep`` met there."""
    with session.scratch() as seen:
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - a failed proof is data: capture the layer
            on_failure()
            return Proof(
                DedupeProof.GUARDS_FAIL,
                f"{rep}'s guards fail here ({guard}) and re-tracing failed "
                f"({type(exc).__name__}: {first_line(exc)[:160]})",
            )
    theirs = _statements(seen)
    ours = _statements(rep_capture, within=seen.compiled)
    if theirs != ours or seen.frame_skips:
        differ = sorted(theirs ^ ours)
        where = ", ".join(f"{gb_type} at {line}" for gb_type, line in differ) or "a frame skipped"
        return Proof(
            DedupeProof.GUARDS_FAIL,
            f"{rep}'s guards fail here ({guard}); re-traced, this layer breaks differently: "
            f"{where}"[:400],
            compiled_other_code=True,
        )
    return Proof(
        DedupeProof.RETRACED_SAME,
        f"{rep}'s guards fail here ({guard}); Dynamo re-traced the frames concerned and met "
        f"the breaks {rep} met there",
    )


def _statements(raw: RawCapture, within: set[CodeKey] | None = None) -> set[tuple[str, str]]:
    """(gb_type, innermost user file:line) of the breaks of a capture; ``within``: only those
    met while compiling one of those frames."""
    found = set()
    for index, (brk, _region) in enumerate(raw.breaks):
        if within is not None and not raw.break_frames.get(index, set()) & within:
            continue
        frames = user_frames(brk.frames)
        found.add((brk.gb_type, f"{frames[-1].file}:{frames[-1].line}" if frames else ""))
    return found


def _failed_guards(message: str) -> list[str]:
    """The failed guards of Dynamo's fail_on_recompile message, without their source comments
    (``self.layer_index == 0``)."""
    _, _, failures = message.partition("guard failure(s):")
    guards = []
    for line in failures.splitlines():
        match = _GUARD_FAILURE.match(line)
        if match and match.group(1):
            guards.append(match.group(1)[:200])
    return guards


def _first_guard(message: str) -> str:
    """The first failed guard; else the function Dynamo would have compiled afresh."""
    guards = _failed_guards(message)
    if guards:
        return guards[0]
    function = re.search(r"function name: '([^']+)'", message)
    if function:
        return f"Dynamo would compile `{function.group(1)}` afresh (no compiled code for it yet)"
    return message.strip().splitlines()[0][:200] if message.strip() else "unknown guard"


def unprovable(rep: str, why: str) -> Proof:
    return Proof(DedupeProof.UNPROVABLE, f"{rep}'s capture proves nothing here: {why}")


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
