"""What one call of the model gets in a timeline rank (``timeline.train.timeline_rank``): the
batch shape of the call on this rank (``--seq-lens``, a ``--shapes`` stream, or the
prediction's shape classes), its synthetic batch, and the forward-only call the prediction
makes (``timeline.predict``)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.records import Spec
from gbdoctor.records.shapes import ShapeStream


def call_shape(job: Any, call: int, meshes: Any) -> tuple[int, int]:
    if not job.shapes:
        lengths = job.settings.seq_lens
        return job.settings.batch_size, lengths[call % len(lengths)]
    from gbdoctor.setup.train import data_share

    rank, shares = data_share(meshes)
    if len(job.shapes) == 1:
        return job.shapes[0][call]
    if len(job.shapes) != shares:
        raise SpecError(
            f"--shapes names {len(job.shapes)} ranks, the setup has {shares} data-parallel ranks",
            hint="give one shape per step (every rank) or one per data-parallel rank",
        )
    return job.shapes[rank][call]


def call_batch(
    spec: Spec, meshes: Any, vocab: int, call: int, batch: int, seq: int, job: Any
) -> tuple[Any, Any]:
    from gbdoctor.setup.train import data_share, step_batch, synthetic_batch

    if not job.shapes:
        return step_batch(spec, meshes, vocab, call, local_batch=batch, seq_len=seq)
    # Per-rank shapes: each data share draws its own rows (the shares may differ in shape).
    return synthetic_batch(
        seed=spec.training.seed + 7919 * data_share(meshes)[0],
        step=call,
        vocab=vocab,
        local_batch=batch,
        seq_len=seq,
        rank=0,
        world_size=1,
        device=meshes.device,
    )


def forward_step(setup: Any, tokens: Any, labels: Any) -> tuple[float, float, float]:
    """The forward and loss of a training step, with autograd recording as in training (Dynamo
    guards on grad mode), then FSDP put back to idle as a backward would leave it."""
    from gbdoctor.capture import reset_fsdp_state
    from gbdoctor.setup.train import data_share, forward_loss, loss_context

    start = time.perf_counter()
    with loss_context(setup):
        loss = forward_loss(setup.model, tokens, labels, data_share(setup)[1])
    del loss
    reset_fsdp_state(setup.model)
    return (time.perf_counter() - start, 0.0, 0.0)


def with_stream(job: Any, stream: ShapeStream) -> Any:
    """``job`` (a ``timeline.train.TimelineJob``) following ``stream``: one step per stream step,
    each rank its own shapes."""
    if len(stream.steps) < 2:
        raise SpecError("a shape stream of 1 step: a timeline needs at least 2")
    per_rank = tuple(
        tuple(stream.shape(i, r).shape for i in range(len(stream.steps)))
        for r in range(stream.ranks)
    )
    seqs = tuple(dict.fromkeys(seq for rank in per_rank for _, seq in rank))
    batch = max(b for rank in per_rank for b, _ in rank)
    # The stream decides the steps and the shapes; the rest of the settings (device, backend,
    # ranks) stay as the command resolved them. RunSettings checks the ranges again.
    settings = replace(
        job.settings, steps=len(stream.steps), seq_lens=seqs, seq_len=max(seqs), batch_size=batch
    )
    spec = replace(
        job.spec, gbdoctor=replace(job.spec.gbdoctor, batch_size=batch, seq_len=max(seqs))
    )
    from gbdoctor.scan.estimate import require_real

    require_real(spec, command="timeline")
    return replace(
        job,
        spec=spec,
        settings=settings,
        shapes=per_rank,
        shapes_source=stream.source or "file",
    )
