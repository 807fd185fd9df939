"""Pipeline parallelism through the installed torchtitan's own pipeline code (PP > 1).

As 0.3's trainer does, the model spec's ``pipelining_fn`` (``pipeline_llm`` for the language
models) gets the whole model on meta and returns this rank's schedule and model parts: its own
stage split (``_pipeline_module_split``: a deep copy per stage, other stages' layers deleted),
its own ``parallelize_fn`` per part (through gbdoctor's recording compile, so each part's blocks
are compiled where torchtitan compiles them), its own schedule (``_build_pipeline_schedule``).
The warm-up step is the trainer's ``pp_forward_backward_step`` on that schedule, so every block
of the rank's stages records the inputs it really gets: a microbatch of tokens on the first
stage, the hidden states the previous stage sends on the others.

The layout (every stage's modules and PP rank, for the report's stages) is torchtitan's own too:
its stage metadata, its module names per stage (or ``module_fqns_per_model_part``) and its
rank-to-stage mapping.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn as nn

from gbdoctor.setup.apply import BlockSlot
from gbdoctor.setup.pipeline import PipelineLayout, PipelineStage


@dataclass
class Pipelined:
    """What ``pipelining_fn`` returned on this rank."""

    schedule: Any
    parts: list[nn.Module]
    stage_indices: tuple[int, ...]
    """The stage index of each part, in part order."""
    has_first: bool
    has_last: bool
    layout: PipelineLayout


def layout_of(config: Any, parallel_dims: Any) -> PipelineLayout:
    """Every stage's modules and PP rank, from torchtitan's own functions."""
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _get_pipeline_metadata,
        _get_pp_rank_to_stage_indices_mapping,
    )

    p = config.parallelism
    stages, layers, first, last = _get_pipeline_metadata(parallel_dims, p, config.model_spec.model)
    names = p.module_fqns_per_model_part or _generate_llm_fqn_per_model_part(
        stages, layers, first, last
    )
    owner = {
        index: rank
        for rank in range(p.pipeline_parallel_degree)
        for index in _get_pp_rank_to_stage_indices_mapping(
            rank, p.pipeline_parallel_degree, p.pipeline_parallel_schedule, len(names)
        )
    }
    mb = p.pipeline_parallel_microbatch_size
    return PipelineLayout(
        degree=p.pipeline_parallel_degree,
        schedule="csv" if p.pipeline_parallel_schedule_csv else p.pipeline_parallel_schedule,
        microbatch_size=mb,
        microbatches=config.training.local_batch_size // mb,
        stages=tuple(
            PipelineStage(index=i, pp_rank=owner[i], modules=tuple(m)) for i, m in enumerate(names)
        ),
    )


def parallelize_kwargs(config: Any, parallel_dims: Any) -> dict[str, Any]:
    """What 0.3's trainer passes ``parallelize_fn`` (and ``pipelining_fn``, which passes it on
    to each part's)."""
    return dict(
        parallel_dims=parallel_dims,
        training=config.training,
        parallelism=config.parallelism,
        compile_config=config.compile,
        ac_config=config.activation_checkpoint,
        dump_folder=config.dump_folder,
    )


def pipeline(
    model: nn.Module, config: Any, parallel_dims: Any, device: str, recorder: Any, loss_fn: Any
) -> Pipelined:
    """The model spec's ``pipelining_fn`` as 0.3's trainer calls it; ``recorder`` follows each
    part while its ``parallelize_fn`` runs (a region's FQN is read on the part it is in)."""
    spec = config.model_spec

    def parallelize(part: nn.Module, **kwargs: Any) -> nn.Module:
        recorder.model = part
        return spec.parallelize_fn(part, **kwargs)

    schedule, parts, has_first, has_last = spec.pipelining_fn(
        model,
        **parallelize_kwargs(config, parallel_dims),
        device=torch.device(device),
        model_config=spec.model,
        parallelize_fn=parallelize,
        loss_fn=loss_fn,
    )
    return Pipelined(
        schedule=schedule if takes_microbatches(schedule) else MicrobatchStep(schedule),
        parts=list(parts),
        stage_indices=tuple(s.stage_index for s in schedule_stages(schedule)),
        has_first=has_first,
        has_last=has_last,
        layout=layout_of(config, parallel_dims),
    )


def schedule_stages(schedule: Any) -> list[Any]:
    """The stages a torch schedule runs on this rank (multi-stage schedules keep a list)."""
    return getattr(schedule, "_stages", None) or [schedule._stage]


def takes_microbatches(schedule: Any) -> bool:
    """Whether this torch's schedule ``step`` takes the microbatches torchtitan 0.3's trainer
    passes (``arg_mbs``, ``kwarg_mbs``, ``target_mbs``)."""
    import inspect

    return "arg_mbs" in inspect.signature(type(schedule).step).parameters


