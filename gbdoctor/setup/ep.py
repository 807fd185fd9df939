"""Expert parallelism the way torchtitan v0.2.x installs it.

Token dispatch and combine are a forward pre-hook and a forward hook on ``moe.experts``; expert
weights become DTensors sharded on dim 0 over the EP mesh. Dispatch exchanges per-expert token
counts with an all-to-all, copies the split sizes to the host (a device-to-host sync) and calls
``.tolist()`` on them, then moves the tokens with an autograd-aware all-to-all. Those are the
exact operations that make compiled MoE blocks break, which is why gbdoctor reproduces them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
from torch.distributed.tensor import Shard, distribute_tensor

from gbdoctor.errors import SpecError


class TokenDispatcher:
    """Holds the per-call state that dispatch hands to combine (split sizes, permutation)."""

    def __init__(self, ep_mesh: Any) -> None:
        self.ep_mesh = ep_mesh
        self.ep_degree = ep_mesh.size()
        self.input_splits: list[int] = []
        self.output_splits: list[int] = []
        self.permutation: torch.Tensor | None = None

    def token_dispatch(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """Forward pre-hook on the experts: send each token to the rank owning its expert."""
        routed_input, num_tokens_per_expert = args[0], args[1]
        group = self.ep_mesh.get_group()
        counts = num_tokens_per_expert.to(torch.int64)
        with torch.no_grad():
            counts_from_ranks = all_to_all_single(counts, None, None, group=group)
            counts_from_ranks = torch.ops._c10d_functional.wait_tensor(counts_from_ranks)
            input_splits = (
                counts.view(self.ep_degree, -1)
                .sum(dim=1)
                .to(torch.device("cpu"), non_blocking=True)
            )
            # The device-to-host sync torchtitan also pays: split sizes must be Python ints.
            output_splits = (
                counts_from_ranks.view(self.ep_degree, -1)
                .sum(dim=1)
                .to(torch.device("cpu"), non_blocking=False)
            )
            self.input_splits = input_splits.tolist()
            self.output_splits = output_splits.tolist()
        received = all_to_all_single_autograd(
            routed_input, self.output_splits, self.input_splits, group
        )
        # Received tokens are ordered (source rank, local expert); experts want them grouped by
        # local expert, so reorder with a stable sort on the local expert id of each segment.
        per_segment = counts_from_ranks.view(self.ep_degree, -1)
        num_local = per_segment.shape[1]
        segment_expert = torch.arange(num_local, device=counts.device).repeat(self.ep_degree)
        # output_size from the host-side split sizes keeps the op's output shape known to the
        # compiler (it is the same count the all-to-all just received).
        token_expert = torch.repeat_interleave(
            segment_expert, per_segment.reshape(-1), output_size=sum(self.output_splits)
        )
        self.permutation = torch.argsort(token_expert, stable=True)
        local_counts = per_segment.sum(dim=0)
        return received[self.permutation], local_counts

    def token_combine(
        self, module: nn.Module, args: tuple[Any, ...], output: torch.Tensor
    ) -> torch.Tensor:
        """Forward hook on the experts: undo the reorder and send outputs back to their ranks."""
        assert self.permutation is not None, "token_combine ran without token_dispatch"
        unpermuted = torch.zeros_like(output).index_copy(0, self.permutation, output)
        group = self.ep_mesh.get_group()
        return all_to_all_single_autograd(unpermuted, self.input_splits, self.output_splits, group)


def apply_ep(
    expert_stores: list[tuple[str, nn.Module]], ep_mesh: Any
) -> list[tuple[str, str, Any]]:
    """Shard each MoE's expert store (stacked weights) on dim 0 over ``ep_mesh`` and install
    dispatch/combine hooks on it.

    Returns the installed hooks as (module fqn, hook kind, callable) for the hook registry.
    """
    installed: list[tuple[str, str, Any]] = []
    for fqn, experts in expert_stores:
        num_experts = next(iter(experts.parameters())).shape[0]
        if num_experts % ep_mesh.size():
            raise SpecError(
                f"{fqn}: {num_experts} experts cannot be split over EP degree {ep_mesh.size()}",
                hint=f"use a divisor of {num_experts} for parallelism.expert_parallel_degree",
            )
        for name, param in list(experts.named_parameters(recurse=False)):
            sharded = nn.Parameter(
                distribute_tensor(param.data, ep_mesh, [Shard(0)]),
                requires_grad=param.requires_grad,
            )
            experts.register_parameter(name, sharded)
        dispatcher = TokenDispatcher(ep_mesh)
        experts.register_forward_pre_hook(dispatcher.token_dispatch)
        experts.register_forward_hook(dispatcher.token_combine)
        installed.append((fqn, "forward_pre", dispatcher.token_dispatch))
        installed.append((fqn, "forward", dispatcher.token_combine))
    return installed
