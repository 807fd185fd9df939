"""FSDP2 (``fully_shard``) in torchtitan v0.2.2's order and with its settings.

Order: token embeddings; per block, first ``moe.experts`` on the expert-data-parallel mesh when
EP > 1 (these are the hooks that end up *inside* a whole-block compiled MoE region), then the
block itself; ``[norm, output]`` together; the root. Gradient division is turned off because the
loss is already scaled by the global token count, and EP > 1 gets explicit prefetching, as
torchtitan does because EP's device-to-host syncs defeat implicit prefetching.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def apply_fsdp(
    model: nn.Module,
    outer_blocks: list[tuple[str, nn.Module]],
    experts: dict[str, nn.Module],
    meshes: Any,
    *,
    param_dtype: str,
    reduce_dtype: str,
    reshard_after_forward: str,
    pp_enabled: bool = False,
) -> None:
    """Shard ``model`` in place. ``experts`` maps block FQN to its ``moe.experts`` (EP > 1 only)."""
    mp = MixedPrecisionPolicy(param_dtype=_DTYPES[param_dtype], reduce_dtype=_DTYPES[reduce_dtype])
    # torchtitan: "default" means reshard unless pipeline parallel (a stage runs several
    # microbatches' forwards before their backwards: resharding would all-gather every time).
    reshard = reshard_after_forward == "always" or (
        reshard_after_forward == "default" and not pp_enabled
    )
    common = dict(mesh=meshes.dp, mp_policy=mp, reshard_after_forward=reshard)
    embeddings = getattr(model, "tok_embeddings", None)
    if isinstance(embeddings, nn.Module):
        fully_shard(embeddings, **common)
    for fqn, outer in outer_blocks:
        if fqn in experts:
            fully_shard(experts[fqn], mesh=meshes.edp, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(outer, **common)
    tail = [
        m
        for m in (getattr(model, "norm", None), getattr(model, "output", None))
        if isinstance(m, nn.Module)
    ]
    if tail:
        fully_shard(
            tail,
            mesh=meshes.dp,
            mp_policy=mp,
            reshard_after_forward=reshard_after_forward == "always",
        )
    fully_shard(model, **common)
    gloo = meshes.device.type == "cpu"
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if gloo:
                # gloo has no PREMUL_SUM; plain SUM is exactly what a divide factor of 1 means.
                module.set_force_sum_reduction_for_comms(True)
    if experts:
        _explicit_prefetch(
            [outer for _, outer in outer_blocks], [experts.get(f) for f, _ in outer_blocks]
        )


def _explicit_prefetch(blocks: list[nn.Module], experts: list[nn.Module | None]) -> None:
    # fully_shard made every block and expert store an FSDPModule; callers hold them as nn.Module.
    for i, block in enumerate(blocks[:-1]):
        nxt = [blocks[i + 1]] + ([experts[i + 1]] if experts[i + 1] is not None else [])
        cast(FSDPModule, block).set_modules_to_forward_prefetch(cast(list[FSDPModule], nxt))
    for i in range(len(blocks) - 1, 0, -1):
        prev = [blocks[i - 1]] + ([experts[i - 1]] if experts[i - 1] is not None else [])
        cast(FSDPModule, blocks[i]).set_modules_to_backward_prefetch(cast(list[FSDPModule], prev))
