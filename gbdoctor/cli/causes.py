"""``gbdoctor causes``: the cause taxonomy (``gbdoctor.causes``), listed or one explained."""

from __future__ import annotations

from typing import Annotated

import typer

from gbdoctor.cli.options import CausesFormatOpt
from gbdoctor.cli.output import emit, preflight


def causes(
    cause_id: Annotated[str | None, typer.Argument(help="Explain one cause id")] = None,
    format: CausesFormatOpt = "table",
    cudagraphs: Annotated[
        bool, typer.Option("--cudagraphs", help="List the CUDA-graph blocker kinds and their fixes")
    ] = False,
) -> None:
    """List the cause ids gbdoctor classifies breaks into, or explain one."""
    from gbdoctor.report.causes_table import CausesPrintout
    from gbdoctor.report.formats import Printout, render

    preflight(format, Printout.CAUSES)
    emit(render(Printout.CAUSES, format, CausesPrintout(cause_id, cudagraphs)), None)
