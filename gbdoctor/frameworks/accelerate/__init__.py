"""Hugging Face Accelerate (and the Trainer, which prepares through it) behind the framework
seam (:class:`Accelerate`).

A run is ``--accelerate CONFIG --model MODEL`` on any command (or an ``[accelerate]`` section in
a TOML spec), where CONFIG is the YAML ``accelerate config`` writes or a TrainingArguments
JSON/YAML (``config.py``) and MODEL a directory with ``config.json``, a cached Hub id or a
factory (``model.py``). accelerate's own FSDP2 functions set the model up in its order
(``setup.py``); scans capture per block (``CaptureStyle.PER_BLOCK``, ``scan.rank``) on real gloo
ranks. Light: no torch, accelerate or transformers import at module level.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gbdoctor.frameworks.common.base import FrameworkBase, SetUpOptions
from gbdoctor.frameworks.interface import PLUGIN_API_VERSION, CaptureStyle

NAME = "accelerate"
FLAG = "--accelerate"
"""The command-line option that names a run of this framework (``CONFIG``, with ``--model``)."""
STRATEGY_NAMES = ("accelerate", "eager")


@dataclass(frozen=True)
class AccelerateRunModes:
    strategies: Mapping[str, str] = field(
        default_factory=lambda: {"eager": "eager", "accelerate": "accelerate"}
    )
    modes: tuple[str, ...] = ("eager", "accelerate", "plan")
    baselines: tuple[str, ...] = ("accelerate",)


class Accelerate(FrameworkBase):
    """Accelerate 1.x's FSDP2 path (``Accelerator._prepare_fsdp2``) on a transformers model."""

    name = NAME
    api_version = PLUGIN_API_VERSION  # built in: always the current API
    title = "Accelerate"
    capture_style = CaptureStyle.PER_BLOCK
    spec_sections = (NAME,)
    strategy_names: tuple[str, ...] = STRATEGY_NAMES
    default_strategy = "accelerate"
    run_modes = AccelerateRunModes()
    plan_modes: tuple[str, ...] = ("accelerate",)
    flag = FLAG
    flag_help = (
        "Set up with Hugging Face Accelerate's FSDP2 path: CONFIG is the YAML `accelerate config` "
        "writes or a TrainingArguments JSON/YAML, followed by --model DIR_WITH_CONFIG_JSON, a "
        "Hub id in the local cache, or FILE.py:FUNCTION (never downloaded)"
    )

    @property
    def strategies(self) -> Mapping[str, Any]:
        from gbdoctor.frameworks.accelerate.setup import STRATEGIES

        return STRATEGIES

    # ---------------------------------------------------------------- spec

    def spec_for_run(self, name: str, args: Any, overrides: Any = (), **options: Any) -> Any:
        """``--accelerate CONFIG``; ``args``, this framework's own arguments: ``--model MODEL``."""
        from gbdoctor.frameworks.accelerate.spec import model_argument, spec_for_run

        model, rest = model_argument(args)
        return spec_for_run(NAME, name, rest, overrides, model=model, **options)

    def check_spec(
        self, spec: Any, data: Mapping[str, Any], strategy_set: bool, spec_dir: str, ctx: Any
    ) -> Any:
        from gbdoctor.frameworks.accelerate.spec import check_toml_spec

        return check_toml_spec(NAME, spec, data, strategy_set, spec_dir, ctx)

    def check_foreign_spec(self, spec: Any, data: Mapping[str, Any], ctx: Any) -> None:
        from gbdoctor.frameworks.accelerate.spec import refuse_section

        refuse_section(spec, data, ctx)

    # ---------------------------------------------------------------- set up and step

    def meta_model(self, spec: Any) -> Any:
        """The model on meta (memory estimates): built as on a rank, with no storage."""
        import torch

        from gbdoctor.frameworks.accelerate.model import build_model
        from gbdoctor.frameworks.accelerate.spec import model_of

        kind, ref = model_of(spec)
        with torch.device("meta"):
            return build_model(kind, ref, spec.training.seed)

    def build(
        self, spec: Any, device_type: str, *, meta: bool = False, max_seq_len: int | None = None
    ) -> tuple[Any, Any]:
        import torch
        import torch.distributed as dist

        from gbdoctor.errors import SpecError
        from gbdoctor.frameworks.accelerate.model import build_model
        from gbdoctor.frameworks.accelerate.spec import model_of
        from gbdoctor.setup.mesh import Meshes

        if meta:
            raise SpecError(
                "an Accelerate setup is not simulated: it is set up on real ranks",
                hint="drop --simulate",
            )
        # One device per rank, as `accelerate launch` gives each process (LOCAL_RANK's GPU).
        device = (
            torch.device(device_type, torch.cuda.current_device())
            if device_type == "cuda"
            else torch.device(device_type)
        )
        # FSDP2 shards over every rank of the default group (accelerate's mesh without a
        # parallelism_config): no device mesh of gbdoctor's own.
        meshes = Meshes(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            device=device,
            dp=None,
            ep=None,
            edp=None,
        )
        kind, ref = model_of(spec)
        return build_model(kind, ref, spec.training.seed).to(device), meshes

    def set_up_model(
        self, model: Any, spec: Any, meshes: Any, strategy: Any, options: SetUpOptions
    ) -> Any:
        from gbdoctor.frameworks.accelerate.setup import STRATEGIES, set_up
        from gbdoctor.frameworks.accelerate.spec import settings_of

        if isinstance(strategy, str) or strategy is None:
            strategy = STRATEGIES[strategy or self.default_strategy]
        return set_up(model, meshes, settings_of(spec), strategy, options)

    def step_context(self, setup: Any) -> contextlib.AbstractContextManager[None]:
        from gbdoctor.setup.apply import recipe_context

        return recipe_context(setup.dynamo_flags, ac_enabled=setup.ac_enabled)

    def timed_train_step(
        self, setup: Any, tokens: Any, labels: Any, sync: Any = None
    ) -> tuple[float, tuple[float, float, float]]:
        from gbdoctor.setup.train import timed_train_step

        return timed_train_step(setup, tokens, labels, sync)

    # ---------------------------------------------------------------- run and plan

    def propose_plan(self, spec: Any, *, scan_fn: Any, progress: Any) -> Any:
        from gbdoctor.frameworks.accelerate.plan import propose_accelerate_plan

        return propose_accelerate_plan(spec, scan_fn=scan_fn, progress=progress)

    def plan_strategy(self, plan: Any) -> Any:
        from gbdoctor.frameworks.accelerate.plan import plan_strategy

        return plan_strategy(plan)

    @property
    def emitters(self) -> Mapping[str, Any]:
        from gbdoctor.frameworks.accelerate.plan import emit_accelerate

        return {NAME: emit_accelerate}
