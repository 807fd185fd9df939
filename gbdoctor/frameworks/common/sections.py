"""Reading and checking the common sections (``schema``) of a spec file: each value typed against
its record field, each section checked for what gbdoctor can set up, one-line SpecErrors (exit
2) that say which key (or ``--set``) is wrong and how to fix it; and the notes a report gives
on how the spec was read.

No torch import here; the model registry (``gbdoctor.models``) is imported lazily.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from collections.abc import Mapping
from typing import Any, NoReturn

from gbdoctor.frameworks.common.context_parallel import check_cp
from gbdoctor.frameworks.common.schema import (
    _DEGREES,
    AC_MODES,
    COMPILE_COMPONENTS,
    CUSTOM_FAMILY,
    DEFAULT_FLAVOR,
    DEVICES,
    MAX_CAPTURE_TOKENS,
    MAX_TIMEOUT_S,
    MAX_WORLD_SIZE,
    MIXED_PRECISION_DTYPES,
    RECORDS,
    RESHARD_POLICIES,
    VALID_KEYS,
)
from gbdoctor.frameworks.common.specfile import SpecContext, did_you_mean, typed_value
from gbdoctor.frameworks.registry import framework_named, framework_names
from gbdoctor.records import (
    ACSpec,
    CompileSpec,
    ModelSpec,
    ParallelSpec,
    Spec,
    ToolSpec,
    TrainingSpec,
)


def read_sections(
    data: Mapping[str, Any], shown: str, root: str, ctx: SpecContext
) -> tuple[Spec, bool]:
    """The common sections of a checked spec file read into a ``Spec``: (spec, whether
    ``[gbdoctor] strategy`` is set). The spec's framework completes it (``check_spec``)."""
    values = {name: typed_section(data.get(name, {}), name, ctx) for name in RECORDS}
    seed = typed_value(data.get("debug", {}).get("seed"), int, "debug", "seed", ctx)
    if seed is not None:
        values["training"]["seed"] = seed

    spec_dir = os.path.dirname(os.path.abspath(shown))
    model = (
        FROM_FRAMEWORK_SECTION
        if "model" not in data and _framework_section_present(data)
        else check_model(values["model"], data, spec_dir, ctx)
    )
    n_experts = _num_experts(model)
    spec = Spec(
        path=shown,
        root=root,
        model=model,
        training=check_training(values["training"], ctx),
        parallelism=check_parallelism(
            values["parallelism"],
            model,
            n_experts,
            ctx,
            launch_size=values["gbdoctor"].get("world_size") or 0,
        ),
        activation_checkpoint=check_ac(values["activation_checkpoint"], ctx),
        compile=check_compile(values["compile"], ctx),
        gbdoctor=check_tool(values["gbdoctor"], ctx),
    )
    tokens = spec.capture_batch_size * spec.capture_seq_len
    if tokens > MAX_CAPTURE_TOKENS:
        ctx.fail(
            f"capture batch {spec.capture_batch_size} x {spec.capture_seq_len} = {tokens} tokens "
            f"per rank exceeds gbdoctor's limit of {MAX_CAPTURE_TOKENS}",
            "set [gbdoctor] batch_size and seq_len small (e.g. 2 and 64): breaks do not depend on size",
        )
    tp = spec.parallelism.tensor_parallel_degree
    lengths = (
        ("training", "seq_len", spec.training.seq_len),
        ("gbdoctor", "seq_len", spec.capture_seq_len),
    )
    for section, name, value in lengths:
        if tp > 1 and value % tp:
            # torchtitan asserts it too: sequence parallelism shards the sequence evenly.
            ctx.fail(
                f"{ctx.where(section, name)} = {value} is not divisible by "
                f"tensor_parallel_degree = {tp}",
                f"use a multiple of {tp} for {name}",
            )
        chunks = 2 * spec.parallelism.context_parallel_degree
        if chunks > 2 and value % chunks:
            # torch's head-tail load balancer cuts the sequence into 2 x cp chunks.
            ctx.fail(
                f"{ctx.where(section, name)} = {value} is not divisible by 2 x "
                f"context_parallel_degree = {chunks} (CP's load balancer splits the sequence "
                "into that many chunks)",
                f"use a multiple of {chunks} for {name}",
            )
    return spec, "strategy" in values["gbdoctor"]


