"""gbdoctor's own collectives (the training step's loss, the MoE load balancer's token counts),
which the scan's per-rank work can keep on the rank (``rank_local_collectives``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_rank_local = False
"""Inside :func:`rank_local_collectives`: gbdoctor's own all-reduces stay on this rank."""


@contextlib.contextmanager
def rank_local_collectives() -> Iterator[None]:
    """Inside, :func:`all_reduce_sum` (the training step's loss, the MoE load balancer's token
    counts) answers on this rank, as if every rank held what this rank holds, instead of
    waiting on the others: for the scan's per-rank work after its warm-up (the recompile
    probe's training steps), which ranks that compile differently run different numbers of
    times (``capture.rank_local``)."""
    global _rank_local
    previous, _rank_local = _rank_local, True
    try:
        yield
    finally:
        _rank_local = previous


def all_reduce_sum(tensor: Any, group: Any = None) -> None:
    """``dist.all_reduce(tensor, SUM, group)`` in place; inside :func:`rank_local_collectives`,
    this rank's value times the group's size, with no communication."""
    import torch.distributed as dist

    if _rank_local:
        tensor.mul_(dist.get_world_size(group))
        return
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
