"""A torchtitan >= 0.3 run (``--torchtitan MODULE:CONFIG`` plus its own overrides) as a
``Spec``: the run name and overrides are the spec's path and ``registry_run``; the sections
every stage reads (parallelism, activation checkpointing, compile, training) are filled from the
config torchtitan's own ``ConfigManager`` loaded, so world size, keys, baselines and reports
work as for a TOML spec.

Refused here, before any rank starts: ``--set`` keys other than the capture settings, and the
combination that fails on every rank (``spmd_types_refusal``).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.common.specfile import capture_settings
from gbdoctor.records import (
    ACSpec,
    CompileSpec,
    ModelSpec,
    ParallelSpec,
    Spec,
    ToolSpec,
    TrainingSpec,
)

DEFAULT_BATCH_SIZE = 2
DEFAULT_SEQ_LEN = 64
"""Capture shape unless ``--set gbdoctor.batch_size/seq_len`` says otherwise: torchtitan's
debug configs train 8 x 2048, whose eager FlexAttention math on CPU needs GiBs per layer. Under
PP the batch is the config's microbatch size (what a stage's blocks see)."""
"""The ``--set gbdoctor.KEY=N`` a torchtitan run accepts; its own keys go as --section.key."""
SPMD_OVERRIDE = "--parallelism.spmd_backend partial_dtensor"


def spec_for_run(
    framework: str,
    name: str,
    args: Sequence[str],
    overrides: Sequence[str] = (),
    *,
    simulate: bool = False,
    world_size: int | None = None,
) -> Spec:
    """The spec of ``MODULE:CONFIG`` with torchtitan's ``args``; ``overrides``: ``--set``."""
    from gbdoctor.frameworks.torchtitan.config import load_config, parse_run, world_size_for

    capture = _capture_settings(overrides)
    run = parse_run(name, tuple(args))
    config = load_config(run)
    world = world_size_for(config) if world_size is None else launch_world(config, world_size)
    refusal = spmd_types_refusal(config, world)
    if refusal is not None:
        raise SpecError(refusal, hint=f"add {SPMD_OVERRIDE} after the run name")
    p = config.parallelism
    return Spec(
        path=f"torchtitan:{run.label}",
        model=ModelSpec(name=config.model_spec.name, flavor=run.config),
        training=TrainingSpec(
            local_batch_size=config.training.local_batch_size,
            seq_len=config.training.seq_len,
            steps=config.training.steps,
            mixed_precision_param=config.training.mixed_precision_param,
            mixed_precision_reduce=config.training.mixed_precision_reduce,
            max_norm=float(config.training.max_norm),
            seed=config.debug.seed or 0,
        ),
        parallelism=ParallelSpec(
            data_parallel_replicate_degree=p.data_parallel_replicate_degree,
            data_parallel_shard_degree=_dp_shard(config, world),
            expert_parallel_degree=p.expert_parallel_degree,
            tensor_parallel_degree=p.tensor_parallel_degree,
            context_parallel_degree=p.context_parallel_degree,
            pipeline_parallel_degree=p.pipeline_parallel_degree,
            # What torchtitan's own pipeline code reads (stages, microbatches, plan per stage).
            pipeline_parallel_schedule=p.pipeline_parallel_schedule,
            pipeline_parallel_schedule_csv=p.pipeline_parallel_schedule_csv or "",
            pipeline_parallel_microbatch_size=p.pipeline_parallel_microbatch_size,
            pipeline_parallel_layers_per_stage=p.pipeline_parallel_layers_per_stage,
            pipeline_parallel_first_stage_less_layers=p.pipeline_parallel_first_stage_less_layers,
            pipeline_parallel_last_stage_less_layers=p.pipeline_parallel_last_stage_less_layers,
            dp_shard=_dp_shard(config, world),
            world_size=world,
        ),
        activation_checkpoint=_ac_spec(config.activation_checkpoint),
        compile=CompileSpec(
            enable=config.compile.enable,
            components=tuple(config.compile.components),
            backend=config.compile.backend,
            backend_set=True,
        ),
        gbdoctor=ToolSpec(
            strategy="torchtitan",
            # Under PP the blocks only ever see a microbatch (as for TOML specs).
            batch_size=int(
                capture.get(
                    "batch_size",
                    p.pipeline_parallel_microbatch_size
                    if p.pipeline_parallel_degree > 1
                    else DEFAULT_BATCH_SIZE,
                )
            ),
            seq_len=int(capture.get("seq_len", DEFAULT_SEQ_LEN)),
            device="cpu",
            timeout_s=float(capture.get("timeout_s", ToolSpec().timeout_s)),
            framework=framework,
            simulate=simulate,
        ),
        registry_run=run,
    )


