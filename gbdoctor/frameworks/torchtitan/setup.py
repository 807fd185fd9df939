"""The installed torchtitan as the setup (torchtitan >= 0.3: Python config registries).

The model is built and set up by torchtitan's own code: its config (``config.py``: the
``ConfigManager`` with ``--module`` / ``--config`` plus ``--section.key`` overrides, the config's
``model_spec``, ``update_from_config``), the spec's ``parallelize_fn`` (TP/EP, AC, compile, FSDP2
in torchtitan's order), ``init_weights``, the loss and optimizer builders and the
``post_optimizer_build_fn`` (MoE load balancing). The one change: while ``parallelize_fn`` runs,
``nn.Module.compile`` and ``torch.compile`` are gbdoctor's recording compile (``recording.py``), so
a region is compiled exactly where torchtitan compiles it, with a backend that records.

What torchtitan needs on a CPU machine is provided without changing where breaks happen
(``cpu.py``), plus SUM reductions for FSDP2 on gloo and random token ids instead of its
dataloader (here).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch
import torch.nn as nn

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.torchtitan.config import (
    load_config,
    model_on_meta,
    registry_run,
    torchtitan_version,
)
from gbdoctor.frameworks.torchtitan.cpu import cpu_stand_ins
from gbdoctor.frameworks.torchtitan.pipeline import (
    PartsView,
    Pipelined,
    parallelize_kwargs,
    pipeline,
    pipeline_note,
    pipeline_step,
    stage_slots,
)
from gbdoctor.frameworks.torchtitan.recording import RecordingCompile, block_slots
from gbdoctor.records import Spec
from gbdoctor.setup.apply import BlockSlot
from gbdoctor.setup.pipeline import PipelineLayout


@dataclass
class TitanMeshes:
    """What ``build`` returns beside the model: torchtitan's loaded config and its
    ``ParallelDims`` (the seam's "meshes"; ``set_up`` hands both to its ``parallelize_fn``)."""

    config: Any
    parallel_dims: Any
    device: torch.device
    simulated: bool = False
    """A simulated scan's: the model stays on meta through ``set_up`` (no weights are
    initialized), and the scan materializes it as fake tensors afterwards
    (``scan.simulate.simulated_setup``)."""


@dataclass
class TitanSetup:
    """A model as torchtitan's own code set it up, plus what a training step needs (the fields
    the scan, inspect and run stages read of any framework's setup)."""

    config: Any
    model: nn.Module
    blocks: list[BlockSlot]
    optimizer: Any
    meshes: TitanMeshes
    strategy: Any
    loss_fn: Any
    trainer_state: Any
    dynamo_flags: tuple[tuple[str, Any], ...]
    hooks: list[Any] = field(default_factory=list)
    dynamo_restore: tuple[tuple[str, Any], ...] = ()
    """The Dynamo settings torchtitan's setup changed, as they were before: its settings are in
    effect inside ``step_context`` only, so the next setup in this process (or another
    framework's) starts from the same state."""
    fsdp: bool = False
    notes: tuple[str, ...] = ()
    loss_parallel: bool = False
    engine: Any = None
    own_loss: bool = True
    copies_said: bool = False
    """torchtitan's loss (its chunked loss applies the LM head) turns the output into the loss."""
    pipelined: Pipelined | None = None
    """PP > 1: what torchtitan's ``pipelining_fn`` returned on this rank (``model`` is then a
    view of the rank's parts, ``pipeline.PartsView``)."""

    @property
    def pipeline(self) -> PipelineLayout | None:
        """The layout the scan reports (stages, schedule, microbatches): torchtitan's split."""
        return self.pipelined.layout if self.pipelined is not None else None

    @property
    def own_pipeline(self) -> bool:
        """Whether the framework's own pipeline code set this rank up (``interface.OwnPipeline``)."""
        return self.pipelined is not None

    @property
    def ac_enabled(self) -> bool:
        return any(slot.ac_wrapped for slot in self.blocks)

    def batch(
        self, tokens: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any], torch.Tensor]:
        """Through torchtitan's own ``post_dataloading_process`` (positions, attention masks,
        SPMD annotations)."""
        from torchtitan.trainer import Trainer

        positions = torch.arange(tokens.shape[1]).repeat(tokens.shape[0], 1)
        inputs, labels, extra = Trainer.post_dataloading_process(
            self.trainer_state, {"input": tokens, "positions": positions}, labels
        )
        return inputs, extra, labels


