"""Synthetic data and one training step, shared by scan (warm-up), run and the tests.

Every rank draws the same global batch from a seeded generator and keeps its own rows, so a
world-size-1 run over the global batch sees exactly the data of an N-rank run. The loss is the
token-summed cross entropy divided by the global token count (FSDP gradient division is off),
which makes gradients independent of the number of ranks.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch
import torch.distributed as dist

from gbdoctor.setup.collectives import all_reduce_sum
from gbdoctor.setup.context_parallel import context_parallel_step, cp_degree
from gbdoctor.setup.outputs import embedding_vocab, training_loss


def synthetic_batch(
    *,
    seed: int,
    step: int,
    vocab: int,
    local_batch: int,
    seq_len: int,
    rank: int,
    world_size: int,
    device: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, labels) of this rank's rows of the global batch for ``step``."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    rows = torch.randint(0, vocab, (local_batch * world_size, seq_len + 1), generator=gen)
    mine = rows[rank * local_batch : (rank + 1) * local_batch]
    return mine[:, :-1].to(device), mine[:, 1:].to(device)


def step_batch(
    spec: Any,
    meshes: Any,
    vocab: int,
    step: int,
    *,
    local_batch: int | None = None,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`synthetic_batch` of ``spec``'s seed for ``step``, this rank's data share on the
    mesh device, at the spec's capture batch size and sequence length unless given."""
    rank, world = data_share(meshes)
    return synthetic_batch(
        seed=spec.training.seed,
        step=step,
        vocab=vocab,
        local_batch=spec.capture_batch_size if local_batch is None else local_batch,
        seq_len=spec.capture_seq_len if seq_len is None else seq_len,
        rank=rank,
        world_size=world,
        device=meshes.device,
    )


def loss_context(setup: Any) -> contextlib.AbstractContextManager[Any]:
    """torchtitan's train context under TP: the loss (forward and backward) runs under
    ``loss_parallel()`` on vocabulary-sharded logits."""
    if getattr(setup, "loss_parallel", False):
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def data_share(setup_or_meshes: Any) -> tuple[int, int]:
    """(which share of the global batch, how many shares): TP ranks of a group share the data."""
    meshes = getattr(setup_or_meshes, "meshes", setup_or_meshes)
    if meshes is not None and hasattr(meshes, "data_rank"):
        return meshes.data_rank, meshes.data_world
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def forward_loss(
    model: torch.nn.Module, tokens: torch.Tensor, labels: torch.Tensor, world_size: int
) -> torch.Tensor:
    """Local token-summed cross entropy over the global token count (``world_size``: the number
    of data shares), or what the model's outputs allow instead (``setup.outputs``: its own loss,
    or the hidden-state surrogate)."""
    loss, _ = training_loss(model(tokens), labels, world_size, embedding_vocab(model))
    return loss


def train_step(setup: Any, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    """Forward, backward, optimizer step (with its pre-step hooks); returns the global loss."""
    return timed_train_step(setup, tokens, labels)[0]


PHASES = ("forward", "backward", "optimizer")
"""The parts of a training step ``timed_train_step`` times (the loss all-reduce is the rest)."""


def timed_train_step(
    setup: Any, tokens: torch.Tensor, labels: torch.Tensor, sync: Any = None
) -> tuple[float, tuple[float, float, float]]:
    """``train_step``, timed per phase: (global loss, (forward s, backward s, optimizer s)).

    ``sync`` (e.g. ``torch.cuda.synchronize``) is called before each clock read so that a phase's
    asynchronous kernels are charged to it; on CPU every op has finished when it returns. The
    forward includes the loss (under TP's loss parallel, which the backward runs under too); the
    optimizer phase includes its pre-step hooks and zero_grad.
    """
    import time

    def now() -> float:
        if sync is not None:
            sync()
        return time.perf_counter()

    _, shares = data_share(setup)
    # Under CP each rank of a CP group holds 1/cp of its rows' tokens: the loss divides by the
    # global token count all the same (and is summed over the dp x cp ranks).
    cp = cp_degree(setup)
    with context_parallel_step(setup, (tokens, labels)), loss_context(setup):
        t0 = now()
        loss = forward_loss(setup.model, tokens, labels, shares * cp)
        t1 = now()
        loss.backward()
        t2 = now()
    if setup.optimizer is not None:
        setup.optimizer.step()
        setup.optimizer.zero_grad(set_to_none=True)
    t3 = now()
    reported = loss.detach()
    # Under loss parallel the loss is a replicated DTensor: its full value is the local one.
    reported = (reported.full_tensor() if hasattr(reported, "full_tensor") else reported).clone()
    if shares * cp > 1:
        group = setup.meshes.dp_group if getattr(setup, "meshes", None) is not None else None
        all_reduce_sum(reported, group)
    return float(reported), (t1 - t0, t2 - t1, t3 - t2)


def train_losses(payload: tuple[Any, str, int, str]) -> dict[str, Any]:
    """Run ``steps`` training steps of ``spec`` under ``strategy`` on this rank (the process
    group must be initialized); returns the losses and the first MoE's expert_bias after them.
    A ``run_ranks`` target, so world-size-N results can be compared with world size 1."""
    from gbdoctor.models import build_model, vocab_size
    from gbdoctor.setup.apply import apply_setup, recipe_context
    from gbdoctor.setup.balance import LoadBalancedMoE, load_balanced_moes
    from gbdoctor.setup.mesh import build_meshes

    spec, strategy, steps, backend = payload
    torch.manual_seed(spec.training.seed)
    device = "cpu"
    meshes = build_meshes(spec.parallelism, device)
    model = build_model(spec.model, device=meshes.device, max_seq_len=spec.training.seq_len)
    setup = apply_setup(model, spec, meshes, strategy=strategy, backend=backend)
    losses = []
    with recipe_context(setup.dynamo_flags, ac_enabled=setup.ac_enabled):
        for step in range(steps):
            tokens, labels = step_batch(spec, meshes, vocab_size(model), step)
            losses.append(train_step(setup, tokens, labels))
    moes = load_balanced_moes(model)
    bias = cast(LoadBalancedMoE, moes[0][1]).expert_bias.detach().cpu().tolist() if moes else []
    return {"losses": losses, "expert_bias": bias}