def typed_section(table: Mapping[str, Any], section: str, ctx: SpecContext) -> dict[str, Any]:
    """The keys of ``table`` that are fields of the section's record, type-checked."""
    record = RECORDS[section]
    hints = typing.get_type_hints(record)
    extra = (
        {"expert_parallel_comm_backend": str, "enable_async_tensor_parallel": bool}
        if section == "parallelism"
        else {}
    )
    out: dict[str, Any] = {}
    for key, value in table.items():
        tp = hints.get(key) if key in VALID_KEYS[section] else None
        tp = tp or extra.get(key)
        if tp is not None:
            out[key] = typed_value(value, tp, section, key, ctx)
    return out


FROM_FRAMEWORK_SECTION = ModelSpec(name=CUSTOM_FAMILY, flavor="", factory=None)
"""A spec without ``[model]`` whose framework's own section is there (``[accelerate] model``):
the framework's ``check_spec`` must replace it (``spec.load_spec`` refuses it otherwise)."""


def _framework_section_present(data: Mapping[str, Any]) -> bool:
    name = data.get("gbdoctor", {}).get("framework")
    if name not in framework_names():
        return False  # check_tool says what is wrong with it
    return any(section in data for section in framework_named(name).spec_sections)


# --------------------------------------------------------------------------- checks


def missing_model(ctx: SpecContext) -> NoReturn:
    ctx.fail(
        "missing [model] section",
        'add [model] with name = "llama3" (or llama4, deepseek_v3, custom) and flavor = "debugmodel"',
    )


def check_model(
    values: dict[str, Any], data: Mapping[str, Any], spec_dir: str, ctx: SpecContext
) -> ModelSpec:
    from gbdoctor.models import FAMILIES, family_flavors

    if "model" not in data:
        missing_model(ctx)
    name = values.get("name")
    families = tuple(FAMILIES) + (() if CUSTOM_FAMILY in FAMILIES else (CUSTOM_FAMILY,))
    if name is None:
        ctx.fail("[model] name is required", f"set name to one of: {', '.join(families)}")
    if name not in families:
        ctx.fail(
            f"{ctx.where('model', 'name')} = '{name}' is not a known model family"
            f"{did_you_mean(name, families)}; choose one of: {', '.join(families)}",
            'for your own model use name = "custom" and factory = "path/to/file.py:build"',
        )
    flavor = values.get("flavor", DEFAULT_FLAVOR)
    factory = values.get("factory")
    if name == CUSTOM_FAMILY:
        if not factory:
            ctx.fail(
                "[model] name = 'custom' needs a factory",
                'set factory = "path/to/file.py:build" or "package.module:build"',
            )
        factory = _resolve_factory(factory, spec_dir, ctx)
    else:
        if factory is not None:
            ctx.fail(
                f"{ctx.where('model', 'factory')} is only used with name = 'custom' "
                f"(name is '{name}')",
                'remove factory, or set name = "custom"',
            )
        flavors = tuple(family_flavors(name))
        if flavor not in flavors:
            ctx.fail(
                f"{ctx.where('model', 'flavor')} = '{flavor}' is not a flavor of {name}"
                f"{did_you_mean(flavor, flavors)}; valid flavors: {', '.join(flavors)}",
                f"pick one of the {name} flavors",
            )
    return ModelSpec(name=name, flavor=flavor, factory=factory)


def _resolve_factory(factory: str, spec_dir: str, ctx: SpecContext) -> str:
    target, sep, attr = factory.rpartition(":")
    is_path = target.endswith(".py") or "/" in target or os.sep in target
    ok_attr = all(part.isidentifier() for part in attr.split("."))
    ok_module = is_path or all(part.isidentifier() for part in target.split("."))
    if not sep or not target or not ok_attr or not ok_module:
        ctx.fail(
            f"{ctx.where('model', 'factory')} = '{factory}' is not "
            "'path/to/file.py:build' or 'package.module:build'",
            "name the file (relative to the spec file) or module, a colon, and the function",
        )
    from gbdoctor.usercode import foreign_factory

    if is_path:
        target = os.path.normpath(os.path.join(spec_dir, os.path.expanduser(target)))
    # Refused here, when the spec loads, so no command imports anything (torch included)
    # before saying so: a spec must not turn someone else's callable into a command runner.
    foreign = foreign_factory(target, is_path=is_path)
    if foreign is not None:
        ctx.fail(f"{ctx.where('model', 'factory')} = '{factory}' {foreign[0]}", foreign[1])
    return f"{target}:{attr}"


def _num_experts(model: ModelSpec) -> int | None:
    if model.name == CUSTOM_FAMILY:
        return None
    from gbdoctor.models import num_experts

    return num_experts(model.name, model.flavor)


