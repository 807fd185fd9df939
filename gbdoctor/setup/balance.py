"""MoE auxiliary-loss-free load balancing: the optimizer pre-step hook.

The model counts tokens per expert in forward (in place, under no_grad); this hook turns the
counts into an ``expert_bias`` update before each optimizer step, summing counts over the
data-parallel ranks first, exactly as torchtitan v0.2.2 does.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch
import torch.distributed as dist
import torch.nn as nn

from gbdoctor.setup.collectives import all_reduce_sum


class LoadBalancedMoE(Protocol):
    """What :func:`load_balanced_moes` checked each module it returns has."""

    tokens_per_expert: torch.Tensor
    expert_bias: torch.Tensor
    load_balance_coeff: float


def load_balanced_moes(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules carrying both load-balancing buffers and a non-None coefficient."""
    found = []
    for name, module in model.named_modules():
        buffers = dict(module.named_buffers(recurse=False))
        if (
            "tokens_per_expert" in buffers
            and "expert_bias" in buffers
            and getattr(module, "load_balance_coeff", None) is not None
        ):
            found.append((name, module))
    return found


def update_expert_bias(
    moes: list[tuple[str, nn.Module]], recomputed: list[bool], group: Any
) -> None:
    """One bias update from the accumulated counts; resets the counts."""
    if not moes:
        return
    layers = [cast(LoadBalancedMoE, m) for _, m in moes]  # as load_balanced_moes found them
    with torch.no_grad():
        counts = torch.stack([m.tokens_per_expert for m in layers])
        # torchtitan assumes eager recompute counted every token twice under AC; the sign()
        # below makes the halving harmless either way.
        halve = torch.tensor(recomputed, device=counts.device).unsqueeze(1)
        counts = torch.where(halve, counts // 2, counts)
        if dist.is_initialized() and dist.get_world_size(group) > 1:
            all_reduce_sum(counts, group)
        for moe, c in zip(layers, counts):
            delta = moe.load_balance_coeff * torch.sign(c.mean() - c)
            moe.expert_bias.add_(delta - delta.mean())
            moe.tokens_per_expert.zero_()


def register_load_balancing(
    optimizer: torch.optim.Optimizer,
    moes: list[tuple[str, nn.Module]],
    recomputed: list[bool],
    group: Any,
) -> Any:
    """Install the pre-step hook; returns the hook callable (for the hook registry)."""

    def expert_bias_pre_step_hook(opt: Any, args: Any, kwargs: Any) -> None:
        update_expert_bias(moes, recomputed, group)

    optimizer.register_step_pre_hook(expert_bias_pre_step_hook)
    return expert_bias_pre_step_hook
