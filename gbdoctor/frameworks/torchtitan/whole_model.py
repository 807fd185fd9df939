"""Setups that trace the whole model instead of compiling each block, and their FSDP.

torchtitan's ``experiments/graph_trainer`` (``--torchtitan graph_trainer.llama3:...``) traces
forward + loss + backward as one graph: under its default ``compile.mode = "aot_fx_trace"`` with
``make_fx`` (no Dynamo at all), under ``"jit"`` with one ``model.compile(fullgraph=True)`` of the
whole model. Either way no block is a region of its own, so a per-block scan would capture
nothing. Here each block is compiled in place with ``fullgraph=True`` instead (and a whole-model
Dynamo compile undone), so the scan says, per block, what Dynamo sees of it under that setup:
a break in any block fails graph_trainer's whole-model ``fullgraph=True`` compile.

Its data parallelism is SimpleFSDP (``graph_trainer/simple_fsdp.py``): each parameter is a
sharded DTensor read through a class property that all-gathers it (``redistribute`` to
Replicate), so the all-gather is ordinary traced code, with no module hooks as FSDP2 has.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn


def _covers(region: str, fqn: str) -> bool:
    """Whether compiling ``region`` compiles the block ``fqn`` as part of something larger."""
    return region == "" or fqn.startswith(region + ".")


def compile_blocks_when_traced_whole(
    model: nn.Module, recorder: Any, compile_config: Any, strategy: Any
) -> str | None:
    """When compile is on and torchtitan gave no block a region of its own, compile each block
    in place (through ``recorder``, so with the capture session's recording backend) and undo a
    whole-model compile; returns the note that says so, else None."""
    from gbdoctor.models.structure import find_blocks

    if strategy.compile is False or not compile_config.enable:
        return None
    blocks = [(fqn, outer) for fqn, _, outer in find_blocks(model).items()]
    regions = [fqn for fqn, _ in recorder.regions]
    if any(r == fqn or r.startswith(fqn + ".") for r in regions for fqn, _ in blocks):
        return None  # torchtitan compiles per block (or inside blocks): scanned as it is
    whole = sorted({r for r in regions for fqn, _ in blocks if _covers(r, fqn)})
    mode = getattr(compile_config, "mode", None)
    if not whole and mode != "aot_fx_trace":
        return None  # e.g. compile.components without "model": the blocks train eagerly
    fullgraph = all(recorder.compiled.get(r, False) for r in whole) if whole else True
    for region in whole:
        module = recorder.in_place.get(region)
        if module is not None:
            module._compiled_call_impl = None  # per-block regions stand in for it
    for _, outer in blocks:
        outer.compile(fullgraph=fullgraph)
    if whole:
        how = (
            f"compiles the whole model with one {'fullgraph ' if fullgraph else ''}Dynamo "
            f"compile (compile.mode {mode!r})"
        )
        means = "any break fails that compile" if fullgraph else "a break splits that graph"
    else:
        how = f"traces forward+loss+backward whole outside Dynamo (compile.mode {mode!r}, make_fx)"
        means = "make_fx itself does not break graphs; its compile.mode 'jit' would fail on any"
    return (
        f"torchtitan {how}; gbdoctor compiled each of the {len(blocks)} blocks in place with "
        f"fullgraph={fullgraph} instead, so each block's breaks are what Dynamo sees of it under "
        f"this setup ({means})"
    )


def parametrized_params(model: nn.Module) -> int:
    """Parameters read through a class property (SimpleFSDP's parametrization: reading
    ``module.weight`` all-gathers the sharded parameter), counted over the model."""
    return sum(
        1
        for module in model.modules()
        for name in module._parameters
        if isinstance(getattr(type(module), name, None), property)
    )


def simple_fsdp_note(model: nn.Module) -> str | None:
    count = parametrized_params(model)
    if not count:
        return None
    return (
        f"data parallelism is SimpleFSDP: {count} parameters are sharded DTensors read through "
        "a parametrization that all-gathers them inside the traced code (no FSDP2 module hooks)"
    )


def unapplied_ac_note(config: Any, blocks: list[Any]) -> str | None:
    """The config names activation checkpointing but ``parallelize_fn`` wrapped no block (as
    graph_trainer, which applies SAC to the traced graph: ``compile.memory_policy``)."""
    ac = config.activation_checkpoint
    if ac is None or any(slot.ac_wrapped for slot in blocks):
        return None
    policy = getattr(config.compile, "memory_policy", None)
    where = f" (compile.memory_policy {policy!r} acts on the traced graph)" if policy else ""
    return (
        f"the config's activation checkpointing ({type(ac).__qualname__.split('.')[0]}) wraps "
        f"no block: torchtitan's parallelize_fn applied none{where}; blocks are captured "
        "without AC"
    )
