"""The built-in mirror of torchtitan v0.2.x behind the framework seam (:class:`TorchtitanV02`).

Its setup is ``setup/``'s framework-neutral building blocks in ``setup.apply``'s one order (EP ->
AC -> compile -> FSDP2 -> optimizer), its strategies ``strategies.STRATEGIES``, its spec the
torchtitan v0.2.2 JobConfig sections every spec has (``spec.py``); ``plan``: the per-block-kind
planner; ``emit``: the ``--emit-config torchtitan`` code. Scans capture per block
(``CaptureStyle.PER_BLOCK``), on real, spawned or simulated ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gbdoctor.frameworks.common.base import BuildingBlocksFramework
from gbdoctor.frameworks.interface import PLUGIN_API_VERSION, CaptureStyle
from gbdoctor.frameworks.torchtitan_v02.causes import TORCHTITAN_CAUSES

NAME = "torchtitan"


@dataclass(frozen=True)
class TorchtitanRunModes:
    strategies: Mapping[str, str] = field(
        default_factory=lambda: {
            "eager": "none",
            "titan-v0.2.0": "titan-v0.2.0",
            "titan-v0.2.2": "titan-v0.2.2",
            "block-fullgraph": "block",
        }
    )
    """Mode name -> compile strategy (``strategies.STRATEGIES``). ``plan`` and
    ``cudagraphs`` come from the planner."""
    modes: tuple[str, ...] = (
        "eager",
        "titan-v0.2.0",
        "titan-v0.2.2",
        "block-fullgraph",
        "plan",
        "cudagraphs",
    )
    baselines: tuple[str, ...] = ("titan-v0.2.0", "titan-v0.2.2", "block-fullgraph")


class TorchtitanV02(BuildingBlocksFramework):
    """torchtitan v0.2.x: its model zoo (or a custom factory), EP, AC/SAC, per-block compile,
    FSDP2 and the MoE load-balancing optimizer hook, in ``setup.apply``'s order."""

    api_version = PLUGIN_API_VERSION  # built in: always the current API
    name = NAME
    title = "torchtitan"
    capture_style = CaptureStyle.PER_BLOCK
    simulates = True
    strategy_names: tuple[str, ...] = (
        "none",
        "block",
        "block-nofullgraph",
        "titan-v0.2.0",
        "titan-v0.2.2",
        "children",
    )
    """Compile strategy presets for ``[gbdoctor] strategy`` (``strategies.STRATEGIES``)."""
    default_strategy = "block"
    run_modes = TorchtitanRunModes()
    cause_knowledge = TORCHTITAN_CAUSES
    plan_modes: tuple[str, ...] = ("block", "children")

    # ---------------------------------------------------------------- strategies and spec

    @property
    def strategies(self) -> Mapping[str, Any]:
        from gbdoctor.frameworks.torchtitan_v02.strategies import STRATEGIES

        return STRATEGIES

    def check_spec(
        self, spec: Any, data: Mapping[str, Any], strategy_set: bool, spec_dir: str, ctx: Any
    ) -> Any:
        # The common sections are torchtitan v0.2.2's, checked by spec.py; pipeline
        # parallelism's layout is checked here when the flavor says how many layers there are
        # (a custom model's, when it is built).
        if spec.parallelism.pp_enabled:
            from gbdoctor.errors import SpecError
            from gbdoctor.models import model_facts
            from gbdoctor.setup.pipeline import pipeline_layout

            n_layers = model_facts(spec.model).n_layers
            if n_layers is not None:
                try:
                    pipeline_layout(spec.parallelism, n_layers, spec.training.local_batch_size)
                except SpecError as exc:
                    ctx.fail(exc.message, exc.hint)
        return spec

    def compiles_per_compile_section(self) -> bool:
        return True

    # ---------------------------------------------------------------- run and plan

    def propose_plan(self, spec: Any, *, scan_fn: Any, progress: Any) -> Any:
        from gbdoctor.frameworks.torchtitan_v02.plan import propose_block_plan

        return propose_block_plan(spec, scan_fn=scan_fn, progress=progress)

    def plan_strategy(self, plan: Any) -> Any:
        from gbdoctor.frameworks.torchtitan_v02.plan import block_plan_strategy

        return block_plan_strategy(plan)

    @property
    def emitters(self) -> Mapping[str, Any]:
        from gbdoctor.frameworks.torchtitan_v02.emit import emit_torchtitan

        return {NAME: emit_torchtitan}
