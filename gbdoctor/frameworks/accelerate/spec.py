"""An Accelerate run as a ``Spec``: ``--accelerate CONFIG --model MODEL`` on the command line, or
an ``[accelerate]`` section (``config``, ``model``) in a TOML spec.

The settings read from the config (``config.load_settings``) travel to the ranks as the spec's
``registry_run.args`` (``key=json`` strings), with the config's path as ``registry_run.module``
and the model reference as ``registry_run.config`` (``KIND:REF``); the sections every stage reads
(parallelism, activation checkpointing, compile, capture shape) are filled from them, so world
size, baseline keys and reports work as for any spec.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.accelerate.config import AccelerateSettings, load_settings
from gbdoctor.frameworks.accelerate.model import FACTORY, model_label, model_ref
from gbdoctor.frameworks.common.specfile import capture_settings
from gbdoctor.frameworks.interface import SpecContext
from gbdoctor.records import (
    ACSpec,
    CompileSpec,
    ModelSpec,
    ParallelSpec,
    RegistryRun,
    Spec,
    ToolSpec,
    TrainingSpec,
)

SECTION = "accelerate"
SECTION_KEYS = ("config", "model")
DEFAULT_WORLD_SIZE = 2
"""Ranks of a scan unless ``--world-size`` says otherwise: the fewest on which FSDP2 shards."""
DEFAULT_BATCH_SIZE = 2
DEFAULT_SEQ_LEN = 32


def settings_of(spec: Spec) -> AccelerateSettings:
    run = spec.registry_run
    if run is None:
        raise SpecError(
            "this spec names no Accelerate run", hint="pass --accelerate CONFIG --model MODEL"
        )
    return AccelerateSettings.from_args(run.args)


def model_of(spec: Spec) -> tuple[str, str]:
    """(kind, reference) of the spec's model (``model.model_ref``)."""
    run = spec.registry_run
    assert run is not None
    kind, _, ref = run.config.partition(":")
    return kind, ref


def accelerate_spec(
    framework: str,
    config: str,
    model: str,
    *,
    base_dir: str = ".",
    capture: Mapping[str, float] | None = None,
    world_size: int | None = None,
    label: str | None = None,
    tool: ToolSpec | None = None,
) -> Spec:
    """The spec of ``config`` (Accelerate config YAML or TrainingArguments file) and ``model``."""
    path = os.path.normpath(os.path.join(base_dir, os.path.expanduser(config)))
    settings = load_settings(path)
    kind, ref = model_ref(model, base_dir)
    world = world_size or DEFAULT_WORLD_SIZE
    capture = capture or {}
    base_tool = tool or ToolSpec(device="cpu", world_size=world)
    return Spec(
        path=label or f"accelerate:{config} --model {model}",
        model=ModelSpec(
            name="custom", flavor=model_label(kind, ref), factory=ref if kind == FACTORY else None
        ),
        training=TrainingSpec(
            local_batch_size=DEFAULT_BATCH_SIZE,
            seq_len=DEFAULT_SEQ_LEN,
            mixed_precision_param="bfloat16" if settings.mixed_precision == "bf16" else "float32",
        ),
        parallelism=ParallelSpec(
            data_parallel_shard_degree=world, dp_shard=world, world_size=world
        ),
        activation_checkpoint=ACSpec(
            mode="full" if settings.activation_checkpointing else "none",
            selective_ac_option="",
            per_op_sac_force_recompute_mm_shapes_by_fqns=(),
        ),
        compile=CompileSpec(
            enable=settings.compiles,
            components=("model",),
            backend=settings.dynamo_backend,
            backend_set=True,
        ),
        gbdoctor=dataclasses.replace(
            base_tool,
            strategy=base_tool.strategy if tool is not None else "accelerate",
            batch_size=int(capture.get("batch_size", base_tool.batch_size or DEFAULT_BATCH_SIZE)),
            seq_len=int(capture.get("seq_len", base_tool.seq_len or DEFAULT_SEQ_LEN)),
            timeout_s=float(capture.get("timeout_s", base_tool.timeout_s)),
            framework=framework,
            world_size=world,
            device="cpu" if base_tool.device == "auto" else base_tool.device,
        ),
        registry_run=RegistryRun(module=path, config=f"{kind}:{ref}", args=settings.as_args()),
    )


