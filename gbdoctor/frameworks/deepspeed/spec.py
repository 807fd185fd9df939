"""The ``[deepspeed]`` spec section: a DeepSpeed config as a TOML table, or the user's DeepSpeed
JSON (``[gbdoctor] deepspeed_config``), filled in where gbdoctor must and validated by DeepSpeed's
own config classes; what a DeepSpeed spec cannot set up is refused (one-line SpecError, exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from gbdoctor.frameworks.deepspeed.setup import fill_config, load_config_file, validate_config
from gbdoctor.frameworks.interface import SpecContext
from gbdoctor.records import DeepSpeedSpec, Spec

DEEPSPEED_SECTION = "deepspeed"
"""A DeepSpeed config as a TOML table; its keys are validated by DeepSpeed's own config classes."""


def refuse_deepspeed_keys(spec: Spec, data: Mapping[str, Any], ctx: SpecContext) -> None:
    """A spec of another framework names no DeepSpeed config."""
    tool = spec.gbdoctor
    table = data.get(DEEPSPEED_SECTION)
    if table is not None or tool.deepspeed_config:
        what = "a [deepspeed] table" if table is not None else "deepspeed_config"
        ctx.fail(
            f'{what} is only read with [gbdoctor] framework = "deepspeed" (framework is '
            f"'{tool.framework}')",
            'set framework = "deepspeed" in [gbdoctor]',
        )


def check_deepspeed_spec(
    spec: Spec, data: Mapping[str, Any], strategy_set: bool, spec_dir: str, ctx: SpecContext
) -> Spec:
    """A ``framework = "deepspeed"`` spec: its DeepSpeed config (a ``[deepspeed]`` table or the
    ``deepspeed_config`` JSON file), filled and validated by DeepSpeed's own config classes."""
    tool = spec.gbdoctor
    table = data.get(DEEPSPEED_SECTION)
    if spec.parallelism.pipeline_parallel_degree > 1:
        ctx.fail(
            f"{ctx.where('parallelism', 'pipeline_parallel_degree')} = "
            f"{spec.parallelism.pipeline_parallel_degree}: DeepSpeed's pipeline engine is not "
            "supported (gbdoctor sets up its ZeRO engine)",
            "set parallelism.pipeline_parallel_degree = 1 to scan the blocks under ZeRO",
        )

    if table is not None and tool.deepspeed_config:
        ctx.fail(
            "both a [deepspeed] table and deepspeed_config are given",
            "keep one: the table, or the path of your DeepSpeed JSON",
        )
    if table is None and not tool.deepspeed_config:
        ctx.fail(
            'framework = "deepspeed" needs a DeepSpeed config',
            "add a [deepspeed] table (e.g. zero_optimization = { stage = 3 }) or "
            'deepspeed_config = "ds_config.json" in [gbdoctor]',
        )
    if tool.deepspeed_config:
        path = os.path.normpath(os.path.join(spec_dir, os.path.expanduser(tool.deepspeed_config)))
        raw, source = load_config_file(path, ctx.path), tool.deepspeed_config
    else:
        # The loader checked every section is a table; one of them is this one.
        raw, source = dict(table or {}), f"[{DEEPSPEED_SECTION}]"
    p = spec.parallelism
    if (
        p.expert_parallel_degree > 1
        or p.data_parallel_replicate_degree > 1
        or p.tensor_parallel_degree > 1
    ):
        ctx.fail(
            'with framework = "deepspeed" only data_parallel_shard_degree may be > 1 (ZeRO '
            "shards over the data-parallel ranks)",
            "set expert_parallel_degree, tensor_parallel_degree and "
            "data_parallel_replicate_degree to 1",
        )
    if "activation_checkpoint" in data and spec.activation_checkpoint.mode != "none":
        ctx.fail(
            f"{ctx.where('activation_checkpoint', 'mode')} = '{spec.activation_checkpoint.mode}' "
            'with framework = "deepspeed": not supported yet (DeepSpeed checkpoints activations '
            "with its own API)",
            'set mode = "none" or drop [activation_checkpoint]',
        )
    cfg, filled = fill_config(raw, micro_batch=spec.capture_batch_size)
    stage = validate_config(cfg, world_size=p.world_size, where=f"{ctx.path}: {source}")
    gb = tool if strategy_set else dataclasses.replace(tool, strategy="engine")
    ds = DeepSpeedSpec(
        config_json=json.dumps(cfg, sort_keys=True), source=source, zero_stage=stage, filled=filled
    )
    ac = dataclasses.replace(spec.activation_checkpoint, mode="none")
    return dataclasses.replace(spec, gbdoctor=gb, deepspeed=ds, activation_checkpoint=ac)
