"""The setup seam: one training framework's way of turning a spec into a model set up for
training. scan (and through it inspect and plan) and run call only this interface.

A :class:`Recipe` builds the model and its process-group meshes, applies the framework's setup
(the result is a :class:`~gbdoctor.setup.apply.Setup`: the model, each wrapped block with its
compiled regions, the optimizer, and every hook with the component that installed it), and
runs training steps inside the framework's Dynamo settings. The torchtitan recipe
(:class:`TorchtitanRecipe`, EP -> AC -> compile -> FSDP2 -> optimizer in ``apply.py``'s one
order) is the first implementation; other frameworks add theirs to :data:`RECIPES`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn as nn

from gbdoctor.records import Spec
from gbdoctor.setup.apply import CompileFn, Setup, apply_setup, recipe_context
from gbdoctor.setup.compile import Strategy
from gbdoctor.setup.dist import Meshes, build_meshes
from gbdoctor.setup.train import timed_train_step, train_step


class Recipe(Protocol):
    """One training framework's setup (see the module docstring)."""

    name: str

    def build(
        self, spec: Spec, device_type: str, *, meta: bool = False, max_seq_len: int | None = None
    ) -> tuple[nn.Module, Meshes]:
        """The model (seeded from the spec, on the mesh device, or on ``meta``) and its meshes.
        The process group must be initialized."""
        ...

    def set_up(
        self,
        model: nn.Module,
        spec: Spec,
        meshes: Meshes,
        *,
        strategy: Strategy,
        compile_fn: CompileFn | None = None,
        backend: str | None = None,
        build_optimizer: bool | None = None,
        backend_for: Callable[[str], Any] | None = None,
    ) -> Setup:
        """Apply the framework's setup: compile regions with ``compile_fn`` (scans pass a
        recording backend) or ``torch.compile(backend=backend)`` (``None``: the spec's backend).
        Frameworks that compile in place (DeepSpeed's ``engine.compile()``) take the backend of a
        region from ``backend_for(region_fqn)`` instead (scans pass a recording backend)."""
        ...

    def step_context(self, setup: Setup) -> contextlib.AbstractContextManager[None]:
        """The Dynamo settings training steps (and captures) run under."""
        ...

    def train_step(self, setup: Setup, tokens: torch.Tensor, labels: torch.Tensor) -> float:
        """Forward, backward, optimizer step; returns the global loss."""
        ...

    def timed_train_step(
        self, setup: Setup, tokens: torch.Tensor, labels: torch.Tensor, sync: Any = None
    ) -> tuple[float, tuple[float, float, float]]:
        """``train_step`` split into (forward, backward, optimizer) seconds, for ``run``'s
        per-mode breakdown; ``sync`` (``torch.cuda.synchronize`` on GPU) runs before each clock
        read."""
        ...


class TorchtitanRecipe:
    """torchtitan v0.2.x: its model zoo (or a custom factory), EP, AC/SAC, per-block compile,
    FSDP2 and the MoE load-balancing optimizer hook, in ``apply.py``'s order."""

    name = "torchtitan"

    def build(
        self, spec: Spec, device_type: str, *, meta: bool = False, max_seq_len: int | None = None
    ) -> tuple[nn.Module, Meshes]:
        from gbdoctor.models import build_model

        torch.manual_seed(spec.training.seed)
        meshes = build_meshes(spec.parallelism, device_type)
        device = "meta" if meta else meshes.device
        return build_model(spec.model, device=device, max_seq_len=max_seq_len), meshes

    def set_up(
        self,
        model: nn.Module,
        spec: Spec,
        meshes: Meshes,
        *,
        strategy: Strategy,
        compile_fn: CompileFn | None = None,
        backend: str | None = None,
        build_optimizer: bool | None = None,
        backend_for: Callable[[str], Any] | None = None,
    ) -> Setup:
        return apply_setup(
            model,
            spec,
            meshes,
            strategy=strategy,
            compile_fn=compile_fn,
            backend=backend,
            build_optimizer=build_optimizer,
        )

    def step_context(self, setup: Setup) -> contextlib.AbstractContextManager[None]:
        return recipe_context(setup.dynamo_flags, ac_enabled=setup.ac_enabled)

    def train_step(self, setup: Setup, tokens: torch.Tensor, labels: torch.Tensor) -> float:
        return train_step(setup, tokens, labels)

    def timed_train_step(
        self, setup: Setup, tokens: torch.Tensor, labels: torch.Tensor, sync: Any = None
    ) -> tuple[float, tuple[float, float, float]]:
        return timed_train_step(setup, tokens, labels, sync)


def _recipes() -> dict[str, Any]:
    from gbdoctor.setup.deepspeed import DeepSpeedRecipe

    return {TorchtitanRecipe.name: TorchtitanRecipe(), DeepSpeedRecipe.name: DeepSpeedRecipe()}


RECIPES: dict[str, Any] = _recipes()
"""Recipe name (``[gbdoctor] framework``) -> recipe."""


def recipe_for(spec: Spec) -> Recipe:
    """The recipe that sets ``spec`` up (``[gbdoctor] framework``)."""
    return RECIPES[spec.gbdoctor.framework]
