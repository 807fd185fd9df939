"""The installed torchtitan (>= 0.3, Python config registries) behind the framework seam
(:class:`InstalledTorchtitan`).

A run is named by its config registry, not a TOML file: ``--torchtitan MODULE:CONFIG`` plus
torchtitan's own ``--section.key`` overrides on every command that takes a spec (``spec.py``
turns it into a ``Spec`` whose ``registry_run`` holds the name and overrides). torchtitan's own
code builds and sets the model up (``setup.py``; its config in ``config.py``, CPU stand-ins in
``cpu.py``, the recording compile in ``recording.py``); scans capture per block like the v0.2
mirror (``CaptureStyle.PER_BLOCK``, ``scan.rank``), on the ranks its parallelism asks for, or
simulated at full size (``scan.simulate``: the model stays on meta through torchtitan's setup,
then becomes fake tensors). ``plan.py``: keep torchtitan's per-block compile where it is clean, else flags, a
``fullgraph=False`` block or an eager one; ``emit.py``: the config-registry function (plus a
``parallelize`` wrapper) a torchtitan user applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gbdoctor.frameworks.common.base import FrameworkBase, SetUpOptions
from gbdoctor.frameworks.interface import PLUGIN_API_VERSION, CaptureStyle

NAME = "torchtitan-installed"
FLAG = "--torchtitan"
"""The command-line option that names a run of this framework (``MODULE:CONFIG``)."""


@dataclass(frozen=True)
class TitanStrategy:
    """What a scan or run changes of torchtitan's own setup."""

    name: str
    compile: bool | None = None
    """None: as the config says (``compile.enable``); False: nothing compiled; True: enabled."""
    layers: tuple[tuple[str, str], ...] = ()
    """(layer, ``eager`` | ``nofullgraph``) after torchtitan's compile (``layer_plan``)."""
    flags: tuple[tuple[str, bool], ...] = ()
    plan: str | None = None
    """The plan file's identity when a saved plan is applied."""
    summary: str = ""


STRATEGIES = {
    "torchtitan": TitanStrategy("torchtitan", summary="torchtitan's own compile settings"),
    "eager": TitanStrategy("eager", compile=False, summary="nothing compiled"),
}


@dataclass(frozen=True)
class TitanRunModes:
    strategies: Mapping[str, str] = field(
        default_factory=lambda: {"eager": "eager", "torchtitan": "torchtitan"}
    )
    modes: tuple[str, ...] = ("eager", "torchtitan", "plan")
    baselines: tuple[str, ...] = ("torchtitan",)


class InstalledTorchtitan(FrameworkBase):
    """torchtitan >= 0.3 as installed: its config registry, model registry, ``parallelize_fn``,
    loss, optimizer and training-step body."""

    api_version = PLUGIN_API_VERSION  # built in: always the current API
    name = NAME
    title = "torchtitan (installed)"
    capture_style = CaptureStyle.PER_BLOCK
    simulates = True
    own_pipeline = True  # PP > 1 runs torchtitan's own pipelining_fn (pipeline.py)
    strategy_names: tuple[str, ...] = tuple(STRATEGIES)
    default_strategy = "torchtitan"
    run_modes = TitanRunModes()
    plan_modes: tuple[str, ...] = ("block", "eager")
    flag = FLAG
    flag_help = (
        "Set up with the installed torchtitan (>= 0.3): MODULE:CONFIG of its config registry, "
        "followed by torchtitan's own --section.key overrides"
    )

    @property
    def strategies(self) -> Mapping[str, Any]:
        return STRATEGIES

    # ---------------------------------------------------------------- spec

    def spec_for_run(self, name: str, args: Any, overrides: Any = (), **options: Any) -> Any:
        """The spec of a run named ``MODULE:CONFIG`` with torchtitan's own overrides."""
        from gbdoctor.frameworks.torchtitan.spec import spec_for_run

        return spec_for_run(NAME, name, args, overrides, **options)

    def check_spec(
        self, spec: Any, data: Mapping[str, Any], strategy_set: bool, spec_dir: str, ctx: Any
    ) -> Any:
        ctx.fail(
            f"framework '{NAME}' is not read from a TOML file: torchtitan >= 0.3 names a run "
            "by its config registry",
            hint=f"pass {FLAG} MODULE:CONFIG [torchtitan overrides] instead of a spec file",
        )

    def compiles_per_compile_section(self) -> bool:
        # Its scans compile what torchtitan compiles (nothing with compile.enable off, said by
        # a note of its own), not what a strategy would: no "would not compile" note.
        return False

    # ---------------------------------------------------------------- set up and step

    def meta_model(self, spec: Any) -> Any:
        """The model torchtitan builds, on meta (memory estimates)."""
        from gbdoctor.frameworks.torchtitan.config import meta_model

        return meta_model(spec)

    def build(
        self, spec: Any, device_type: str, *, meta: bool = False, max_seq_len: int | None = None
    ) -> tuple[Any, Any]:
        from gbdoctor.frameworks.torchtitan.setup import build

        return build(spec, device_type, simulated=meta)

    def set_up_model(
        self, model: Any, spec: Any, meshes: Any, strategy: Any, options: SetUpOptions
    ) -> Any:
        from gbdoctor.frameworks.torchtitan.setup import set_up

        if isinstance(strategy, str) or strategy is None:
            strategy = STRATEGIES[strategy or self.default_strategy]
        if options.backend is not None:
            meshes.config.compile.backend = options.backend
        return set_up(model, meshes, strategy, options.compile_fn)

    def step_context(self, setup: Any) -> contextlib.AbstractContextManager[None]:
        from gbdoctor.frameworks.torchtitan.setup import step_context

        return step_context(setup)

    def train_step(self, setup: Any, tokens: Any, labels: Any) -> float:
        from gbdoctor.frameworks.torchtitan.setup import train_step

        return train_step(setup, tokens, labels)

    def timed_train_step(
        self, setup: Any, tokens: Any, labels: Any, sync: Any = None
    ) -> tuple[float, tuple[float, float, float]]:
        from gbdoctor.frameworks.torchtitan.setup import timed_train_step

        return timed_train_step(setup, tokens, labels, sync)

    # ---------------------------------------------------------------- run and plan

    def propose_plan(self, spec: Any, *, scan_fn: Any, progress: Any) -> Any:
        from gbdoctor.frameworks.torchtitan.plan import propose_layer_plan

        return propose_layer_plan(spec, scan_fn=scan_fn, progress=progress)

    def plan_strategy(self, plan: Any) -> Any:
        from gbdoctor.frameworks.torchtitan.plan import layer_plan_strategy

        return layer_plan_strategy(plan)

    @property
    def emitters(self) -> Mapping[str, Any]:
        from gbdoctor.frameworks.torchtitan.emit import emit_config_registry

        return {"torchtitan": emit_config_registry}
