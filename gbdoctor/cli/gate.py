"""``gbdoctor gate``: the pre-merge check (``gbdoctor.gate.run_gate``)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gbdoctor.cli.inputs import (
    choose_strategy,
    load_spec_args,
    load_spec_options,
    spec_path,
)
from gbdoctor.cli.options import (
    RUN_FLAG,
    DetailsOpt,
    GateFormatOpt,
    OutputOpt,
    RegistryRun,
    SetOpt,
    ShapesOpt,
    SimulateOpt,
    StrategyOpt,
    StrictImprovementsOpt,
    WorldSizeOpt,
    load_shapes,
)
from gbdoctor.cli.output import emit, err_console, notice, preflight, print_err, spare_model_code
from gbdoctor.cli.scan import scan_with_progress

if TYPE_CHECKING:
    from gbdoctor.frameworks import Framework
    from gbdoctor.records import ScanReport, Spec
    from gbdoctor.records.shapes import ShapeStream


def gate(
    specs: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="SPEC...",
            help=f"Spec TOMLs to scan and gate; with {RUN_FLAG}, the --section.key overrides of "
            "its framework instead",
            show_default=False,
        ),
    ] = None,
    registry_run: RegistryRun = None,
    baseline: Annotated[
        Path,
        typer.Option(
            "--baseline", "-b", help="Baseline JSON (gbdoctor gate --update-baseline writes it)"
        ),
    ] = Path("gbdoctor-baseline.json"),
    scan_json: Annotated[
        list[Path] | None,
        typer.Option(
            "--scan", help="Use a saved `scan --format json` instead of scanning (repeatable)"
        ),
    ] = None,
    update_baseline: Annotated[
        bool, typer.Option("--update-baseline", help="Write the baseline from this scan and pass")
    ] = False,
    strict_improvements: StrictImprovementsOpt = False,
    recompiles: Annotated[
        bool,
        typer.Option(
            "--recompiles",
            help="Also fail when a kind recompiles more when its inputs change (the scan's "
            "recompile probe, which runs only with this flag), above all on every step",
        ),
    ] = False,
    shapes: ShapesOpt = None,
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    format: GateFormatOpt = "table",
    output: OutputOpt = None,
    details: DetailsOpt = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Also write the HTML report (findings, then every gated scan) to FILE",
            show_default=False,
        ),
    ] = None,
    simulate: SimulateOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Pre-merge check: exit 1 when graph breaks, new causes or eager fallbacks appear."""
    from gbdoctor.cli.report import gate_printout, write_step_summary
    from gbdoctor.frameworks import framework_for
    from gbdoctor.gate import open_baseline, run_gate
    from gbdoctor.records.enums import OutputFormat
    from gbdoctor.report.formats import Printout, RenderOptions, render
    from gbdoctor.report.json import load_scan_json

    if not specs and not scan_json and registry_run is None:
        raise typer.BadParameter("give at least one SPEC or --scan FILE")
    files = [spec_path([s]) for s in specs or []] if registry_run is None else []
    preflight(
        format,
        Printout.GATE,
        output,
        html,
        inputs=(baseline, *files, *(scan_json or []), shapes),
    )
    if shapes is not None and not recompiles:
        raise typer.BadParameter("--shapes is what the recompile probe follows: add --recompiles")
    stream = load_shapes(shapes)
    # Everything that can be wrong with the inputs is found before the first scan starts.
    accepted = open_baseline(baseline, update=update_baseline)
    reports = [load_scan_json(path) for path in scan_json or []]
    scanned: list[ScanReport] = []
    # With --torchtitan the run (name + overrides) is the one spec; its key in the baseline.
    loaded_specs = (
        [load_spec_args(specs, registry_run, set_, simulate=simulate, world_size=world_size)]
        if registry_run is not None
        else [
            load_spec_options(path, set_, simulate=simulate, world_size=world_size)
            for path in files
        ]
    )
    for loaded in loaded_specs:
        spare_model_code(loaded, output, html)
    # Each spec's framework once: its --strategy check, its scan and the scan's ranks.
    frameworks = [framework_for(loaded) for loaded in loaded_specs]
    strategies = [
        choose_strategy(loaded, strategy, None, framework)
        for loaded, framework in zip(loaded_specs, frameworks, strict=True)
    ]
    # The probe costs about two eager steps per kind: only when recompiles are gated.
    scans = [
        functools.partial(
            _scan,
            loaded,
            chosen,
            recompiles=recompiles,
            output=output,
            format=format,
            into=scanned,
            shapes=stream,
            framework=framework,
        )
        for loaded, chosen, framework in zip(loaded_specs, strategies, frameworks, strict=True)
    ]
    result = run_gate(
        baseline,
        accepted,
        reports,
        scans,
        update=update_baseline,
        strict_improvements=strict_improvements,
        recompiles=recompiles,
        warn=lambda line: err_console.print(line, markup=False, highlight=False),
    )
    if result is None:
        print_err(f"baseline written: {baseline}")
        return
    gated = [*reports, *scanned]
    printout = gate_printout(result, gated, scan_json or ())
    emit(render(Printout.GATE, format, printout, RenderOptions(details=details)), output)
    if html is not None:
        emit(render(Printout.GATE, OutputFormat.HTML, printout), html)
    page = html if html is not None else output if format == OutputFormat.HTML else None
    write_step_summary(result, page)
    raise typer.Exit(result.exit_code)


def _scan(
    spec: Spec,
    strategy: Any,
    *,
    recompiles: bool,
    output: Path | None,
    format: str,
    into: list[ScanReport],
    framework: Framework,
    shapes: ShapeStream | None = None,
) -> ScanReport:
    """One gated spec's scan, its automatic-simulation notice shown as soon as it is done; kept
    in ``into`` for the HTML report. ``framework``: the spec's, as the command resolved it."""
    report = scan_with_progress(
        spec, strategy, recompiles=recompiles, shapes=shapes, framework=framework
    )
    notice(report.notes, output, format)
    into.append(report)
    return report