def check_training(values: dict[str, Any], ctx: SpecContext) -> TrainingSpec:
    for key in ("local_batch_size", "seq_len", "steps"):
        if key in values and values[key] < 1:
            ctx.fail(
                f"{ctx.where('training', key)} must be a positive integer, got {values[key]}",
                f"fix {key} in [training]",
            )
    for key in ("mixed_precision_param", "mixed_precision_reduce"):
        if key in values and values[key] not in MIXED_PRECISION_DTYPES:
            ctx.fail(
                f"{ctx.where('training', key)} = '{values[key]}' is not one of "
                f"{', '.join(MIXED_PRECISION_DTYPES)}",
                f"fix {key} in [training]",
            )
    return TrainingSpec(**values)


def check_parallelism(
    values: dict[str, Any],
    model: ModelSpec,
    n_experts: int | None,
    ctx: SpecContext,
    launch_size: int = 0,
) -> ParallelSpec:
    comm_backend = values.pop("expert_parallel_comm_backend", "standard")
    async_tp = values.pop("enable_async_tensor_parallel", False)
    p = ParallelSpec(**values)
    for key in _DEGREES:
        degree = getattr(p, key)
        if degree < 1 and not (key == "data_parallel_shard_degree" and degree == -1):
            allowed = (
                "a positive integer or -1"
                if key == "data_parallel_shard_degree"
                else "a positive integer"
            )
            ctx.fail(
                f"{ctx.where('parallelism', key)} must be {allowed}, got {degree}",
                "degrees count ranks; 1 means no parallelism along that dimension",
            )
    check_cp(p, model, ctx)
    if p.fsdp_reshard_after_forward not in RESHARD_POLICIES:
        ctx.fail(
            f"{ctx.where('parallelism', 'fsdp_reshard_after_forward')} = "
            f"'{p.fsdp_reshard_after_forward}' is not one of {', '.join(RESHARD_POLICIES)}",
            "torchtitan's values: default, always, never",
        )

    ep, tp = p.expert_parallel_degree, p.tensor_parallel_degree
    _check_tp(p, model, async_tp, ctx)
    where = ctx.where("parallelism", "expert_parallel_degree")
    if ep > 1:
        if comm_backend != "standard":
            ctx.fail(
                f"{ctx.where('parallelism', 'expert_parallel_comm_backend')} = "
                f"'{comm_backend}' with expert parallelism: not supported yet",
                'use the standard all-to-all backend: expert_parallel_comm_backend = "standard"',
            )
        if model.name != CUSTOM_FAMILY and n_experts is None:
            ctx.fail(
                f"{where} = {ep}, but {model.name} '{model.flavor}' is a dense model (no experts)",
                "set expert_parallel_degree = 1 or pick an MoE model",
            )
        if n_experts is not None and n_experts % ep:
            ctx.fail(
                f"{where} = {ep} does not divide the {n_experts} experts of "
                f"{model.name} '{model.flavor}'",
                f"use a divisor of {n_experts} for expert_parallel_degree",
            )
    # EP borrows its ranks from the FSDP dimension ("dp2ep"). torchtitan resolves -1 to every
    # rank the launch has left (world // the other degrees); without a stated launch size, -1
    # resolves to the smallest world that hosts EP.
    dp_shard = p.data_parallel_shard_degree
    replicate = p.data_parallel_replicate_degree
    others = (
        replicate
        * p.tensor_parallel_degree
        * p.context_parallel_degree
        * p.pipeline_parallel_degree
    )
    size_where = ctx.where("gbdoctor", "world_size")
    if launch_size < 0:
        ctx.fail(
            f"{size_where} must be a positive integer (or 0: not stated), got {launch_size}",
            "the number of ranks the training job launches, e.g. --world-size 64",
        )
    if dp_shard == -1 and launch_size:
        if launch_size % others:
            ctx.fail(
                f"{size_where} = {launch_size} is not a multiple of the other degrees' product "
                f"({others}), so data_parallel_shard_degree = -1 cannot be resolved",
                f"state a launch size that is a multiple of {others}",
            )
        dp_shard = launch_size // others
        if dp_shard % ep:
            ctx.fail(
                f"{where} = {ep} does not divide the {dp_shard} ranks that "
                f"data_parallel_shard_degree = -1 resolves to with {size_where} = {launch_size} "
                "(EP borrows its ranks from FSDP)",
                f"state a launch size that is a multiple of {others * ep}",
            )
    elif dp_shard == -1:
        dp_shard = max(1, ep)
    elif launch_size and launch_size != others * dp_shard:
        ctx.fail(
            f"{size_where} = {launch_size} does not match the degrees: their product is "
            f"{others * dp_shard}",
            "drop the world size, or set data_parallel_shard_degree = -1 to take every rank",
        )
    elif dp_shard % ep:
        shard_where = ctx.where("parallelism", "data_parallel_shard_degree")
        ctx.fail(
            f"{where} = {ep} does not divide {shard_where} = {dp_shard} "
            "(EP borrows its ranks from FSDP)",
            "make data_parallel_shard_degree a multiple of expert_parallel_degree, or -1",
        )
    world_size = (
        p.data_parallel_replicate_degree
        * dp_shard
        * tp
        * p.context_parallel_degree
        * p.pipeline_parallel_degree
    )
    if world_size > MAX_WORLD_SIZE:
        ctx.fail(
            f"world size {world_size} "
            f"({ctx.where('parallelism', 'data_parallel_replicate_degree')} x "
            f"{ctx.where('parallelism', 'data_parallel_shard_degree')} x "
            f"{ctx.where('parallelism', 'tensor_parallel_degree')} x "
            f"{ctx.where('parallelism', 'context_parallel_degree')} x "
            f"{ctx.where('parallelism', 'pipeline_parallel_degree')}) exceeds gbdoctor's "
            f"limit of {MAX_WORLD_SIZE} ranks",
            "check the degrees for a typo; breaks do not depend on the world size beyond the EP "
            "and FSDP degrees",
        )
    return dataclasses.replace(p, dp_shard=dp_shard, world_size=world_size)


