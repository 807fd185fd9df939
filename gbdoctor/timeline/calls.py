"""What one call of the model gets in a timeline rank (``timeline.train.timeline_rank``): the
batch shape of the call on this rank (``--seq-lens``, a ``--shapes`` stream, or the
prediction's shape classes), its synthetic batch, a packed batch's positions (``docs``), and
the forward-only call the prediction makes (``timeline.predict``)."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Iterator
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


Docs = tuple[tuple[int, ...], ...]
"""A packed batch: per row, the lengths of its documents (``()``: a plain batch)."""

POSITION_KWARGS = ("positions", "position_ids")
"""How a model's forward takes per-token positions: torchtitan's (and gbdoctor's built-in
models') ``positions``, Hugging Face's ``position_ids``."""


def call_docs(job: Any, call: int, meshes: Any) -> Docs:
    """The documents packed into this rank's rows for ``call`` (``()``: plain rows)."""
    if not job.packing:
        return ()
    if len(job.packing) == 1:
        return job.packing[0][call]
    from gbdoctor.setup.train import data_share

    return job.packing[data_share(meshes)[0]][call]


def docs_kind(docs: Docs) -> str:
    """What a packed batch changes in a model's inputs beside its shape: ``plain`` (no
    positions), ``single`` (positions, one document per row: Hugging Face then finds no packing
    and keeps its causal path) or ``packed`` (a row holds several documents: a document mask).
    A shape class of the prediction is its (batch, seq) and this kind."""
    if not docs:
        return "plain"
    return "packed" if any(len(row) > 1 for row in docs) else "single"


class CallPlan:
    """Which steps of a prediction call the model (``timeline.predict``): a step whose shape
    class (``(batch, seq)`` and :func:`docs_kind`) has not been called, or has not been called
    since the last compile on this rank (a graph compiled since, a dynamic one that Dynamo tries
    first, may take its shape: a new input shape for that graph). Any other step would repeat
    its class's last call exactly. With several ranks a step calls on every rank when it does on
    one (a MAX all-reduce of the flag), so that the ranks' collectives pair up; the extra calls
    hit the cache."""

    def __init__(self, distributed: bool) -> None:
        self.distributed = distributed
        self.compiles = 0
        self.seen: dict[tuple[tuple[int, int], str], int] = {}

    def needed(self, shape: tuple[int, int], docs: Docs) -> bool:
        key = (shape, docs_kind(docs))
        need = self.seen.get(key) != self.compiles
        if not self.distributed:
            return need
        import torch
        import torch.distributed as dist

        flag = torch.tensor([int(need)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def called(self, shape: tuple[int, int], docs: Docs, compiles: int) -> None:
        self.compiles += compiles
        self.seen[(shape, docs_kind(docs))] = self.compiles


def position_kwarg(model: Any) -> str | None:
    """The keyword of :data:`POSITION_KWARGS` the model's forward takes, looking through the
    wrappers a setup puts around it (``torch.compile``'s ``_orig_mod``, an engine's ``module``);
    None when it takes neither."""
    seen = 0
    while model is not None and seen < 4:
        try:
            names = set(inspect.signature(model.forward).parameters)
        except (TypeError, ValueError, AttributeError):
            names = set()
        for name in POSITION_KWARGS:
            if name in names:
                return name
        model = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        seen += 1
    return None


@contextlib.contextmanager
def packed_inputs(model: Any, docs: Docs, device: Any) -> Iterator[None]:
    """For the block, ``model``'s forward also gets the packed rows' positions (0, 1, ...
    restarting at each document) under the keyword it takes: what a packing data loader hands
    the model next to the tokens. A forward pre-hook on the root module, which runs eagerly
    under per-block compile: the blocks see the positions (or the document mask the model
    builds from them) as arguments, as in training."""
    name = position_kwarg(model) if docs else None
    if name is None:
        yield
        return
    from gbdoctor.models.attention import document_positions

    positions = document_positions(docs, device)

    def add_positions(module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        return args, {**kwargs, name: positions}

    handle = model.register_forward_pre_hook(add_positions, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def packing_note(model: Any, job: Any) -> str | None:
    """What a packed stream fed this model (None for a stream without ``docs``)."""
    if not any(any(rank) for rank in job.packing):
        return None
    name = position_kwarg(model)
    if name is None:
        return (
            "packed rows fed as plain rows: the model's forward takes neither `positions` nor "
            "`position_ids`, so document boundaries do not reach it"
        )
    return (
        f"packed rows: `{name}` restart at 0 at each document (the model builds its own "
        "document mask from them, if any)"
    )


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
    packing = tuple(
        tuple(stream.shape(i, r).docs for i in range(len(stream.steps)))
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
        packing=packing if any(any(rank) for rank in packing) else (),
        shapes_source=stream.source or "file",
    )