def launch_world(config: Any, world_size: int) -> int:
    """``--world-size``: the ranks torchtitan is launched on, which only a config that leaves
    ``data_parallel_shard_degree`` to the launch (-1) takes; torchtitan's own ``ParallelDims``
    checks that the degrees divide it."""
    from torchtitan.distributed import ParallelDims

    p = config.parallelism
    if p.data_parallel_shard_degree != -1:
        raise SpecError(
            f"--world-size {world_size}: this config fixes every parallel degree "
            f"(data_parallel_shard_degree {p.data_parallel_shard_degree}), so it runs on the "
            "ranks they multiply to",
            hint="drop --world-size, or add --parallelism.data_parallel_shard_degree -1 after "
            "the run name",
        )
    try:
        ParallelDims.from_config(p, world_size)
    except (AssertionError, ValueError) as exc:
        raise SpecError(
            f"torchtitan rejects --world-size {world_size} for this parallelism: {exc}",
            hint="choose a world size the fixed degrees (TP, CP, PP, replicate) divide",
        ) from exc
    return world_size


def _dp_shard(config: Any, world: int) -> int:
    p = config.parallelism
    others = (
        p.data_parallel_replicate_degree
        * p.context_parallel_degree
        * p.tensor_parallel_degree
        * p.pipeline_parallel_degree
    )
    return max(1, world // others)


def _capture_settings(overrides: Sequence[str]) -> dict[str, float]:
    return capture_settings(
        overrides, "a torchtitan run", "torchtitan's own keys go as --section.key VALUE"
    )


def _ac_spec(ac: Any) -> ACSpec:
    """torchtitan 0.3's AC config class as the v0.2 vocabulary: none, full, selective per op
    (``MemoryBudgetAC`` keeps its class name as the option)."""
    if ac is None:
        return ACSpec(mode="none", selective_ac_option="")
    kind = type(ac).__qualname__.split(".")[0]
    if kind == "FullAC":
        return ACSpec(mode="full", selective_ac_option="")
    if kind == "SelectiveAC":
        return ACSpec(
            mode="selective",
            selective_ac_option="op",
            per_op_sac_force_recompute_mm_shapes_by_fqns=tuple(
                ac.force_recompute_mm_shapes_by_fqns
            ),
        )
    return ACSpec(mode="selective", selective_ac_option=kind)


def spmd_types_refusal(config: Any, world: int) -> str | None:
    """The message when torchtitan's ``spmd_types`` backend meets FSDP2 on more than one rank,
    on a torch whose ``fully_shard`` rejects it, else None.

    Under ``spmd_types`` torchtitan's ``model.parallelize`` leaves parameters on non-model-
    parallel axes plain (SPMD-typed) tensors and passes ``dp_mesh_dims`` to ``fully_shard``;
    torch 2.13's FSDP2 then refuses every plain parameter ("When dp_mesh_dims is provided, all
    parameters must be DTensors ...") on every rank. Read from the installed torch's FSDP2 code
    (the check that raises it), so a torch that accepts plain tensors there passes."""
    p = config.parallelism
    # torchtitan applies fully_shard at any degree (its MixedPrecisionPolicy); on one rank no
    # parameter is left plain, on more (FSDP, TP, EP alike; measured with TP 8 and FSDP 1) some are.
    if p.spmd_backend != "spmd_types" or world < 2 or not fsdp_rejects_plain_params():
        return None
    import torch

    return (
        f"torchtitan's default parallelism.spmd_backend 'spmd_types' fails in FSDP2's "
        f"fully_shard on torch {torch.__version__} (plain-tensor parameters on an SPMD mesh) "
        f"as soon as it runs on more than one rank ({world} ranks)"
    )


def fsdp_rejects_plain_params() -> bool:
    """Whether this torch's FSDP2 refuses a plain-tensor parameter when ``dp_mesh_dims`` is
    given (the source of the check; False when FSDP2 has no such check or cannot be read)."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

        source = inspect.getsource(FSDPParam)
    except (ImportError, OSError, TypeError):
        return False
    return "When dp_mesh_dims is provided, all parameters must be" in source
