"""Per-rank capture work that never waits on another rank: FSDP's collectives served locally.

After the warm-up step (a real training step, in which every rank issues the same collectives),
each rank captures its block kinds, proves its dedupe candidates and probes recompiles on its
own. That work is not the same on every rank when ranks compile differently: a rank-0 print with
the layer index fails rank 0's guards in every layer, so rank 0 re-traces each layer (and a
failed proof stops a forward half-way) while rank 1 runs each layer once. Each block run went
through FSDP's hooks (an all-gather before the forward, a reduce-scatter after the backward), so
the ranks' collectives fell out of step and both ranks waited in them until the scan's deadline:
rank 0 in an all-gather of ``retrace_shared``, rank 1 in a reduce-scatter of ``prove_shared``.

:func:`rank_local_fsdp` takes the cross-rank part out of FSDP for that phase and keeps the rest of
FSDP as training runs it (unshard, reshard and the freed parameter memory the CUDA-graph analysis
reads, gradient hooks). Entering it, every rank all-gathers every FSDP parameter group once, for
real and in lock-step (every rank holds the same FSDP modules, in the same order), and keeps the
gathered parameters. Inside, FSDP's all-gather (its pluggable ``AllGather`` comm) is answered
from that copy, with this rank's current shard in its place, and its reduce-scatter by this
rank's share of its own gradients: a block run computes on the real gathered weights and waits on
no one. HSDP's replicate all-reduce and collectives of the model's own code (tensor parallel,
expert parallel) still cross ranks: the scan's deadline bounds them, and its error names the
block each unfinished rank was at (``setup.rank_main.report_stage``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    AllGather,
    DefaultAllocMixin,
    ReduceScatter,
)


class _ServedAllGather(DefaultAllocMixin, AllGather):  # type: ignore[misc]
    """Records the real all-gather once (``recording``), then answers from it on this rank."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.recording = True
        self.gathered: torch.Tensor | None = None

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        async_op: bool = False,
    ) -> Any:
        if self.recording:
            work = self.real(output_tensor, input_tensor, group, async_op=False)
            if work is not None:
                work.wait()
            self.gathered = output_tensor.detach().clone()
            return None
        # FSDP gathers in place: the input is this rank's slot of the output.
        mine = input_tensor.detach().clone()
        shards = output_tensor.view(group.size(), -1)
        if self.gathered is not None and self.gathered.shape == output_tensor.shape:
            output_tensor.copy_(self.gathered)
        else:  # never gathered for real: every slot holds this rank's shard (shapes are right)
            shards.copy_(mine.view(1, -1).expand_as(shards))
        shards[group.rank()].copy_(mine.view(-1))
        return None


class _LocalReduceScatter(DefaultAllocMixin, ReduceScatter):  # type: ignore[misc]
    """This rank's share of its own gradients, as if every rank's were the same."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        share = input_tensor.view(group.size(), -1)[group.rank()]
        output_tensor.copy_(share.view_as(output_tensor))
        return None


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _param_groups(module: nn.Module) -> list[Any]:
    # torch 2.13 FSDP2 keeps one group per parameter mesh (torchtitan 0.3's EP shards experts on
    # their own mesh); FSDPModule.set_custom_all_gather refuses several, so the comms are set on
    # each group.
    state = module._get_fsdp_state()  # type: ignore[operator]
    return list(
        getattr(state, "_fsdp_param_groups", None)
        or ([state._fsdp_param_group] if state._fsdp_param_group else [])
    )


def _other_ranks_wait() -> bool:
    """Whether FSDP's collectives here wait on other processes: not in a world of one, nor on
    the simulation's fake process group (one process stands for every rank)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return False
    return dist.get_backend() != "fake"


@contextlib.contextmanager
def rank_local_fsdp(model: nn.Module) -> Iterator[int]:
    """Inside, ``model``'s FSDP modules all-gather and reduce-scatter on this rank alone (see the
    module docstring). Yields how many FSDP modules are served (0: none to serve: no FSDP, a
    world of one rank, a simulation). Entering is one collective step per FSDP module: enter it
    at the same point on every rank."""
    modules = fsdp_modules(model) if _other_ranks_wait() else []
    replaced: list[tuple[Any, Any, Any]] = []
    served: list[_ServedAllGather] = []
    try:
        for module in modules:
            for group in _param_groups(module):
                gather = _ServedAllGather(group._all_gather_comm)
                replaced.append((group, group._all_gather_comm, group._reduce_scatter_comm))
                group._all_gather_comm, group._reduce_scatter_comm = gather, _LocalReduceScatter()
                served.append(gather)
            # Resharding is local; the unshard is the real all-gather, recorded, in lock-step.
            module.reshard()  # type: ignore[operator]
            module.unshard()  # type: ignore[operator]
            module.reshard()  # type: ignore[operator]
        for gather in served:
            gather.recording = False
        yield len(modules)
    finally:
        for group, all_gather, reduce_scatter in replaced:
            group._all_gather_comm, group._reduce_scatter_comm = all_gather, reduce_scatter