class _TitanModel(Protocol):
    """The members of torchtitan's model (``models/common/decoder.py``) this setup uses beyond
    nn.Module's; torchtitan ships no type information (its trainer casts the same way)."""

    _skip_lm_head: bool

    def init_weights(self, *, buffer_device: torch.device | None = None) -> None: ...


def _dynamo_settings() -> dict[str, Any]:
    from gbdoctor.torch_compat import dynamo_config

    return {
        k: v
        for k, v in dynamo_config().get_config_copy().items()
        if isinstance(v, (bool, int, float, str, type(None)))
    }


def build(
    spec: Spec, device_type: str, *, simulated: bool = False
) -> tuple[nn.Module, TitanMeshes]:
    """torchtitan's config and its model on meta (it materializes after parallelizing, or, in a
    simulation, becomes fake tensors after the setup)."""
    run = registry_run(spec)
    config = load_config(run)
    if simulated and config.parallelism.pipeline_parallel_degree > 1:
        # pipelining_fn deep-copies the model per stage (_split_module) before the simulation
        # can swap its meta tensors for fakes, and its stages need a real PP process group.
        raise SpecError(
            "a simulated scan cannot run torchtitan's own pipeline code "
            f"(pipeline_parallel_degree {config.parallelism.pipeline_parallel_degree}): it "
            "copies the model per stage and sends between real PP ranks",
            hint="scan on real ranks (drop --simulate; shrink the other degrees to fit), or "
            "simulate with --parallelism.pipeline_parallel_degree 1",
        )
    with cpu_stand_ins(device_type):
        model, parallel_dims = _build_model(spec, config)
    if simulated:
        _refuse_unsimulatable(model)
    return model, TitanMeshes(config, parallel_dims, torch.device(device_type), simulated)


def _refuse_unsimulatable(model: nn.Module) -> None:
    """A simulation runs fake CPU tensors, which have no values: torchtitan's varlen attention
    builds its masks from the token positions' values (``nonzero`` on document starts,
    ``create_varlen_metadata_for_document``), and its kernels exist only on CUDA."""
    from torchtitan.models.common.attention import VarlenAttention

    if any(isinstance(m, VarlenAttention) for m in model.modules()):
        raise SpecError(
            "this config's varlen attention cannot be simulated: its masks are computed from "
            "the token positions' values and its flash-attention kernels exist only on CUDA",
            hint="scan it on a CUDA machine, or simulate a config with FlexAttention attention",
        )


def _build_model(spec: Spec, config: Any) -> tuple[nn.Module, Any]:
    import torch.distributed as dist
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils

    world = dist.get_world_size()
    try:
        parallel_dims = ParallelDims.from_config(config.parallelism, world)
    except (AssertionError, ValueError) as exc:
        raise SpecError(
            f"torchtitan rejects this parallelism on {world} rank(s): {exc}",
            hint="adjust --parallelism.* degrees",
        ) from exc
    dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
    torch.manual_seed(spec.training.seed)
    model = model_on_meta(config)
    return model, parallel_dims


def set_up(model: nn.Module, meshes: TitanMeshes, strategy: Any, compile_fn: Any) -> TitanSetup:
    """torchtitan's ``parallelize_fn`` (with the recording compile when ``compile_fn`` belongs
    to a capture session), then ``strategy``'s changes (eager: nothing compiled; a plan: its
    per-layer compile and Dynamo flags, ``layer_plan``), weights, loss, optimizer."""
    with cpu_stand_ins(meshes.device.type):
        return _set_up(model, meshes, strategy, compile_fn)