def _check_tp(p: ParallelSpec, model: ModelSpec, async_tp: bool, ctx: SpecContext) -> None:
    """What tensor parallelism gbdoctor sets up: torchtitan's plans for the built-in families,
    on a (dp_shard x tp) mesh; async TP, expert TP and EP together with TP are refused."""
    tp, where = p.tensor_parallel_degree, ctx.where("parallelism", "tensor_parallel_degree")
    etp = p.expert_tensor_parallel_degree
    # torchtitan v0.2.2 accepts etp in {1, tp}. Without EP, experts are tensor-parallel on the TP
    # mesh whatever etp says (its apply_moe_ep_tp uses TensorParallel when there is no EP mesh),
    # which is what gbdoctor sets up; etp only matters when EP and TP combine.
    if etp not in (1, tp):
        ctx.fail(
            f"{ctx.where('parallelism', 'expert_tensor_parallel_degree')} = {etp} with "
            f"{where} = {tp}: torchtitan accepts only 1 or the TP degree",
            f"set expert_tensor_parallel_degree = 1 or {tp}",
        )
    if tp == 1:
        return
    if async_tp:
        ctx.fail(
            f"{ctx.where('parallelism', 'enable_async_tensor_parallel')} = true: async TP is not "
            "supported (it rewrites compiled graphs into symmetric-memory CUDA kernels, which a "
            "CPU capture cannot show)",
            "set enable_async_tensor_parallel = false; the TP breaks and recompiles are the same",
        )
    if model.name == CUSTOM_FAMILY:
        ctx.fail(
            f"{where} = {tp} with a custom model: TP plans exist for the built-in families "
            "(llama3, llama4, deepseek_v3), which address modules by name",
            "set tensor_parallel_degree = 1 for custom models",
        )
    if p.expert_parallel_degree > 1:
        ctx.fail(
            f"{where} = {tp} together with expert_parallel_degree = {p.expert_parallel_degree}: "
            "EP borrowing ranks from TP is not supported yet",
            "use TP (experts sharded on their hidden size) or EP, not both",
        )


def check_ac(values: dict[str, Any], ctx: SpecContext) -> ACSpec:
    ac = ACSpec(**values)
    if ac.mode not in AC_MODES:
        ctx.fail(
            f"{ctx.where('activation_checkpoint', 'mode')} = '{ac.mode}' is not one of "
            f"{', '.join(AC_MODES)}{did_you_mean(ac.mode, AC_MODES)}",
            'use mode = "selective", "full" or "none"',
        )
    if ac.mode == "memory_budget":
        ctx.fail(
            f"{ctx.where('activation_checkpoint', 'mode')} = 'memory_budget': not supported yet",
            'use mode = "selective", "full" or "none"',
        )
    option = ac.selective_ac_option.strip()
    if option != "op":
        # isdigit() alone accepts '²', which int() refuses.
        if not (option.isascii() and option.isdigit()) or int(option) < 1:
            ctx.fail(
                f"{ctx.where('activation_checkpoint', 'selective_ac_option')} = "
                f"'{ac.selective_ac_option}' must be a positive integer (wrap every Nth "
                "block) or 'op' (per-op SAC)",
                'write e.g. selective_ac_option = "2" or "op"',
            )
        option = str(int(option))
    return dataclasses.replace(ac, selective_ac_option=option)


