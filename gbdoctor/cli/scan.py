"""``gbdoctor scan``: capture every graph break of every block (``gbdoctor.scan.scan``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gbdoctor.cli.inputs import choose_strategy, load_spec_args
from gbdoctor.cli.options import (
    RUN_FLAG,
    DetailsOpt,
    OutputOpt,
    RegistryRun,
    ScanFormatOpt,
    SetOpt,
    ShapesOpt,
    SimulateOpt,
    SpecArgs,
    StrategyOpt,
    StrictOpt,
    WorldSizeOpt,
    load_shapes,
)
from gbdoctor.cli.output import (
    ProgressBar,
    emit,
    notice,
    preflight,
    spare_model_code,
    table_width,
)
from gbdoctor.errors import ExitCode

if TYPE_CHECKING:
    from gbdoctor.frameworks import Framework
    from gbdoctor.records import Decision, ScanReport, Spec
    from gbdoctor.records.shapes import ShapeStream


def scan(
    spec_args: SpecArgs = None,
    registry_run: RegistryRun = None,
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="Scan with a gbdoctor plan.json applied")
    ] = None,
    format: ScanFormatOpt = "table",
    output: OutputOpt = None,
    details: DetailsOpt = False,
    strict: StrictOpt = False,
    simulate: SimulateOpt = False,
    world_size: WorldSizeOpt = None,
    no_dedupe: Annotated[
        bool, typer.Option("--no-dedupe", help="Capture every layer, not one per kind")
    ] = False,
    recompile_probe: Annotated[
        bool | None,
        typer.Option(
            "--recompile-probe/--no-recompile-probe",
            help="Run each block kind twice more with changed inputs and record its recompiles "
            "(default on; costs about two eager steps and two block replays per kind)",
            show_default=False,
        ),
    ] = None,
    shapes: ShapesOpt = None,
    oracle: Annotated[
        bool,
        typer.Option(
            "--oracle",
            help="Then compile every layer alone with plain torch.compile and the graph-break "
            "log, and print where that and the scan differ (exit 1 on an unexpected difference)",
        ),
    ] = False,
) -> None:
    """Capture every graph break of every block under the spec's training setup."""
    from gbdoctor.frameworks import framework_for
    from gbdoctor.report.formats import Printout, RenderOptions, render
    from gbdoctor.summary import has_findings

    files = () if registry_run is not None else tuple((spec_args or [])[:1])
    preflight(format, Printout.SCAN, output, inputs=(*files, plan, shapes))
    if shapes is not None and recompile_probe is False:
        raise typer.BadParameter(
            "--shapes is what the recompile probe follows: drop one of it and --no-recompile-probe"
        )
    stream = load_shapes(shapes)
    if oracle and (registry_run is not None or simulate):
        raise typer.BadParameter(
            "--oracle compiles every layer of a SPEC.toml's bare model for real: it takes no "
            f"{RUN_FLAG} and no --simulate"
        )
    loaded = load_spec_args(spec_args, registry_run, set_, simulate=simulate, world_size=world_size)
    spare_model_code(loaded, output)
    framework = framework_for(loaded)  # once: the --strategy check, the scan and its ranks
    report = scan_with_progress(
        loaded,
        choose_strategy(loaded, strategy, plan, framework),
        dedupe=not no_dedupe,
        recompiles=recompile_probe,
        shapes=stream,
        framework=framework,
    )
    notice(report.notes, output, format)
    options = RenderOptions(details=details, width=table_width(output))
    emit(render(Printout.SCAN, format, report, options), output)
    disagrees = oracle and not _oracle_agrees(loaded, report)
    if (strict and has_findings(report)) or disagrees:
        raise typer.Exit(int(ExitCode.FINDINGS))


def _oracle_agrees(spec: Spec, report: ScanReport) -> bool:
    """Run the oracle check (``scan.oracle``), print it on stderr; whether every layer agrees."""
    from gbdoctor.report.oracle import render_oracle
    from gbdoctor.scan.oracle import oracle_check

    result = oracle_check(spec, report)
    typer.echo(render_oracle(result), err=True)
    return result.agreeing == len(result.blocks)


def scan_with_progress(
    spec: Spec,
    strategy: Any,
    dedupe: bool = True,
    recompiles: bool | None = None,
    decision: Decision | None = None,
    shapes: ShapeStream | None = None,
    framework: Framework | None = None,
) -> ScanReport:
    """``gbdoctor.scan.scan`` under a progress bar on stderr (``framework``: the spec's, where
    the command resolved it)."""
    from gbdoctor.scan import scan as run_scan

    with ProgressBar() as bar:
        return run_scan(
            spec,
            strategy=strategy,
            dedupe=dedupe,
            progress=bar,
            recompiles=recompiles,
            decision=decision,
            shapes=shapes,
            framework=framework,
        )