def _set_up(model: nn.Module, meshes: TitanMeshes, strategy: Any, compile_fn: Any) -> TitanSetup:
    from torchtitan.components.loss import ChunkedLossWrapper
    from torchtitan.distributed import utils as dist_utils

    from gbdoctor.frameworks.torchtitan.cudagraph_wrappers import wrapper_graph_check
    from gbdoctor.frameworks.torchtitan.layer_plan import apply_layer_plan
    from gbdoctor.frameworks.torchtitan.whole_model import (
        compile_blocks_when_traced_whole,
        simple_fsdp_note,
        unapplied_ac_note,
    )

    config, parallel_dims, device = meshes.config, meshes.parallel_dims, meshes.device.type
    if strategy.compile is not None:
        config.compile.enable = strategy.compile
    spec = config.model_spec
    model_config = spec.model
    before = _dynamo_settings()
    # A capture session's compile_fn comes with the session: torchtitan >= 0.3 compiles in
    # place (Module.compile), which the session does with compile_in_place.
    session = getattr(compile_fn, "__self__", None)
    if session is not None and wrapper_graph_check not in session.graph_checks:
        session.graph_checks.append(wrapper_graph_check)  # torchtitan's own CUDA-graph wrappers
    recorder = RecordingCompile(model, session)
    pipelined: Pipelined | None = None
    # Under PP the schedule holds the loss, so torchtitan builds it first (its trainer too).
    loss_fn = config.loss.build(compile_config=config.compile) if parallel_dims.pp_enabled else None
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    with recorder.installed():
        try:
            if loss_fn is not None:
                pipelined = pipeline(model, config, parallel_dims, device, recorder, loss_fn)
                parts = pipelined.parts
            else:
                model = spec.parallelize_fn(model, **parallelize_kwargs(config, parallel_dims))
                parts = [model]
        except ImportError as exc:  # e.g. --compile.enable_autoparallel: 'autoparallel'
            raise SpecError(
                f"torchtitan's parallelize_fn needs {exc.name or exc}, which is not installed",
                hint="install it, or drop the option that asks for it",
            ) from exc
        per_part = []
        for part in parts:  # a region's FQN is read on the part that holds it
            recorder.model = part
            per_part.append(
                compile_blocks_when_traced_whole(part, recorder, config.compile, strategy)
            )
            if strategy.layers or strategy.flags:
                apply_layer_plan(part, strategy.layers, strategy.flags, config.compile.backend)
        per_block = next((n for n in per_part if n), None)
    after = _dynamo_settings()
    flags = tuple(sorted((k, v) for k, v in after.items() if before.get(k) != v))
    restore = tuple((k, before[k]) for k, _ in flags if k in before)
    _set_dynamo(restore)  # in effect inside step_context only (inspect enters none)

    for part in parts:  # as the trainer does, per part under PP
        if not meshes.simulated:
            part.to_empty(device=device)
            with torch.no_grad():
                cast(_TitanModel, part).init_weights(buffer_device=None)
        part.train()
    fsdp = any([_sum_reductions_on_gloo(part) for part in parts])  # a list: every part is set
    simple_fsdp = simple_fsdp_note(parts[0])

    if loss_fn is None:
        loss_fn = config.loss.build(compile_config=config.compile)
    # Under PP only the last stage has the LM head (torchtitan's trainer does the same).
    if isinstance(loss_fn, ChunkedLossWrapper) and (pipelined is None or pipelined.has_last):
        loss_fn.set_lm_head(parts[-1].lm_head)
        cast(_TitanModel, parts[-1])._skip_lm_head = True
    optimizer = config.optimizer.build(model_parts=parts)
    if spec.post_optimizer_build_fn is not None:
        spec.post_optimizer_build_fn(optimizer, parts, parallel_dims)
    trainer_state = types.SimpleNamespace(
        config=config,
        model_config=model_config,
        model_parts=parts,
        parallel_dims=parallel_dims,
        ntokens_seen=0,
        loss_fn=loss_fn,
        device=torch.device(device),
        train_context=dist_utils.get_spmd_context(
            parallel_dims=parallel_dims, spmd_typechecking=False
        ),
    )

    if pipelined is not None:
        _schedule_state(trainer_state, pipelined)
        assert embedding is not None  # a token LM: pipelining_fn splits at tok_embeddings
        model = PartsView(parts, embedding)
    ac = config.activation_checkpoint
    ac_label = "sac" if ac is not None and type(ac).__qualname__.startswith("Selective") else "ac"
    blocks = block_slots(model, recorder.regions, ac_label)
    notes = [stand_in_note()]
    if pipelined is not None:
        blocks = stage_slots(blocks, pipelined)
        notes.append(pipeline_note(pipelined, torchtitan_version()))
    notes += [n for n in (per_block, simple_fsdp, unapplied_ac_note(config, blocks)) if n]
    if not recorder.regions and strategy.compile is not False:
        notes.append("torchtitan compiled nothing under this config (pass --compile.enable)")
    return TitanSetup(
        config=config,
        model=model,
        blocks=blocks,
        optimizer=optimizer,
        meshes=meshes,
        strategy=strategy,
        loss_fn=loss_fn,
        trainer_state=trainer_state,
        dynamo_flags=flags,
        dynamo_restore=restore,
        fsdp=fsdp or simple_fsdp is not None,
        notes=tuple(notes),
        pipelined=pipelined,
    )


