"""``--format github``: GitHub Actions workflow commands (annotations on the PR diff).

One ``::warning`` per distinct break of each block kind and one ``::error`` per event or trace
error, each pointing at ``file=...,line=...`` when the record has a location, then one
``::notice`` with the totals. Values are escaped by the workflow-command rules: in the message
``%``, CR and LF; in properties also ``:`` and ``,``.
"""

from __future__ import annotations

from gbdoctor.records import Location, ScanReport
from gbdoctor.report.layout import one_line
from gbdoctor.summary import fix_hint, summarize

__all__ = ["GithubFormat", "command", "escape_data", "escape_property", "render_github"]


def escape_data(text: str) -> str:
    """Escape a workflow-command message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a workflow-command property value (``file``, ``title``, ...)."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(level: str, message: str, *, title: str = "", location: Location | None = None) -> str:
    """``::level file=F,line=L,title=T::message`` with every part escaped."""
    props = []
    if location is not None:
        props += [f"file={escape_property(location.file)}", f"line={location.line}"]
    if title:
        props.append(f"title={escape_property(title)}")
    head = f"::{level} {','.join(props)}" if props else f"::{level}"
    return f"{head}::{escape_data(message)}"


def render_github(report: ScanReport) -> str:
    """Workflow commands for every distinct break, event and error, plus a totals notice."""
    summary = summarize(report)
    lines = []
    for row in summary.kinds:
        where = f"{row.kind} blocks ({row.layers_label})"
        for brk in row.break_records:
            gb = f" {brk.gb_id}" if brk.gb_id else ""
            message = f"{where}: {one_line(brk.gb_type)} in {brk.module}"
            hint = fix_hint(brk.cause)
            if hint:
                message += f"\nFix: {hint}"
            lines.append(
                command(
                    "warning", message, title=f"graph break: {brk.cause}{gb}", location=brk.location
                )
            )
        if row.cudagraphs is not None and row.cudagraphs.status == "blocked":
            for group in (g for g in row.cudagraph_notable if g.finding.effect == "blocks"):
                f = group.finding
                message = (
                    f"{where}: CUDA graphs {row.cudagraphs.summary}; {f.kind} at "
                    f"{group.node_label} ({f.region} {f.graph})\n{one_line(group.detail)}"
                )
                lines.append(
                    command(
                        "notice", message, title=f"cudagraph blocker: {f.kind}", location=f.location
                    )
                )
        for event in row.event_records:
            message = f"{where}: {event.kind} in {event.module}"
            if event.detail:
                message += f"\n{one_line(event.detail)}"
            lines.append(
                command("error", message, title=f"gbdoctor: {event.kind}", location=event.location)
            )
        if row.error is not None:
            message = f"{where}: the block could not be traced\n{one_line(row.error)}"
            hint = fix_hint("error")
            if hint:
                message += f"\nFix: {hint}"
            lines.append(command("error", message, title="gbdoctor: block error"))
    if summary.clean:
        totals = f"{report.spec}: all clean, {summary.blocks} block(s), no graph breaks"
    else:
        totals = (
            f"{report.spec}: {summary.breaks} break(s), {summary.events} event(s), "
            f"{summary.errors} error(s) over {summary.blocks} block(s)"
        )
    lines.append(command("notice", totals, title="gbdoctor scan"))
    return "\n".join(lines) + "\n"


class GithubFormat:
    """Formatter for ``--format github``."""

    def render(self, report: ScanReport) -> str:
        return render_github(report)
