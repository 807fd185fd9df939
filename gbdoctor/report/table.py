"""``--format table``: the human view. The only rich importer besides ``cli/``.

Also renders gate results as a table (``gate_formats`` delegates here so rich stays in one place).
"""

from __future__ import annotations

import io
import shutil
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gbdoctor.records import ScanReport, ScanSummary
from gbdoctor.report.divergence import divergence_lines
from gbdoctor.report.layout import (
    fit_path,
    header_fields,
    location_label,
    one_line,
    setup_line,
    short_location,
)
from gbdoctor.report.table_details import (
    CUDAGRAPHS_LABEL,
    MODULE_WIDTH,
    WHERE_WIDTH,
    compact_table,
    cudagraph_line,
    keep_words_whole,
    recompile_line,
    render_cudagraph_details,
    render_price,
    render_recompile_details,
)
from gbdoctor.summary import fix_hint, stage_rows, summarize, top_cause, with_user_names

if TYPE_CHECKING:
    from gbdoctor.records import GateResult

__all__ = [
    "GateTableFormat",
    "TableFormat",
    "plain_text",
    "recording_console",
    "render_gate_table",
    "render_table",
    "terminal_width",
    "verdict",
]

WIDTH = 120
"""Width of the recorded console for every table but ``scan``'s (plan, run, causes, gate)."""


SCAN_WIDTH = 100
"""``scan``'s table where no terminal says otherwise: what a log or a file gets."""


def terminal_width() -> int:
    """Columns for ``scan``'s table: the terminal's (``COLUMNS`` first, as the shell sets it),
    100 when the output is not a terminal, so that a log or file reads the same on every
    machine; between 80 and 160."""
    return min(max(shutil.get_terminal_size((100, 24)).columns, 80), 160)


def recording_console(width: int = WIDTH) -> Console:
    """A console that renders plain text at a fixed width, for ``render()`` and the tests."""
    return Console(
        width=width,
        record=True,
        file=io.StringIO(),
        force_terminal=False,
        color_system=None,
        highlight=False,
        emoji=False,
    )


def plain_text(console: Console) -> str:
    """The recorded text without styles or the padding rich adds at line ends."""
    return "".join(line.rstrip() + "\n" for line in console.export_text(styles=False).splitlines())


def _header(report: ScanReport) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for label, value in header_fields(report):
        grid.add_row(label, Text(value))
    return grid


def verdict(summary: ScanSummary) -> str:
    """The answer in one line: breaks, the kinds they are in, events, errors, the top fix."""
    kinds = len(summary.kinds)
    if summary.clean:
        return (
            f"gbdoctor scan: all clean: {kinds} block kind(s), {summary.graphs} graph(s), "
            "no graph breaks."
        )
    broken = [row.kind for row in summary.kinds if row.breaks]
    distinct = sum(len(row.break_records) for row in summary.kinds)
    text = (
        f"gbdoctor scan: {summary.breaks} graph break(s) ({distinct} distinct) in "
        f"{len(broken)} of {kinds} block kind(s)"
        + (f" ({', '.join(broken)})" if broken else "")
        + f", {summary.events} event(s), {summary.errors} error(s)."
    )
    top = top_cause(summary)
    if top is not None and (fix := fix_hint(top[0])):
        text += f" Top fix ({top[0]}, {top[1]} of {summary.breaks}): {fix}"
    return text


