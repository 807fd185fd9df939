"""The shared options turned into library inputs: the spec with ``--set``, ``--simulate`` and
``--world-size`` applied, and the compile strategy from ``--strategy`` or ``--plan``."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from gbdoctor.records import ScanReport, Spec


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


def load_spec_args(
    args: list[str] | None,
    run: str | None,
    overrides: list[str] | None,
    *,
    simulate: bool = False,
    world_size: int | None = None,
    accelerate: str | None = None,
    model: str | None = None,
) -> Spec:
    """One spec from the command line: a TOML file (``args`` holds its path), or with
    ``--torchtitan MODULE:CONFIG`` a run of its config registry (``args``: torchtitan's own
    overrides, which the command passes through unparsed), or with ``--accelerate CONFIG
    --model MODEL`` an Accelerate run."""
    if run is not None and accelerate is not None:
        raise typer.BadParameter(f"{RUN_FLAG} and {ACCELERATE_FLAG} are mutually exclusive")
    if model is not None and accelerate is None:
        raise typer.BadParameter(f"--model names the model of an {ACCELERATE_FLAG} run")
    if run is not None or accelerate is not None:
        from gbdoctor.frameworks.registry import spec_for_run

        extra = {"model": model} if accelerate is not None else {}
        name = run if run is not None else accelerate
        assert name is not None
        return spec_for_run(
            RUN_FLAG if run is not None else ACCELERATE_FLAG,
            name,
            tuple(args or ()),
            tuple(overrides or ()),
            simulate=simulate,
            world_size=world_size,
            **extra,
        )
    return load_spec_options(spec_path(args), overrides, simulate=simulate, world_size=world_size)


RUN_FLAG = "--torchtitan"
"""The option that names a run by a framework's config registry (``options.TorchtitanOpt``)."""
ACCELERATE_FLAG = "--accelerate"
"""The option that names an Accelerate run by its config file (``options.AccelerateOpt``)."""


def named_run(torchtitan: str | None, accelerate: str | None) -> str | None:
    """The run a framework's own option names instead of a SPEC.toml, if any."""
    return torchtitan if torchtitan is not None else accelerate


def spec_path(args: list[str] | None) -> Path:
    """The one SPEC.toml of ``args``; an option-like leftover is a framework override given
    without the run it belongs to."""
    if not args or len(args) != 1 or args[0].startswith("-"):
        options = [a for a in args or [] if a.startswith("-")]
        unknown = f"no such option: {' '.join(options)}; " if options else ""
        raise typer.BadParameter(
            f"{unknown}give one SPEC.toml (unknown options such as --section.key are torchtitan "
            f"overrides: they need {RUN_FLAG} MODULE:CONFIG)"
        )
    return Path(args[0])


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


def read_priced_scan(path: Path) -> ScanReport:
    """A ``gbdoctor price -f json`` output (a scan report with prices), for ``--price FILE``."""
    from gbdoctor.errors import BaselineError
    from gbdoctor.report.json import load_scan_json

    report = load_scan_json(path)
    if report.price is None:
        raise BaselineError(
            f"{path}: a scan without prices",
            hint="give the JSON output of `gbdoctor price SPEC -f json -o FILE`",
        )
    return report
