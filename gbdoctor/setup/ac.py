"""Activation checkpointing as torchtitan v0.2.2 applies it.

``full`` wraps every block in a non-reentrant CheckpointWrapper; ``selective`` with an integer N
wraps every Nth block (torchtitan's counter starts at 1, so with N=2 blocks 1, 3, 5 are
wrapped); ``selective`` ``op`` wraps every block with the per-op SAC policy: save the outputs
of the listed compute/communication ops, except every second matmul, and always recompute
matmuls whose weight shape is a router gate's. ``split`` wraps each child of a block instead of
the block (a plan action: a break in one child no longer sends the others to eager).

The CPU stand-in for CUDA's RNG replay (``rng_stand_in``): a checkpointed region that recomputes
an RNG-tagged op (SDPA, dropout) has that op replayed with its forward RNG state. On CUDA torch
threads the state in as a graph input (graph-safe RNG); on CPU it falls back to saving the state
as an extra forward output, inserted just before the saved symints, i.e. after any saved opaque
object. torch 2.13 makes ``DeviceMesh`` opaque, and a block with DTensor (TP) parameters saves
its mesh for the gradients' DTensors, so the saved outputs go out of order and AOTAutograd fails
("expected all tensors_saved_with_vc_check to be Tensors, got ... DeviceMesh"; upstream issue:
none found; fixed in: unknown). torchtitan on CUDA never takes that path. So under TP on a mesh
without graph-safe RNG, a block holding DTensor parameters saves its RNG ops' outputs instead of
recomputing them (full AC gets a policy that does only that, while compiled; per-op SAC saves
them already on CUDA, where every SDPA kernel is in its save list). What is saved changes, not
what Dynamo traces: the breaks, graphs and kinds are those of torchtitan's full AC
(docs/tensor-parallel.md).
"""

from __future__ import annotations

import functools
import weakref
from collections import defaultdict
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import (
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)

from gbdoctor.records import ACSpec
from gbdoctor.torch_compat import higher_order_op


def _op_sac_save_list() -> set[Any]:
    """torchtitan v0.2.2's llama4/deepseek save list (ops that do not exist here are skipped)."""
    names = [
        ("aten", "mm"),
        ("aten", "_scaled_dot_product_efficient_attention"),
        ("aten", "_scaled_dot_product_flash_attention"),
        ("aten", "_scaled_dot_product_cudnn_attention"),
        ("aten", "_scaled_dot_product_attention_math"),
        ("aten", "_scaled_dot_product_fused_attention_overrideable"),
        ("_c10d_functional", "reduce_scatter_tensor"),
        ("_c10d_functional", "all_to_all_single"),
        ("aten", "max"),
    ]
    ops: set[Any] = set()
    for ns, name in names:
        packet = getattr(getattr(torch.ops, ns), name, None)
        if packet is not None and hasattr(packet, "default"):
            ops.add(packet.default)
    for hop in ("flex_attention", "inductor_compiled_code"):
        op = higher_order_op(hop)
        if op is not None:
            ops.add(op)
    return ops


# Device types whose RNG ops a compiled checkpoint replays with graph-safe RNG state (torch 2.13
# registers only CUDA); elsewhere ``rng_stand_in`` applies.
GRAPHSAFE_RNG_DEVICES = ("cuda",)


_RNG_STAND_INS: weakref.WeakSet[nn.Module] = weakref.WeakSet()
"""The checkpoint wrappers :func:`wrap` gave the RNG stand-in (for the scan's note)."""


def _is_rng_op(func: Any) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


def needs_rng_stand_in(module: nn.Module) -> bool:
    """Whether ``module``, once checkpointed and compiled, would hit torch's non-graph-safe RNG
    replay with a saved ``DeviceMesh`` (module docstring): it holds DTensor parameters on a mesh
    whose device has no graph-safe RNG."""
    return any(
        isinstance(p, DTensor) and p.device_mesh.device_type not in GRAPHSAFE_RNG_DEVICES
        for p in module.parameters()
    )


def rng_stand_in_notes(model: nn.Module) -> tuple[str, ...]:
    """The scan's note when any checkpointed region of ``model`` runs under ``rng_stand_in``: a
    stand-in is stated, as CP's CPU ring attention is. Counted as :func:`wrap` decided (under TP
    only), not by looking at the parameters now: FSDP2, applied after AC, makes every parameter a
    DTensor."""
    regions = [m for m in model.modules() if m in _RNG_STAND_INS]
    if not regions:
        return ()
    return (
        f"activation checkpointing: {len(regions)} checkpointed region(s) hold DTensor parameters "
        "on a mesh without graph-safe RNG (CPU): they save their RNG ops' outputs instead of "
        "recomputing them, a stand-in for CUDA's RNG replay (torch 2.13's CPU replay fails on "
        "the saved DeviceMesh; docs/tensor-parallel.md); what Dynamo traces is unchanged",
    )


def rng_save_context_fn() -> Any:
    """Full AC's ``context_fn`` under ``rng_stand_in``: save RNG ops, recompute everything else,
    in a compiled region only. Run eagerly (a region that fell back to eager) it is plain full
    AC: the bug is AOTAutograd's, and eager SAC around an FSDP-managed module (the experts
    under EP) fails in backward on torch 2.13 (``apply_ac``'s docstring)."""

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if _is_rng_op(func) else CheckpointPolicy.PREFER_RECOMPUTE

    def context_fn() -> Any:
        if not torch.compiler.is_compiling():
            return noop_context_fn()
        return create_selective_checkpoint_contexts(policy)

    return context_fn