def render_table(report: ScanReport, console: Console, *, details: bool = True) -> None:
    """The verdict, what was scanned, the per-kind table, the distinct breaks with each cause's
    fix once, events and errors, the price; then, with ``details``, the full readiness and
    recompile tables and the totals, else one line per kind for each of them and where the
    details are."""
    report = with_user_names(report)
    summary = summarize(report)
    console.print(Text(verdict(summary), style="bold green" if summary.clean else "bold"))
    if details:
        console.print(_header(report))
    else:
        console.print(Text(setup_line(report), style="dim"))
        for note in report.notes:
            if note.startswith("notice:"):
                console.print(Text(note))

    kinds = compact_table("Block kinds")
    for name in ("kind", "layers", "graphs", "breaks", "events", "causes"):
        kinds.add_column(
            name, justify="right" if name in ("graphs", "breaks", "events") else "left"
        )
    for row in summary.kinds:
        style = "green" if row.clean else ("red" if row.errors or row.events else "yellow")
        kinds.add_row(
            Text(row.kind, style=style),
            Text(row.layers_label),
            str(row.graphs),
            str(row.breaks),
            str(row.events),
            Text(", ".join(row.causes) or "-"),
        )
    console.print(kinds)
    _render_stages(report, console)

    if summary.clean:
        console.print(
            Text(
                f"All clean: {summary.blocks} block(s), {summary.graphs} graph(s), no graph breaks.",
                style="bold green",
            )
        )
    _render_breaks(summary, console)
    _render_events(summary, console)
    for line in divergence_lines(report):
        console.print(Text(line))
    if report.price is not None:
        render_price(report.price, console)

    if details:
        render_cudagraph_details(summary, console)
        render_recompile_details(report, console)
        if not summary.clean:
            by_cause = ", ".join(f"{cause} {n}" for cause, n in summary.by_cause) or "none"
            console.print(
                Text(
                    f"Totals: {summary.breaks} break(s) [{by_cause}], {summary.events} event(s), "
                    f"{summary.errors} error(s), {summary.graphs} graph(s) over "
                    f"{summary.blocks} block(s)."
                )
            )
        return
    _render_other_findings(report, summary, console)
    notes = sum(1 for note in report.notes if not note.startswith("notice:"))
    console.print(
        Text(
            "Details: --details (-v) for the setup"
            + (f" and its {notes} note(s)" if notes else "")
            + ", every CUDA-graph finding and recompile; "
            "--format json|markdown|html for everything.",
            style="dim",
        )
    )


def _render_stages(report: ScanReport, console: Console) -> None:
    """Under pipeline parallelism: stage -> layers -> kinds (breaks per block)."""
    rows = stage_rows(report)
    if not rows:
        return
    table = Table(title="Pipeline stages", title_justify="left", expand=False)
    for name in ("stage", "layers", "kinds (breaks per block)"):
        table.add_column(name, justify="right" if name == "stage" else "left", overflow="fold")
    for stage, layers, kinds in rows:
        cells = (f"{k} ({n}{', error' if failed else ''})" for k, n, failed in kinds)
        table.add_row(str(stage), layers, ", ".join(cells))
    console.print(table)


def _render_breaks(summary: ScanSummary, console: Console) -> None:
    """One row per distinct break, then each cause's fix once (ruff's one line per finding)."""
    if not summary.breaks:
        return
    distinct = sum(len(row.break_records) for row in summary.kinds)
    table = compact_table(f"Graph breaks ({summary.breaks} over all layers, {distinct} distinct)")
    for name in ("kind", "cause", "location", "module", "gb id", "gb_type"):
        table.add_column(name, no_wrap=name != "gb_type")
    causes: list[str] = []
    for row in summary.kinds:
        for brk in row.break_records:
            gb_type = one_line(brk.gb_type) + (f" (x{brk.count})" if brk.count > 1 else "")
            table.add_row(
                Text(row.kind),
                Text(brk.cause, style="yellow"),
                Text(location_label(brk.location, WHERE_WIDTH)),
                Text(fit_path(brk.module, MODULE_WIDTH, sep=".")),
                Text(brk.gb_id or "-"),
                Text(gb_type),
            )
            causes.append(brk.cause)
    console.print(keep_words_whole(table))
    fixes = Table.grid(padding=(0, 2))
    fixes.add_column(no_wrap=True)
    fixes.add_column()
    for cause in dict.fromkeys(causes):
        fixes.add_row(Text(f"fix {cause}", style="yellow"), Text(fix_hint(cause) or "-"))
    console.print(fixes)


def _render_events(summary: ScanSummary, console: Console) -> None:
    if not (summary.events or summary.errors):
        return
    events = compact_table("Events and errors")
    for name in ("kind", "event", "location", "module", "what"):
        events.add_column(name, no_wrap=name != "what")
    for row in summary.kinds:
        for event in row.event_records:
            what = one_line(event.gb_type)
            detail = one_line(event.detail)
            events.add_row(
                Text(row.kind),
                Text(event.kind, style="red"),
                Text(location_label(event.location, WHERE_WIDTH)),
                Text(fit_path(event.module, MODULE_WIDTH, sep=".")),
                Text(f"{what}: {detail}" if what and detail else what or detail or "-"),
            )
        if row.error is not None:
            events.add_row(
                Text(row.kind),
                Text("error", style="red"),
                "-",
                Text(row.layers_label),
                Text(one_line(row.error)),
            )
    console.print(keep_words_whole(events))


