"""Pipeline parallelism as torchtitan v0.2.2 lays it out: which modules each stage holds, which
stages each PP rank runs, how many microbatches the schedule runs.

The rules are torchtitan's (``distributed/pipeline_parallel.py``: ``pipeline_llm``, its
metadata, ``generate_llm_fqn_per_model_part`` and the rank-to-stage mapping), re-implemented
here so that a scan can lay a production config out without building it; the installed
torchtitan >= 0.3 is the oracle of ``tests/setup/test_pipeline_layout.py``. Violations are
``SpecError``s (exit 2) that say what to change, where torchtitan raises at setup.

- Stages: single-stage schedules (1F1B, GPipe) run one stage per PP rank; multi-stage ones
  (Interleaved1F1B, ZBVZeroBubble, DualPipeV, ...) two per rank unless
  ``pipeline_parallel_layers_per_stage`` sets the count (``ceil((layers + first + last) /
  layers_per_stage)`` virtual stages, a multiple of the PP degree).
- Layers: the embeddings weigh ``pipeline_parallel_first_stage_less_layers`` layers on the first
  stage and ``norm`` + ``output`` ``..._last_stage_less_layers`` on the last; the effective
  layers are spread evenly, the first stages taking one more when they do not divide.
- Ranks: looped schedules give rank r the stages r, r + pp, r + 2 pp, ...; V schedules
  (ZBVZeroBubble, DualPipeV) give rank r the stages r and 2 pp - 1 - r.
- Microbatches: ``local_batch_size / pipeline_parallel_microbatch_size``, which must divide.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.records import ParallelSpec

INPUT_MODULES = ("tok_embeddings",)
"""What torchtitan v0.2.2 puts on the first stage before the layers."""
OUTPUT_MODULES = ("norm", "output")
"""What it puts on the last stage after them (torchtitan 0.3 calls ``output`` ``lm_head``)."""
V_SCHEDULES = frozenset({"ZBVZeroBubble", "DualPipeV"})
"""Schedules whose ranks hold their stages in a V (rank r: stages r and 2 pp - 1 - r)."""
ZERO_BUBBLE_SCHEDULES = frozenset({"ZBVZeroBubble", "DualPipeV", "InterleavedZeroBubble"})
"""Schedules that split the backward into input (dI) and weight (dW) gradients."""


@dataclass(frozen=True)
class PipelineStage:
    """One (virtual) stage: its index, the PP rank that runs it and its modules."""

    index: int
    pp_rank: int
    modules: tuple[str, ...]
    """``tok_embeddings``, ``layers.0``, ..., ``norm``, ``output`` as torchtitan names them."""

    @property
    def layers(self) -> tuple[int, ...]:
        """Indices of the transformer layers this stage holds."""
        return tuple(int(m.split(".", 1)[1]) for m in self.modules if m.startswith("layers."))


@dataclass(frozen=True)
class PipelineLayout:
    degree: int
    schedule: str
    """The schedule's name (``1F1B``, ``Interleaved1F1B``, ...), or ``csv`` for a schedule file."""
    microbatch_size: int
    microbatches: int
    stages: tuple[PipelineStage, ...]

    @property
    def stages_per_rank(self) -> int:
        return len(self.stages) // self.degree

    @property
    def zero_bubble(self) -> bool:
        return self.schedule in ZERO_BUBBLE_SCHEDULES

    def stage_of_layer(self) -> dict[int, int]:
        """Layer index -> the stage that holds it."""
        return {layer: stage.index for stage in self.stages for layer in stage.layers}

    def stages_of_rank(self, pp_rank: int) -> tuple[PipelineStage, ...]:
        return tuple(s for s in self.stages if s.pp_rank == pp_rank)

    def rank_stages(self) -> tuple[str, ...]:
        """Per PP rank, which stages it holds (``rank 0: stages 0 and 2``), for notes."""
        return tuple(
            f"rank {r}: stage{'s' if self.stages_per_rank > 1 else ''} "
            + " and ".join(str(s.index) for s in self.stages_of_rank(r))
            for r in range(self.degree)
        )


def schedule_class(name: str) -> type:
    """torch's schedule class for a torchtitan schedule name; SpecError for an unknown one."""
    from torch.distributed.pipelining.schedules import get_schedule_class

    try:
        return get_schedule_class(name)
    except ValueError as exc:
        raise SpecError(
            f"parallelism.pipeline_parallel_schedule = {name!r}: {exc}",
            hint='use one of torch.distributed.pipelining\'s schedules, e.g. "1F1B" or '
            '"Interleaved1F1B"',
        ) from None


