"""Layout of ``gbdoctor causes [ID]``."""

from __future__ import annotations

from gbdoctor.errors import SpecError
from gbdoctor.records.io import dumps


def render_cudagraph_blockers(fmt: str) -> str:
    """``gbdoctor causes --cudagraphs``: every CUDA-graph blocker kind, what it is, the fix."""
    from gbdoctor.causes import BLOCKER_EXPLANATIONS

    rows = [(str(k), what, fix) for k, (what, fix) in BLOCKER_EXPLANATIONS.items()]
    if fmt == "json":
        return dumps(
            {
                "schema_version": 1,
                "cudagraph_blockers": [{"kind": k, "what": w, "fix": f} for k, w, f in rows],
            }
        )
    if fmt != "table":
        raise SpecError(f"unknown format {fmt!r} for causes", hint="use --format table or json")
    from rich.table import Table

    from gbdoctor.report.table import plain_text, recording_console

    console = recording_console()
    table = Table(title="CUDA-graph blockers (scan reports them per compiled region)")
    for col in ("kind", "what", "fix"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return plain_text(console)


def render_causes(cause_id: str | None, fmt: str) -> str:
    from gbdoctor.causes import CAUSES, explain_cause

    selected = [explain_cause(cause_id)] if cause_id else [CAUSES[k] for k in sorted(CAUSES)]
    if fmt == "json":
        return dumps({"schema_version": 1, "causes": selected})
    if fmt != "table":
        raise SpecError(f"unknown format {fmt!r} for causes", hint="use --format table or json")
    from rich.table import Table

    from gbdoctor.report.table import plain_text, recording_console

    console = recording_console()
    if cause_id:
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
