"""``gbdoctor diff``: two saved scans compared with the gate's rules (``gate.diff_reports``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gbdoctor.cli.options import GateFormatOpt, OutputOpt, StrictImprovementsOpt
from gbdoctor.cli.output import emit, preflight


def diff(
    old: Annotated[Path, typer.Argument(help="Earlier `scan --format json` output")],
    new: Annotated[Path, typer.Argument(help="Later `scan --format json` output")],
    strict_improvements: StrictImprovementsOpt = False,
    max_price_rise: Annotated[
        float | None,
        typer.Option(
            "--max-price-rise",
            help="Also fail when the total price (`gbdoctor price` outputs, same device class) "
            "rises by more than PCT percent beyond both spreads",
            metavar="PCT",
        ),
    ] = None,
    format: GateFormatOpt = "table",
    output: OutputOpt = None,
) -> None:
    """Compare two saved scans (e.g. before/after a torch upgrade) with the gate's rules."""
    from gbdoctor.gate import diff_reports
    from gbdoctor.report.formats import Printout, render
    from gbdoctor.report.gate_formats import GatePrintout
    from gbdoctor.report.json import load_scan_json

    preflight(format, Printout.GATE, output, inputs=(old, new))
    if max_price_rise is not None and max_price_rise < 0:
        raise typer.BadParameter(f"--max-price-rise must be >= 0 (got {max_price_rise})")
    result = diff_reports(
        load_scan_json(old),
        load_scan_json(new),
        strict_improvements=strict_improvements,
        max_price_rise=max_price_rise,
    )
    emit(render(Printout.GATE, format, GatePrintout(result, title="gbdoctor diff")), output)
    raise typer.Exit(result.exit_code)
