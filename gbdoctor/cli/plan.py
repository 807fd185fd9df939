"""``gbdoctor plan``: propose, verify and emit a compile plan (``gbdoctor.plan.propose_plan``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gbdoctor.cli.inputs import load_spec_args, read_priced_scan
from gbdoctor.cli.options import (
    OutputOpt,
    PlanFormatOpt,
    RegistryRun,
    SetOpt,
    SimulateOpt,
    SpecArgs,
    WorldSizeOpt,
)
from gbdoctor.cli.output import ProgressBar, emit, err_console, preflight, spare_model_code
from gbdoctor.errors import ExitCode


def plan(
    spec: SpecArgs = None,
    registry_run: RegistryRun = None,
    set_: SetOpt = None,
    emit_config: Annotated[
        str | None,
        typer.Option(
            "--emit-config",
            help="json|python|a format the spec's framework adds (the error lists them)",
        ),
    ] = None,
    price_file: Annotated[
        Path | None,
        typer.Option(
            "--price",
            help="A `gbdoctor price -f json` output of this spec: show each kind's predicted gain",
        ),
    ] = None,
    format: PlanFormatOpt = "table",
    output: OutputOpt = None,
    simulate: SimulateOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Propose a per-block compile/wrapping plan, verify it by re-scanning, emit it.

    Exit 1 when some block kind could not be verified (it is then left out of emitted code)."""
    from gbdoctor.cli.report import plan_printout
    from gbdoctor.plan import propose_plan
    from gbdoctor.plan.emit import EMITTERS
    from gbdoctor.plan.emit import emit as emit_plan
    from gbdoctor.records.enums import OutputFormat
    from gbdoctor.report.formats import Printout, render

    if emit_config is not None and emit_config not in EMITTERS:
        raise typer.BadParameter(f"--emit-config must be one of {', '.join(EMITTERS)}")
    files = tuple(spec or ()) if registry_run is None else ()
    preflight(format, Printout.PLAN, output, inputs=(*files, price_file))
    price = read_priced_scan(price_file).price if price_file is not None else None
    loaded = load_spec_args(spec, registry_run, set_, simulate=simulate, world_size=world_size)
    spare_model_code(loaded, output)
    with ProgressBar() as bar:
        result = propose_plan(loaded, progress=bar)
    printout = plan_printout(result, price, emit_config)
    if emit_config is None or format == OutputFormat.HTML:
        emit(render(Printout.PLAN, format, printout), output)
    else:
        # The table still shows (on stderr): stdout or --output holds only the emitted config.
        err_console.print(render(Printout.PLAN, format, printout), markup=False, highlight=False)
        emit(emit_plan(result, emit_config), output)
    if not result.verified:
        raise typer.Exit(int(ExitCode.FINDINGS))