def model_argument(args: Sequence[str]) -> tuple[str | None, tuple[str, ...]]:
    """``--model MODEL`` (or ``--model=MODEL``) out of the arguments that follow ``--accelerate
    CONFIG`` on the command line, and the arguments left."""
    rest: list[str] = []
    model: str | None = None
    items = list(args)
    while items:
        item = items.pop(0)
        if item == "--model" and items:
            model = items.pop(0)
        elif item.startswith("--model="):
            model = item.partition("=")[2]
        else:
            rest.append(item)
    return model, tuple(rest)


def spec_for_run(
    framework: str,
    config: str,
    args: Sequence[str],
    overrides: Sequence[str] = (),
    *,
    model: str | None = None,
    simulate: bool = False,
    world_size: int | None = None,
) -> Spec:
    """``--accelerate CONFIG --model MODEL``; ``overrides``: ``--set gbdoctor.KEY=N``."""
    if model is None:
        raise SpecError(
            "--accelerate needs the model",
            hint="add --model DIR_WITH_CONFIG_JSON, a cached Hub id or FILE.py:FUNCTION",
        )
    if args:
        raise SpecError(
            f"unexpected argument(s) after --accelerate: {' '.join(args)}",
            hint="an Accelerate run is --accelerate CONFIG --model MODEL (no SPEC.toml)",
        )
    if simulate:
        raise SpecError(
            "an Accelerate run cannot be simulated: it is set up by accelerate on real gloo ranks",
            hint="drop --simulate",
        )
    return accelerate_spec(
        framework, config, model, capture=_capture_settings(overrides), world_size=world_size
    )


def _capture_settings(overrides: Sequence[str]) -> dict[str, float]:
    return capture_settings(
        overrides,
        "an Accelerate run",
        "the setup itself is the Accelerate config's; to set up on GPUs, write a TOML spec with "
        '[gbdoctor] device = "cuda" and an [accelerate] section (docs/accelerate.md)',
    )


def check_toml_spec(
    framework: str,
    spec: Spec,
    data: Mapping[str, Any],
    strategy_set: bool,
    spec_dir: str,
    ctx: SpecContext,
) -> Spec:
    """A TOML spec with ``[gbdoctor] framework = "accelerate"``: its ``[accelerate]`` section."""
    table = data.get(SECTION)
    if not isinstance(table, dict) or "config" not in table:
        ctx.fail(
            f'framework = "{framework}" needs an [{SECTION}] section with config',
            f'add [{SECTION}] config = "accelerate.yaml" (or a TrainingArguments file) and model = "DIR"',
        )
    for key in table:
        if key not in SECTION_KEYS:
            ctx.fail(
                f"[{SECTION}] {key!r} is not a key of this section",
                f"valid keys: {', '.join(SECTION_KEYS)}",
            )
    model = table.get("model") or spec.model.factory
    if not model:
        ctx.fail(
            f"[{SECTION}] needs model",
            'set model = "DIR" (with config.json), a cached Hub id, or FILE.py:FUNCTION',
        )
    world = spec.gbdoctor.world_size or None
    try:
        made = accelerate_spec(
            framework,
            str(table["config"]),
            str(model),
            base_dir=spec_dir,
            world_size=world,
            label=spec.path,
            tool=spec.gbdoctor,
        )
    except SpecError as exc:
        ctx.fail(str(exc), exc.hint)
    strategy = spec.gbdoctor.strategy if strategy_set else "accelerate"
    return dataclasses.replace(
        made, root=spec.root, gbdoctor=dataclasses.replace(made.gbdoctor, strategy=strategy)
    )


def refuse_section(spec: Spec, data: Mapping[str, Any], ctx: SpecContext) -> None:
    if SECTION in data:
        ctx.fail(
            f'an [{SECTION}] section is only read with [gbdoctor] framework = "{SECTION}" '
            f"(framework is '{spec.gbdoctor.framework}')",
            f'set framework = "{SECTION}" in [gbdoctor]',
        )