def sac_context_fn(
    force_recompute_mm_shapes: set[tuple[int, ...]], *, rng_stand_in: bool = False
) -> Any:
    """The per-op SAC ``context_fn`` (a fresh policy with its own matmul counters per call)."""
    save_ops = _op_sac_save_list()
    mm = torch.ops.aten.mm.default

    def policy(
        meta: dict[str, int], ctx: Any, func: Any, *args: Any, **kwargs: Any
    ) -> CheckpointPolicy:
        if rng_stand_in and _is_rng_op(func):
            # CPU's SDPA kernel stands in for the CUDA kernels the save list names
            return CheckpointPolicy.MUST_SAVE
        if (
            func == torch.ops.aten._to_copy.default
            and "cuda" in str(args[0].device)
            and str(kwargs.get("device", "")) == "cpu"
        ):
            return CheckpointPolicy.MUST_SAVE  # device-to-host copies (EP split sizes)
        key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
        if func == mm:
            if tuple(args[1].shape) in force_recompute_mm_shapes:
                return CheckpointPolicy.PREFER_RECOMPUTE
            meta[key] += 1
        to_save = func in save_ops and not (func == mm and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    def context_fn() -> Any:
        meta: dict[str, int] = defaultdict(int)
        return create_selective_checkpoint_contexts(functools.partial(policy, meta))

    return context_fn


def _router_gate_shapes(module: nn.Module, fqn_patterns: tuple[str, ...]) -> set[tuple[int, ...]]:
    """RHS shapes (in_features, out_features) of Linears whose FQN contains a pattern."""
    shapes: set[tuple[int, ...]] = set()
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Linear) and any(p in name for p in fqn_patterns):
            shapes.add((sub.in_features, sub.out_features))
    return shapes


def wrap(
    module: nn.Module,
    *,
    op_sac: bool,
    ac: ACSpec,
    gate_shapes: set[tuple[int, ...]],
    tensor_parallel: bool = False,
) -> nn.Module:
    """One CheckpointWrapper (non-reentrant), with the SAC policy when ``op_sac``, and the RNG
    stand-in where ``needs_rng_stand_in``."""
    kwargs: dict[str, Any] = dict(
        checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=ac.preserve_rng_state
    )
    # Only under TP: its DTensor parameters stay DTensors inside the forward. EP's expert
    # stores are DTensors too but compute on local shards (no mesh saved: EP + AC scans traced
    # before the stand-in existed), and FSDP2 shards after AC is applied.
    stand_in = tensor_parallel and needs_rng_stand_in(module)
    if op_sac:
        kwargs["context_fn"] = sac_context_fn(gate_shapes, rng_stand_in=stand_in)
    elif stand_in:
        kwargs["context_fn"] = rng_save_context_fn()
    wrapper = checkpoint_wrapper(module, **kwargs)
    if stand_in:
        _RNG_STAND_INS.add(wrapper)
    return wrapper


def ac_label(ac: ACSpec) -> str:
    """Short label of the wrapping: ``ac`` (full / layer-selective) or ``sac`` (per-op)."""
    return "sac" if ac.mode == "selective" and ac.selective_ac_option == "op" else "ac"


def is_wrapped(ac: ACSpec, index: int) -> bool:
    """Whether block ``index`` (0-based) gets an AC wrapper under ``ac``.

    torchtitan's layer-selective counter starts at 1, so with N=2 blocks 1, 3, 5 are wrapped.
    """
    if ac.mode == "full" or (ac.mode == "selective" and ac.selective_ac_option == "op"):
        return True
    if ac.mode == "selective":
        every = int(ac.selective_ac_option)
        return every <= 0 or (index + 1) % every == 0
    return False


def apply_ac(
    blocks: list[tuple[str, nn.Module]],
    ac: ACSpec,
    *,
    split: dict[str, tuple[str, ...]] | None = None,
    tensor_parallel: bool = False,
) -> dict[str, tuple[nn.Module, tuple[str, ...]]]:
    """Wrap blocks per ``ac``; returns {block fqn: (new outer module, wrapped sub-FQNs)}.
    ``tensor_parallel``: TP was applied to the blocks (the RNG stand-in may be needed).

    ``split`` maps block FQNs to wrap per child instead of as a whole to the sub-FQNs that stay
    eager there. A child holding such an eager module gets plain (full) AC even under per-op
    SAC: eager SAC around an FSDP-managed module fails in backward on torch 2.13 (FSDP's
    profiler ops differ between forward and recompute). Sub-FQNs are relative to the block
    ("" means the block itself).
    """
    split = split or {}
    op_sac = ac.mode == "selective" and ac.selective_ac_option == "op"
    out: dict[str, tuple[nn.Module, tuple[str, ...]]] = {}
    for index, (fqn, block) in enumerate(blocks):
        if not is_wrapped(ac, index):
            out[fqn] = (block, ())
            continue
        gate_shapes = _router_gate_shapes(block, ac.per_op_sac_force_recompute_mm_shapes_by_fqns)
        if fqn in split:
            names = []
            for name, child in list(block.named_children()):
                if any(True for _ in child.parameters()):
                    holds_eager = any(e == name or e.startswith(name + ".") for e in split[fqn])
                    setattr(
                        block,
                        name,
                        wrap(
                            child,
                            op_sac=op_sac and not holds_eager,
                            ac=ac,
                            gate_shapes=gate_shapes,
                            tensor_parallel=tensor_parallel,
                        ),
                    )
                    names.append(name)
            out[fqn] = (block, tuple(names))
        else:
            outer = wrap(
                block,
                op_sac=op_sac,
                ac=ac,
                gate_shapes=gate_shapes,
                tensor_parallel=tensor_parallel,
            )
            out[fqn] = (outer, ("",))
    return out


def unwrap_checkpoint(module: nn.Module) -> nn.Module:
    return module._checkpoint_wrapped_module if isinstance(module, CheckpointWrapper) else module
