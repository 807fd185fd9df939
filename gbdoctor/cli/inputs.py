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
) -> Spec:
    """One spec from the command line: a TOML file (``args`` holds its path), or with
    ``--torchtitan MODULE:CONFIG`` a run of its config registry (``args``: torchtitan's own
    overrides, which the command passes through unparsed)."""
    if run is not None:
        from gbdoctor.frameworks.registry import command_line_run, spec_for_run

        return spec_for_run(
            command_line_run().flag,
            run,
            tuple(args or ()),
            tuple(overrides or ()),
            simulate=simulate,
            world_size=world_size,
        )
    return load_spec_options(spec_path(args), overrides, simulate=simulate, world_size=world_size)


def spec_path(args: list[str] | None) -> Path:
    """The one SPEC.toml of ``args``; an option-like leftover is a framework override given
    without the run it belongs to."""
    if not args or len(args) != 1 or args[0].startswith("-"):
        from gbdoctor.frameworks.registry import command_line_run

        runs = command_line_run()
        options = [a for a in args or [] if a.startswith("-")]
        unknown = f"no such option: {' '.join(options)}; " if options else ""
        raise typer.BadParameter(
            f"{unknown}give one SPEC.toml (unknown options such as --section.key are overrides "
            f"of {runs.title}: they need {runs.flag} MODULE:CONFIG)"
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
