"""The shared options turned into library inputs: the spec with ``--set``, ``--simulate`` and
``--world-size`` applied, and the compile strategy from ``--strategy`` or ``--plan``."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from gbdoctor.records import Spec


def load_spec_options(
    spec: Path,
    overrides: list[str] | None,
    *,
    simulate: bool = False,
    world_size: int | None = None,
) -> Spec:
    """The spec file with ``--set`` overrides; ``--simulate`` and ``--world-size`` are the
    ``[gbdoctor]`` keys they stand for, applied after the user's overrides."""
    from gbdoctor.spec import load_spec

    extra = ["gbdoctor.simulate=true"] if simulate else []
    extra += [f"gbdoctor.world_size={world_size}"] if world_size is not None else []
    return load_spec(spec, [*(overrides or ()), *extra])


def choose_strategy(spec: Spec, strategy: str | None, plan: Path | None) -> Any:
    """What the scan compiles with: a saved plan (``--plan``), a named preset (``--strategy``,
    checked against the spec's framework's presets), or None for the spec's own choice."""
    if plan is not None:
        if strategy is not None:
            raise typer.BadParameter("--plan and --strategy are mutually exclusive")
        from gbdoctor.plan import plan_strategy, read_plan

        loaded_plan, identity = read_plan(plan)
        return plan_strategy(loaded_plan, spec, identity=identity)
    if strategy is not None:
        from gbdoctor.frameworks import framework_for

        presets: Collection[str] = framework_for(spec).strategies
        if strategy not in presets:
            raise typer.BadParameter(
                f"unknown strategy {strategy!r}; choose from {', '.join(presets)}"
            )
    return strategy