def is_single_stage(name: str) -> bool:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    return issubclass(schedule_class(name), PipelineScheduleSingle)


def virtual_stage_count(p: ParallelSpec, num_layers: int) -> int:
    """How many stages torchtitan splits the model into (``_get_pipeline_metadata``)."""
    pp, per_stage = p.pipeline_parallel_degree, p.pipeline_parallel_layers_per_stage
    single = is_single_stage(p.pipeline_parallel_schedule)
    if per_stage is None:
        return pp * (1 if single else 2)
    first, last = (
        p.pipeline_parallel_first_stage_less_layers,
        p.pipeline_parallel_last_stage_less_layers,
    )
    stages = math.ceil((num_layers + first + last) / per_stage)
    where = f"pipeline_parallel_layers_per_stage = {per_stage} with {num_layers} layers"
    if stages % pp:
        raise SpecError(
            f"{where} makes {stages} stages, not a multiple of pipeline_parallel_degree = {pp}",
            hint=f"pick layers per stage that make a multiple of {pp} stages",
        )
    if single and stages != pp:
        raise SpecError(
            f"{where} makes {stages // pp} stages per rank, but the single-stage schedule "
            f"{p.pipeline_parallel_schedule} runs exactly 1",
            hint=f"set pipeline_parallel_layers_per_stage to {num_layers // pp} or more, or use "
            "a multi-stage schedule (Interleaved1F1B)",
        )
    if not single and stages // pp < 2:
        raise SpecError(
            f"{where} makes {stages // pp} stage(s) per rank, but the multi-stage schedule "
            f"{p.pipeline_parallel_schedule} needs at least 2",
            hint="lower pipeline_parallel_layers_per_stage",
        )
    return stages


def modules_per_stage(
    num_stages: int, num_layers: int, input_weight: int = 1, output_weight: int = 1
) -> list[list[str]]:
    """torchtitan's ``generate_llm_fqn_per_model_part``: the module names of each stage."""
    if num_stages < 1:
        raise SpecError(
            "the pipeline needs at least one stage", hint="set pipeline_parallel_degree >= 1"
        )
    layer = [f"layers.{i}" for i in range(num_layers)]
    if num_stages == 1:
        return [[*INPUT_MODULES, *layer, *OUTPUT_MODULES]]
    effective = num_layers + input_weight + output_weight
    per_stage, extra = divmod(effective, num_stages)
    hint = (
        "use fewer stages, or lower pipeline_parallel_first_stage_less_layers / "
        "pipeline_parallel_last_stage_less_layers"
    )
    if per_stage == 0:
        raise SpecError(
            f"{num_stages} pipeline stages for {effective} effective layers ({num_layers} layers "
            f"+ {input_weight} for the embeddings + {output_weight} for norm and output) leave "
            "stages empty",
            hint=hint,
        )
    for name, weight in (("first", input_weight), ("last", output_weight)):
        if weight > per_stage:
            raise SpecError(
                f"pipeline_parallel_{name}_stage_less_layers = {weight} exceeds the {per_stage} "
                f"layers per stage of {num_stages} stages",
                hint=hint,
            )
    out: list[list[str]] = []
    current = 0
    for index in range(num_stages):
        count = per_stage + (1 if index < extra else 0)
        head: list[str] = []
        tail: list[str] = []
        if index == 0:
            head, count = list(INPUT_MODULES), count - input_weight
        elif index == num_stages - 1:
            tail, count = list(OUTPUT_MODULES), count - output_weight
        taken = layer[current : current + count]
        current += len(taken)
        out.append([*head, *taken, *tail])
    return out


def stage_ranks(pp_degree: int, schedule: str, num_stages: int) -> list[int]:
    """The PP rank that runs each stage (torchtitan's rank-to-stage mapping, inverted)."""
    per_rank = num_stages // pp_degree
    owner = [0] * num_stages
    for rank in range(pp_degree):
        if schedule in V_SCHEDULES:
            if per_rank != 2:
                raise SpecError(
                    f"the V schedule {schedule} runs 2 stages per rank, not {per_rank}",
                    hint="drop pipeline_parallel_layers_per_stage, or set it to make "
                    f"{2 * pp_degree} stages",
                )
            mine: Sequence[int] = (rank, num_stages - 1 - rank)
        else:
            mine = [rank + s * pp_degree for s in range(per_rank)]
        for stage in mine:
            owner[stage] = rank
    return owner