def _render_other_findings(report: ScanReport, summary: ScanSummary, console: Console) -> None:
    """One line per kind for recompiles and for CUDA-graph readiness."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column()
    if any(row.recompiles for row in summary.kinds) or report.setup.probed_recompiles:
        label = "Recompiles" + (" (probe)" if report.setup.probed_recompiles else "")
        for row in summary.kinds:
            grid.add_row(Text(label), Text(row.kind), Text(recompile_line(row)))
            label = ""
    else:
        grid.add_row(Text("Recompiles"), Text("-"), Text("not probed (--recompile-probe)"))
    label = CUDAGRAPHS_LABEL
    for row in summary.kinds:
        if row.cudagraphs is not None:
            grid.add_row(Text(label), Text(row.kind), Text(cudagraph_line(row)))
            label = ""
    console.print(grid)


class TableFormat:
    """Formatter for ``--format table`` (plain text when rendered through the registry):
    everything by default, as a library caller wants it; the CLI passes ``details=False``
    unless ``--details``."""

    def __init__(self, details: bool = True, width: int = SCAN_WIDTH) -> None:
        self.details = details
        self.width = width

    def render(self, report: ScanReport) -> str:
        console = recording_console(self.width)
        render_table(report, console, details=self.details)
        return plain_text(console)


# --------------------------------------------------------------------------- gate

_SEVERITY_STYLE = {
    "regression": "bold red",
    "improvement": "green",
    "warning": "yellow",
    "info": "dim",
}


GATE_TITLE = "gbdoctor gate"
"""The gate formats' title; ``gbdoctor diff`` renders the same result under its own."""


def render_gate_table(
    result: GateResult, console: Console, title: str = GATE_TITLE, *, details: bool = True
) -> None:
    """Print the gate verdict and one row per finding; without ``details``, the informational
    findings that do not fail the gate are only counted."""
    verdict = Text(
        f"{title}: PASSED" if result.passed else f"{title}: FAILED",
        style="bold green" if result.passed else "bold red",
    )
    console.print(verdict)
    if not result.findings:
        console.print(Text("No change against the baseline."))
        return
    shown = [f for f in result.findings if details or f.severity != "info" or result.fails(f)]
    specs = list(dict.fromkeys([*result.specs, *(f.spec for f in result.findings)]))
    for spec in specs:
        findings = [f for f in shown if f.spec == spec]
        if not findings:
            some = any(f.spec == spec for f in result.findings)
            console.print(
                Text(
                    f"{spec}: "
                    + ("informational changes only." if some else "no change against the baseline.")
                )
            )
            continue
        table = Table(title=spec, title_justify="left", expand=True)
        ratios = {"change": 3, "hint": 3}
        for name in ("severity", "kind", "change", "cause", "location", "hint"):
            table.add_column(name, overflow="fold", ratio=ratios.get(name))
        for f in findings:
            where = ", ".join(short_location(loc) for loc in f.locations) or "-"
            severity = f.severity + (
                " (fails)" if result.fails(f) and f.severity != "regression" else ""
            )
            table.add_row(
                Text(severity, style=_SEVERITY_STYLE.get(f.severity, "")),
                Text(f.kind or "-"),
                Text(f.what),
                Text(f.cause or "-"),
                Text(where),
                Text(f.hint or "-"),
            )
        console.print(table)
    if len(shown) < len(result.findings):
        hidden = len(result.findings) - len(shown)
        console.print(Text(f"{hidden} informational change(s): --details (-v)", style="dim"))
    console.print(Text(result.headline))


class GateTableFormat:
    """Gate formatter for ``--format table``."""

    title = GATE_TITLE
    details = True

    def render(self, result: GateResult) -> str:
        console = recording_console()
        render_gate_table(result, console, self.title, details=self.details)
        return plain_text(console)
