"""``gbdoctor gate``: the pre-merge check (``gbdoctor.gate``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gbdoctor.cli.inputs import choose_strategy, load_spec_options
from gbdoctor.cli.options import (
    GateFormatOpt,
    OutputOpt,
    SetOpt,
    SimulateOpt,
    StrategyOpt,
    StrictImprovementsOpt,
    WorldSizeOpt,
)
from gbdoctor.cli.output import emit, err_console, notice, preflight, print_err
from gbdoctor.cli.scan import scan_with_progress


def gate(
    specs: Annotated[
        list[Path] | None, typer.Argument(help="Spec TOMLs to scan and gate", show_default=False)
    ] = None,
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
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    format: GateFormatOpt = "table",
    output: OutputOpt = None,
    simulate: SimulateOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Pre-merge check: exit 1 when graph breaks, new causes or eager fallbacks appear."""
    from gbdoctor.gate import (
        baseline_from_reports,
        check_gate,
        current_pins,
        dump_baseline,
        load_baseline,
        merge_baselines,
        pinned_dynamo,
    )
    from gbdoctor.records.io import check_writable, locked, write_atomic
    from gbdoctor.report import render_gate
    from gbdoctor.report.json import load_scan_json

    if not specs and not scan_json:
        raise typer.BadParameter("give at least one SPEC or --scan FILE")
    preflight(format, "gate", output)
    # Everything that can be wrong with the inputs is found before the first scan starts.
    if update_baseline:
        check_writable(baseline, "baseline")
        previous = load_baseline(baseline) if baseline.exists() else None
        accepted = None
    else:
        accepted = previous = load_baseline(baseline)
    reports = [load_scan_json(path) for path in scan_json or []]
    loaded_specs = [
        load_spec_options(spec, set_, simulate=simulate, world_size=world_size)
        for spec in specs or []
    ]
    strategies = [choose_strategy(loaded, strategy, None) for loaded in loaded_specs]
    # Scans run under the Dynamo settings the baseline pins (nested_graph_breaks, ...), so
    # counts stay comparable across torch releases whose defaults differ.
    pins = (
        previous.dynamo_config
        if previous is not None and previous.dynamo_config
        else current_pins()
    )
    with pinned_dynamo(pins) as unknown:
        for name in unknown:
            err_console.print(
                f"warning: this torch has no Dynamo setting {name!r} the baseline pins",
                markup=False,
                highlight=False,
            )
        for loaded, chosen in zip(loaded_specs, strategies, strict=True):
            # The probe costs about two eager steps per kind: only when recompiles are gated.
            reports.append(scan_with_progress(loaded, chosen, recompiles=recompiles))
            notice(reports[-1].notes, output, format)
    if update_baseline:
        with locked(baseline):  # read-merge-write: a concurrent update must not lose an entry
            old = load_baseline(baseline) if baseline.exists() else None
            merged = merge_baselines(old, baseline_from_reports(reports, pins))
            write_atomic(baseline, dump_baseline(merged), "baseline")
        print_err(f"baseline written: {baseline}")
        return
    result = check_gate(
        reports,
        accepted,
        strict_improvements=strict_improvements,
        recompiles=recompiles,
    )
    emit(render_gate(result, format), output)
    raise typer.Exit(result.exit_code)
