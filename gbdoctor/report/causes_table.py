"""Layout of ``gbdoctor causes [ID]`` (its renderers; the registry is
:mod:`gbdoctor.report.formats`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gbdoctor.records.io import dumps
from gbdoctor.report.formats import RenderOptions

if TYPE_CHECKING:
    from gbdoctor.causes import Cause


@dataclass(frozen=True)
class CausesPrintout:
    """What ``gbdoctor causes`` prints: one cause (``cause_id``), every cause, or
    (``cudagraphs``) every CUDA-graph blocker kind."""

    cause_id: str | None = None
    cudagraphs: bool = False


def _blocker_rows() -> list[tuple[str, str, str]]:
    from gbdoctor.frameworks.registry import cause_taxonomy

    blockers = cause_taxonomy().blockers
    return [(str(k), what, fix) for k, (what, fix) in blockers.items()]


def _selected_causes(cause_id: str | None) -> list[Cause]:
    from gbdoctor.frameworks.registry import cause_taxonomy

    taxonomy = cause_taxonomy()
    if cause_id:
        return [taxonomy.explain(cause_id)]
    return [taxonomy.causes[k] for k in sorted(taxonomy.causes)]


def causes_json(printout: CausesPrintout, options: RenderOptions) -> str:
    if printout.cudagraphs:
        rows = _blocker_rows()
        return dumps(
            {
                "schema_version": 1,
                "cudagraph_blockers": [{"kind": k, "what": w, "fix": f} for k, w, f in rows],
            }
        )
    return dumps({"schema_version": 1, "causes": _selected_causes(printout.cause_id)})


def causes_table(printout: CausesPrintout, options: RenderOptions) -> str:
    from rich.table import Table

    from gbdoctor.report.table import plain_text, recording_console

    console = recording_console()
    if printout.cudagraphs:
        # ``gbdoctor causes --cudagraphs``: every CUDA-graph blocker kind, what it is, the fix.
        table = Table(title="CUDA-graph blockers (scan reports them per compiled region)")
        for col in ("kind", "what", "fix"):
            table.add_column(col)
        for row in _blocker_rows():
            table.add_row(*row)
        console.print(table)
        return plain_text(console)
    selected = _selected_causes(printout.cause_id)
    if printout.cause_id:
        c = selected[0]
        console.print(f"[bold]{c.id}[/]: {c.title}")
        console.print(c.explanation)
        console.print(f"owner: {c.owner}   effort: {c.effort}")
        for fix in c.fixes:
            console.print(f"  - {fix}")
        return plain_text(console)
    table = Table()
    for col in ("id", "what", "owner", "effort", "first fix"):
        table.add_column(col)
    for c in selected:
        table.add_row(c.id, c.explanation, c.owner, c.effort, c.fixes[0] if c.fixes else "")
    console.print(table)
    return plain_text(console)
