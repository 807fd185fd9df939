"""What every framework plug-in inherits (:class:`FrameworkBase`), and the plug-in whose setup is
``setup/``'s framework-neutral building blocks (:class:`BuildingBlocksFramework`).

``FrameworkBase`` holds the seam's answers most frameworks share (no sections of their own, no
simulation, nothing to prepare or release, no plan check, the training step as the timed step
without its times) and ``set_up``'s one signature: a framework writes ``set_up_model`` and gets
the options as one :class:`SetUpOptions`. Light: no torch import (spec loading reads frameworks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SetUpOptions:
    """How ``Framework.set_up`` is asked to compile (see its docstring)."""

    compile_fn: Any = None
    """Compiles a region (scans pass one with a recording backend); None: ``torch.compile``."""
    backend: str | None = None
    """``torch.compile``'s backend; None: the spec's."""
    build_optimizer: bool | None = None
    backend_for: Callable[[str], Any] | None = None
    """Region fqn -> backend, for frameworks that compile in place (DeepSpeed)."""


class FrameworkBase:
    """The defaults of ``interface.Framework`` every plug-in shares; a subclass sets its name,
    strategies and run modes and writes ``build``, ``set_up_model``, ``step_context``,
    ``timed_train_step`` and its planner."""

    simulates = False
    own_pipeline = False
    """``interface.OwnPipeline``: PP through the framework's own pipeline code (its warm-up step
    is the framework's schedule step; no schedule of gbdoctor's, no recompile probe)."""
    spec_sections: tuple[str, ...] = ()
    plan_section: str | None = None

    def check_foreign_spec(self, spec: Any, data: Mapping[str, Any], ctx: Any) -> None:
        return None  # no sections of its own to refuse in another framework's spec

    def compiles_per_compile_section(self) -> bool:
        return False

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
        options = SetUpOptions(compile_fn, backend, build_optimizer, backend_for)
        return self.set_up_model(model, spec, meshes, strategy, options)

    def set_up_model(
        self, model: Any, spec: Any, meshes: Any, strategy: Any, options: SetUpOptions
    ) -> Any:
        """``set_up`` with its options as one record."""
        raise NotImplementedError

    def timed_train_step(
        self, setup: Any, tokens: Any, labels: Any, sync: Any = None
    ) -> tuple[float, tuple[float, float, float]]:
        raise NotImplementedError

    def train_step(self, setup: Any, tokens: Any, labels: Any) -> float:
        return self.timed_train_step(setup, tokens, labels)[0]

    def prepare_ranks(self, device: str) -> None:
        return None

    def release_rank(self) -> None:
        return None

    def check_plan(self, plan: Any, name: str, hint: str) -> None:
        return None


class BuildingBlocksFramework(FrameworkBase):
    """A framework set up by ``setup/``'s building blocks in ``setup.apply``'s one order (EP ->
    AC -> compile -> FSDP2 -> optimizer), on ``setup.mesh``'s meshes, trained by
    ``setup.train``'s step."""

    def build(
        self, spec: Any, device_type: str, *, meta: bool = False, max_seq_len: int | None = None
    ) -> tuple[Any, Any]:
        import torch

        from gbdoctor.models import build_model
        from gbdoctor.setup.mesh import build_meshes

        torch.manual_seed(spec.training.seed)
        meshes = build_meshes(spec.parallelism, device_type)
        device = "meta" if meta else meshes.device
        return build_model(spec.model, device=device, max_seq_len=max_seq_len), meshes

    def set_up_model(
        self, model: Any, spec: Any, meshes: Any, strategy: Any, options: SetUpOptions
    ) -> Any:
        from gbdoctor.setup.apply import apply_setup

        return apply_setup(
            model,
            spec,
            meshes,
            strategy=strategy,
            compile_fn=options.compile_fn,
            backend=options.backend,
            build_optimizer=options.build_optimizer,
        )

    def step_context(self, setup: Any) -> contextlib.AbstractContextManager[None]:
        from gbdoctor.setup.apply import recipe_context

        return recipe_context(setup.dynamo_flags, ac_enabled=setup.ac_enabled)

    def timed_train_step(
        self, setup: Any, tokens: Any, labels: Any, sync: Any = None
    ) -> tuple[float, tuple[float, float, float]]:
        from gbdoctor.setup.train import timed_train_step

        return timed_train_step(setup, tokens, labels, sync)
