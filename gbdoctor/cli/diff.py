"""``gbdoctor diff``: two saved scans compared with the gate's rules (``gate.diff_reports``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gbdoctor.cli.options import DiffFormatOpt, OutputOpt, StrictImprovementsOpt
from gbdoctor.cli.output import emit, preflight


def diff(
    old: Annotated[Path, typer.Argument(help="Earlier `scan --format json` output")],
    new: Annotated[Path, typer.Argument(help="Later `scan --format json` output")],
    strict_improvements: StrictImprovementsOpt = False,
    format: DiffFormatOpt = "table",
    output: OutputOpt = None,
) -> None:
    """Compare two saved scans (e.g. before/after a torch upgrade) with the gate's rules."""
    from gbdoctor.gate import diff_reports
    from gbdoctor.report import render_gate
    from gbdoctor.report.json import load_scan_json

    preflight(format, "diff", output, inputs=(old, new))
    result = diff_reports(
        load_scan_json(old), load_scan_json(new), strict_improvements=strict_improvements
    )
    emit(render_gate(result, format), output)
    raise typer.Exit(result.exit_code)