def _schedule_state(state: Any, pipelined: Pipelined) -> None:
    """What the trainer's ``pp_forward_backward_step`` reads of the trainer beyond a step's."""
    import functools

    from torchtitan.trainer import Trainer

    state.pp_schedule = pipelined.schedule
    state.pp_has_first_stage = pipelined.has_first
    state.pp_has_last_stage = pipelined.has_last
    state.num_pipeline_parallel_microbatches = pipelined.layout.microbatches
    state.post_dataloading_process = functools.partial(Trainer.post_dataloading_process, state)


def stand_in_note() -> str:
    return (
        f"set up by torchtitan {torchtitan_version()}'s own code; CPU stand-ins: triton "
        "stand-in while torchtitan loads, 'cpu' device type, FlexAttention's CPU-backward guard "
        "lifted, FSDP2 SUM reductions on gloo, random token ids instead of its dataloader"
    )


def _sum_reductions_on_gloo(model: nn.Module) -> bool:
    """gloo has no PREMUL_SUM, which FSDP2 uses for torchtitan's gradient divide factor: the
    same division as SUM plus an eager post-scale (backward, outside every compiled region)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if dist.get_backend() == "gloo":
        for module in sharded:
            module.set_force_sum_reduction_for_comms(True)
    return bool(sharded)


@contextlib.contextmanager
def step_context(setup: TitanSetup) -> Iterator[None]:
    """torchtitan set its Dynamo globals itself (``apply_compile``); the CPU stand-ins and its
    SPMD train context stay on while steps and captures run. torchtitan never unsets those
    globals: they are put back on exit (a plan's re-scans run in one process)."""
    _set_dynamo(setup.dynamo_flags)
    try:
        with cpu_stand_ins(setup.meshes.device.type), setup.trainer_state.train_context():
            yield
    finally:
        _set_dynamo(setup.dynamo_restore)


def _set_dynamo(settings: tuple[tuple[str, Any], ...]) -> None:
    from gbdoctor.torch_compat import dynamo_config

    config = dynamo_config()
    for name, value in settings:
        setattr(config, name, value)


def train_step(setup: TitanSetup, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    """A scan's eager step: under PP torchtitan's schedule step (``tokens``: one microbatch, the
    capture shape), then the optimizer; else ``timed_train_step``'s."""
    if setup.pipelined is None:
        return timed_train_step(setup, tokens, labels)[0]
    loss = pipeline_step(setup.trainer_state, tokens, labels)
    setup.optimizer.step()
    setup.optimizer.zero_grad()
    return float(loss.detach().sum())


def timed_train_step(
    setup: TitanSetup, tokens: torch.Tensor, labels: torch.Tensor, sync: Any = None
) -> tuple[float, tuple[float, float, float]]:
    """torchtitan's ``_forward_backward_body``, then the optimizer step (whose pre-step hook is
    its MoE load balancing), split into (forward with the loss, backward, optimizer) seconds.
    The body stays torchtitan's own: the forward/backward boundary is read when its loss
    function returns (it is wrapped for the call), so the forward includes the loss."""
    import time

    from torchtitan.trainer import Trainer

    def now() -> float:
        if sync is not None:
            sync()
        return time.perf_counter()

    if setup.pipelined is not None:
        # A timed step's tokens are the rank's batch (run's tokens per second); the schedule's
        # step takes that many rows per microbatch, so its throughput would be misread.
        raise SpecError(
            "run / price / timeline do not time torchtitan's own pipeline schedule yet: its "
            f"step trains {setup.pipelined.layout.microbatches} microbatches of the batch given",
            hint="scan this run, or time it with --parallelism.pipeline_parallel_degree 1",
        )
    inputs, extra, labels = setup.batch(tokens, labels)
    if not setup.copies_said:  # what torchtitan's CUDA-graph wrappers would copy per replay
        from gbdoctor.frameworks.torchtitan.cudagraph_wrappers import step_copies_note

        setup.notes += (step_copies_note(setup.config, inputs, labels, extra),)
        setup.copies_said = True
    state = setup.trainer_state
    loss_fn = state.loss_fn
    marks: list[float] = []

    def timed_loss(*args: Any, **kwargs: Any) -> Any:
        out = loss_fn(*args, **kwargs)
        marks.append(now())
        return out

    state.loss_fn = timed_loss
    try:
        t0 = now()
        loss = Trainer._forward_backward_body(
            state, inputs, labels, torch.tensor(labels.numel()), extra
        )
        t2 = now()
    finally:
        state.loss_fn = loss_fn
    setup.optimizer.step()
    setup.optimizer.zero_grad()
    t3 = now()
    t1 = marks[-1] if marks else t2
    return float(loss.detach()), (t1 - t0, t2 - t1, t3 - t2)