class MicrobatchStep:
    """torchtitan 0.3's trainer calls ``step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)``
    with its microbatches already split (a newer torch's API); torch 2.13's ``step`` takes a
    whole batch and splits it itself, so the trainer's keywords would reach the model. This is
    2.13's ``step`` without the split: its per-step reset of every stage, then the schedule's
    own ``_step_microbatches`` on the trainer's microbatches."""

    NOTE = (
        "torch {torch}'s schedules have no step(arg_mbs=...), which torchtitan's "
        "pp_forward_backward_step calls: its microbatches go to the schedule's own "
        "_step_microbatches after step()'s per-step stage reset"
    )

    def __init__(self, schedule: Any) -> None:
        self.schedule = schedule

    def step(
        self,
        *,
        arg_mbs: list[Any] | None = None,
        kwarg_mbs: list[Any] | None = None,
        target_mbs: list[Any] | None = None,
        losses: list[Any] | None = None,
        loss_kwargs: dict[str, Any] | None = None,
        return_outputs: bool = True,
    ) -> None:
        schedule = self.schedule
        for stage in schedule_stages(schedule):
            stage.has_backward = schedule._has_backward
            stage.clear_runtime_states()
        schedule._step_microbatches(
            arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs=loss_kwargs
        )


class PartsView(nn.Module):
    """This rank's model parts seen as one model, for the questions a scan asks of "the model"
    (its blocks by global FQN, its FSDP state, where a frame's module is): the parts' top-level
    modules under their own names (``layers`` merged, keys global as torchtitan keeps them),
    then the parts themselves as ``_part0``, ... (their FSDP roots; ``named_modules`` names each
    module once, by its first name). It has no forward: the schedule runs the parts. A rank
    without the embedding gets a parameterless one on meta, so the vocabulary and the residual
    width (what finds MoE layers) read as on the first stage."""

    def __init__(self, parts: list[nn.Module], embedding: nn.Embedding) -> None:
        super().__init__()
        # One part: its own container (named once); several: their layers merged by key.
        layers = _layers(parts[0]) if len(parts) == 1 else nn.ModuleDict()
        for part in parts:
            for name, child in part.named_children():
                if name == "layers":
                    if name not in self._modules:
                        self.add_module(name, layers)
                    if child is not layers:
                        for key, block in _layers(part).items():
                            layers[key] = block
                elif name not in self._modules:
                    self.add_module(name, child)
        if not any(isinstance(m, nn.Embedding) for m in self.modules()):
            marker = nn.Embedding(embedding.num_embeddings, embedding.embedding_dim, device="meta")
            del marker._parameters["weight"]  # a shape only: nothing to train or to shard
            self.add_module("_structure_embedding", marker)
        for i, part in enumerate(parts):  # single modules, not a container of blocks
            self.add_module(f"_part{i}", part)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the schedule runs this rank's model parts, not the view")


def _layers(part: nn.Module) -> nn.ModuleDict:
    """A part's blocks: torchtitan's decoder keeps them in a ModuleDict keyed by the global
    layer index, which its split keeps (the other stages' keys deleted)."""
    layers = part.get_submodule("layers")
    assert isinstance(layers, nn.ModuleDict)
    return layers


def stage_slots(slots: list[BlockSlot], pipelined: Pipelined) -> list[BlockSlot]:
    """Each block with the stage that holds it (torchtitan's split)."""
    stage_of = {
        f"layers.{key}": index
        for part, index in zip(pipelined.parts, pipelined.stage_indices, strict=True)
        for key in _layers(part).keys()
    }
    return [replace(slot, stage=stage_of.get(slot.fqn)) for slot in slots]


def microbatches(
    tokens: torch.Tensor, labels: torch.Tensor, count: int
) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """The ``count`` microbatches one schedule step takes, each of the capture's shape, as the
    trainer pulls them from its dataloader (one ``next`` per microbatch): the step's batch, then
    the same ids rolled along the sequence (other data, the same shape)."""
    positions = torch.arange(tokens.shape[1]).repeat(tokens.shape[0], 1)
    out = []
    for i in range(count):
        shift = i % max(1, tokens.shape[1])
        out.append(
            (
                {"input": tokens.roll(shift, 1), "positions": positions},
                labels.roll(shift, 1),
            )
        )
    return out


def pipeline_step(state: Any, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One forward-backward through torchtitan's schedule: the trainer's own
    ``pp_forward_backward_step`` (each microbatch through ``post_dataloading_process``, the
    schedule's ``step`` with the first stage's inputs and the last stage's targets). Returns the
    summed loss on the rank with the last stage, -1 elsewhere (as torchtitan does)."""
    from torchtitan.trainer import Trainer

    mbs = microbatches(tokens, labels, state.num_pipeline_parallel_microbatches)
    valid = torch.tensor(sum(lab.numel() for _, lab in mbs))
    return Trainer.pp_forward_backward_step(
        state,
        input_dict_mbs=[d for d, _ in mbs],
        label_mbs=[lab for _, lab in mbs],
        global_valid_tokens=valid,
    )


def pipeline_note(pipelined: Pipelined, version: str | None) -> str:
    """What ran of torchtitan's pipeline code, and what the scan captures of it."""
    layout = pipelined.layout
    ranks = "; ".join(layout.rank_stages())
    return (
        f"pipeline: torchtitan {version}'s own pipelining_fn split the model into "
        f"{len(layout.stages)} stages ({ranks}) and parallelized each part; the warm-up is its "
        f"{layout.schedule} schedule's step ({layout.microbatches} microbatch(es) per step, each "
        "of the capture shape), so a non-first stage's blocks are captured with the hidden "
        "states the previous stage sent; the recompile probe and a second schedule run are "
        "not run under it (the schedule needs every PP rank in step, and its stages keep the "
        "first microbatch shape)"
        + (
            "; " + MicrobatchStep.NOTE.format(torch=torch.__version__)
            if isinstance(pipelined.schedule, MicrobatchStep)
            else ""
        )
    )
