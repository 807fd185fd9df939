"""The built-in mirror of torchtitan v0.2.x behind the framework seam (:class:`TorchtitanV02`).

Its setup is ``setup/``'s framework-neutral building blocks in ``setup.apply``'s one order (EP ->
AC -> compile -> FSDP2 -> optimizer), its strategies ``setup.compile.STRATEGIES``, its spec the
torchtitan v0.2.2 JobConfig sections every spec has (``spec.py``); ``plan``: the per-block-kind
planner; ``emit``: the ``--emit-config torchtitan`` code. Scans capture per block
(``CaptureStyle.PER_BLOCK``), on real, spawned or simulated ranks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gbdoctor.frameworks.interface import CaptureStyle

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
    """Mode name -> compile strategy (``setup.compile.STRATEGIES``). ``plan`` and
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


class TorchtitanV02:
    """torchtitan v0.2.x: its model zoo (or a custom factory), EP, AC/SAC, per-block compile,
    FSDP2 and the MoE load-balancing optimizer hook, in ``setup.apply``'s order."""

    name = NAME
    title = "torchtitan"
    capture_style = CaptureStyle.PER_BLOCK
    simulates = True
    spec_sections: tuple[str, ...] = ()
    plan_section = None
    strategy_names: tuple[str, ...] = (
        "none",
        "block",
        "block-nofullgraph",
        "titan-v0.2.0",
        "titan-v0.2.2",
        "children",
    )
    """Compile strategy presets for ``[gbdoctor] strategy`` (``setup.compile.STRATEGIES``)."""
    default_strategy = "block"
    run_modes = TorchtitanRunModes()
    plan_modes: tuple[str, ...] = ("block", "children")

    # ---------------------------------------------------------------- strategies and spec

    @property
    def strategies(self) -> Mapping[str, Any]:
        from gbdoctor.setup.compile import STRATEGIES

        return STRATEGIES

    def check_spec(
        self, spec: Any, data: Mapping[str, Any], strategy_set: bool, spec_dir: str, ctx: Any
    ) -> Any:
        return spec  # the common sections are torchtitan v0.2.2's, checked by spec.py

    def check_foreign_spec(self, spec: Any, data: Mapping[str, Any], ctx: Any) -> None:
        return None  # no sections of its own

    def compiles_per_compile_section(self) -> bool:
        return True

    # ---------------------------------------------------------------- set up and step

    def build(
        self, spec: Any, device_type: str, *, meta: bool = False, max_seq_len: int | None = None
    ) -> tuple[Any, Any]:
        import torch

        from gbdoctor.models import build_model
        from gbdoctor.setup.dist import build_meshes

        torch.manual_seed(spec.training.seed)
        meshes = build_meshes(spec.parallelism, device_type)
        device = "meta" if meta else meshes.device
        return build_model(spec.model, device=device, max_seq_len=max_seq_len), meshes

    def set_up(
        self,
        model: Any,
        spec: Any,
        meshes: Any,
        *,
        strategy: Any,
        compile_fn: Any = None,
        backend: str | None = None,
        build_optimizer: bool | None = None,
        backend_for: Callable[[str], Any] | None = None,
    ) -> Any:
        from gbdoctor.setup.apply import apply_setup

        return apply_setup(
            model,
            spec,
            meshes,
            strategy=strategy,
            compile_fn=compile_fn,
            backend=backend,
            build_optimizer=build_optimizer,
        )

    def step_context(self, setup: Any) -> contextlib.AbstractContextManager[None]:
        from gbdoctor.setup.apply import recipe_context

        return recipe_context(setup.dynamo_flags, ac_enabled=setup.ac_enabled)

    def train_step(self, setup: Any, tokens: Any, labels: Any) -> float:
        from gbdoctor.setup.train import train_step

        return train_step(setup, tokens, labels)

    def timed_train_step(
        self, setup: Any, tokens: Any, labels: Any, sync: Any = None
    ) -> tuple[float, tuple[float, float, float]]:
        from gbdoctor.setup.train import timed_train_step

        return timed_train_step(setup, tokens, labels, sync)

    def prepare_ranks(self, device: str) -> None:
        return None

    def release_rank(self) -> None:
        return None

    # ---------------------------------------------------------------- run and plan

    def propose_plan(self, spec: Any, *, scan_fn: Any, progress: Any) -> Any:
        from gbdoctor.frameworks.torchtitan_v02.plan import propose_block_plan

        return propose_block_plan(spec, scan_fn=scan_fn, progress=progress)

    def plan_strategy(self, plan: Any) -> Any:
        from gbdoctor.frameworks.torchtitan_v02.plan import block_plan_strategy

        return block_plan_strategy(plan)

    def check_plan(self, plan: Any, name: str, hint: str) -> None:
        return None

    @property
    def emitters(self) -> Mapping[str, Any]:
        from gbdoctor.frameworks.torchtitan_v02.emit import emit_torchtitan

        return {NAME: emit_torchtitan}