def check_compile(values: dict[str, Any], ctx: SpecContext) -> CompileSpec:
    c = CompileSpec(**values, backend_set="backend" in values)
    unknown = [x for x in c.components if x not in COMPILE_COMPONENTS]
    if unknown:
        ctx.fail(
            f"{ctx.where('compile', 'components')} has unknown component(s) "
            f"{', '.join(map(repr, unknown))}; valid: {', '.join(COMPILE_COMPONENTS)}",
            'write e.g. components = ["model", "loss"]',
        )
    return c


def check_tool(values: dict[str, Any], ctx: SpecContext) -> ToolSpec:
    t = ToolSpec(**values)
    frameworks = framework_names()
    if t.framework not in frameworks:
        default_name, *others = frameworks
        ctx.fail(
            f"{ctx.where('gbdoctor', 'framework')} = '{t.framework}' is not one of "
            f"{', '.join(frameworks)}{did_you_mean(t.framework, frameworks)}",
            f"{default_name} (the default) or {' or '.join(others)}",
        )
    framework = framework_named(t.framework)
    names = framework.strategy_names
    if "strategy" in values and t.strategy not in names:
        default = framework.default_strategy
        ctx.fail(
            f"{ctx.where('gbdoctor', 'strategy')} = '{t.strategy}' is not a known strategy "
            f"(framework '{t.framework}'){did_you_mean(t.strategy, names)}; choose one of: "
            f"{', '.join(names)}",
            f'see docs/plan.md, "Compile strategies"; the default is "{default}"',
        )
    if t.device not in DEVICES:
        ctx.fail(
            f"{ctx.where('gbdoctor', 'device')} = '{t.device}' is not one of {', '.join(DEVICES)}",
            "auto picks cuda when available, else cpu",
        )
    for key in ("batch_size", "seq_len"):
        if getattr(t, key) < 0:
            ctx.fail(
                f"{ctx.where('gbdoctor', key)} must be a positive integer (or 0 for the "
                f"[training] value), got {getattr(t, key)}",
                f"fix {key} in [gbdoctor]",
            )
    if not math.isfinite(t.timeout_s) or not 0 < t.timeout_s <= MAX_TIMEOUT_S:
        ctx.fail(
            f"{ctx.where('gbdoctor', 'timeout_s')} must be a number of seconds in (0, "
            f"{MAX_TIMEOUT_S:g}], got {t.timeout_s}",
            "a wall-clock limit in seconds for multi-rank jobs, e.g. 600",
        )
    return t


# --------------------------------------------------------------------------- notes


def spec_notes(spec: Spec) -> tuple[str, ...]:
    """What a report must say about how the spec was read: the resolved -1 degree, and a config
    whose training run would not compile the blocks that the scan compiles."""
    notes = []
    p, c = spec.parallelism, spec.compile
    if p.data_parallel_shard_degree == -1:
        if spec.gbdoctor.world_size:
            notes.append(
                f"data_parallel_shard_degree = -1 resolved to {p.dp_shard} (every rank of the "
                f"stated launch size {spec.gbdoctor.world_size}, as torchtitan does)"
            )
        else:
            notes.append(
                f"data_parallel_shard_degree = -1 resolved to {p.dp_shard} (no launch size "
                "stated: the smallest world that hosts EP); pass --world-size N (or [gbdoctor] "
                "world_size) to use the launch size, as torchtitan does"
            )
    # Some frameworks compile as [gbdoctor] strategy says, whatever the [compile] section says.
    compiles_per_section = framework_named(spec.gbdoctor.framework).compiles_per_compile_section()
    if compiles_per_section and (not c.enable or "model" not in c.components):
        why = (
            "[compile] enable = false"
            if not c.enable
            else f'[compile] components = {list(c.components)} lacks "model"'
        )
        notes.append(
            f"{why}: training with this config would not compile the blocks; the scan "
            "shows what would happen if it did"
        )
    return tuple(notes)