def pipeline_layout(p: ParallelSpec, num_layers: int, local_batch_size: int) -> PipelineLayout:
    """The layout of a spec whose ``pipeline_parallel_degree`` is > 1 (or 1: one stage)."""
    csv = p.pipeline_parallel_schedule_csv
    schedule = p.pipeline_parallel_schedule
    stages = virtual_stage_count(p, num_layers)
    names = modules_per_stage(
        stages,
        num_layers,
        p.pipeline_parallel_first_stage_less_layers,
        p.pipeline_parallel_last_stage_less_layers,
    )
    mb = p.pipeline_parallel_microbatch_size
    if mb < 1 or local_batch_size % mb:
        raise SpecError(
            f"training.local_batch_size = {local_batch_size} is not divisible by "
            f"parallelism.pipeline_parallel_microbatch_size = {mb}",
            hint="make the batch size a multiple of the microbatch size",
        )
    owners = stage_ranks(p.pipeline_parallel_degree, schedule, stages)
    return PipelineLayout(
        degree=p.pipeline_parallel_degree,
        schedule="csv" if csv else schedule,
        microbatch_size=mb,
        microbatches=local_batch_size // mb,
        stages=tuple(
            PipelineStage(index=i, pp_rank=owners[i], modules=tuple(names[i]))
            for i in range(stages)
        ),
    )


def pipeline_notes(layout: PipelineLayout) -> tuple[str, ...]:
    """What a scan of a pipeline-parallel spec reproduces, and what it does not."""
    ranks = ", ".join(layout.rank_stages())
    notes = [
        f"pipeline: PP {layout.degree}, schedule {layout.schedule}, {len(layout.stages)} stages "
        f"({ranks}), {layout.microbatches} microbatch(es) of {layout.microbatch_size}; every "
        "stage's blocks are set up as their rank sets them up (the layer-selective AC counter "
        "counts the rank's own blocks, FSDP2 keeps parameters unsharded between forward and "
        "backward) and captured with microbatch inputs; the schedule itself (each rank's own "
        "stages fed the hidden states it sends, the loss on the last stage) is trained for real "
        "only with the recompile probe on ('pipeline schedule:' notes)"
    ]
    if layout.zero_bubble:
        notes.append(
            f"pipeline: {layout.schedule} splits each stage's backward into input and weight "
            "gradients (torch.autograd.grad in pieces); the capture runs one whole backward, "
            "the schedule run (with the recompile probe) the split one"
        )
    return tuple(notes)


def split_stage(model: Any, stage: PipelineStage) -> Any:
    """The model chunk one stage holds, as torchtitan's ``_split_module`` cuts it: a deep copy
    with the layers of other stages deleted from the block container (keys kept, so FQNs stay
    the whole model's) and every other top-level module set to None (the decoder's forward
    skips a missing embedding, norm or output)."""
    import copy

    from torch import nn

    chunk = copy.deepcopy(model)
    keep = set(stage.modules)
    for name, child in list(chunk.named_children()):
        if isinstance(child, nn.ModuleDict):
            for key in list(child.keys()):
                if f"{name}.{key}" not in keep:
                    del child[key]
        elif isinstance(child, nn.ModuleList):
            setattr(
                chunk,
                name,
                nn.ModuleList(m for i, m in enumerate(child) if f"{name}.{i}" in keep),
            )
        elif name not in keep:
            setattr(chunk, name, None)
    return chunk


def build_schedule(
    layout: PipelineLayout, modules: Sequence[tuple[PipelineStage, Any]], group: Any, loss_fn: Any
) -> Any:
    """torch's schedule for this rank's stages, as torchtitan's ``build_pipeline_schedule``
    builds it: the class the config names, ``layout.microbatches`` microbatches, the loss on
    the last stage, gradients not scaled by the schedule (the loss is). ``modules``: (stage, its
    chunk) for each stage of this rank, in stage order."""
    import torch
    from torch.distributed.pipelining import PipelineStage as TorchStage

    if layout.schedule == "csv":
        raise SpecError(
            "parallelism.pipeline_parallel_schedule_csv: not supported yet: gbdoctor runs "
            "torch's named schedules only (a CSV schedule needs torch's private runtime schedule)",
            hint="set pipeline_parallel_schedule to the schedule the CSV was made from",
        )
    device = torch.device("cpu")
    for _, module in modules:
        device = next(module.parameters()).device
        break
    stages = [
        TorchStage(module, stage.index, len(layout.stages), device, group=group)
        for stage, module in modules
    ]
    cls = schedule_class(layout.schedule)
    return cls(
        stages[0] if is_single_stage(layout.schedule) else stages,
        n_microbatches=layout.microbatches,
        loss_fn=loss_fn,
        scale_grads=False,
    )
