"""``--format table``: the human view. The only rich importer besides ``cli/``.

Also renders gate results as a table (``gate_formats`` delegates here so rich stays in one place).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gbdoctor.records import PriceReport, ScanReport, ScanSummary
from gbdoctor.report.layout import header_fields, one_line, short_location
from gbdoctor.report.price_rows import (
    KIND_HEADERS,
    PRICE_HEADERS,
    break_rows,
    cause_totals,
    kind_rows,
    price_check,
    price_headline,
)
from gbdoctor.summary import fix_hint, stage_rows, summarize

if TYPE_CHECKING:
    from gbdoctor.records import GateResult

__all__ = [
    "GateTableFormat",
    "TableFormat",
    "plain_text",
    "recording_console",
    "render_gate_table",
    "render_table",
]

WIDTH = 120


def recording_console() -> Console:
    """A console that renders plain text at a fixed width, for ``render()`` and the tests."""
    return Console(
        width=WIDTH,
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


def render_table(report: ScanReport, console: Console) -> None:
    """Print the header, the per-kind table, one row per break and per event, or "all clean"."""
    summary = summarize(report)
    console.print(Text("gbdoctor scan", style="bold"))
    console.print(_header(report))

    kinds = Table(title="Block kinds", title_justify="left", expand=False)
    for name in ("kind", "layers", "graphs", "breaks", "events", "causes"):
        kinds.add_column(
            name,
            justify="right" if name in ("graphs", "breaks", "events") else "left",
            overflow="fold",
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
    _render_cudagraphs(summary, console)
    _render_recompiles(report, console)

    if summary.clean:
        console.print(
            Text(
                f"All clean: {summary.blocks} block(s), {summary.graphs} graph(s), no graph breaks.",
                style="bold green",
            )
        )
        return

    if summary.breaks:
        breaks = Table(
            title=f"Graph breaks ({summary.breaks} over all layers)",
            title_justify="left",
            expand=True,
        )
        ratios = {"gb_type": 2, "fix hint": 3}
        for name in ("kind", "cause", "gb id", "gb_type", "location", "module", "fix hint"):
            breaks.add_column(
                name,
                overflow="fold",
                ratio=ratios.get(name),
                no_wrap=name in ("cause", "gb id", "location"),
            )
        for row in summary.kinds:
            for brk in row.break_records:
                gb_type = one_line(brk.gb_type) + (f" (x{brk.count})" if brk.count > 1 else "")
                breaks.add_row(
                    Text(row.kind),
                    Text(brk.cause, style="yellow"),
                    Text(brk.gb_id or "-"),
                    Text(gb_type),
                    Text(short_location(brk.location)),
                    Text(brk.module),
                    Text(fix_hint(brk.cause)),
                )
        console.print(breaks)

    if summary.events or summary.errors:
        events = Table(title="Events and errors", title_justify="left", expand=True)
        ratios = {"module": 2, "gb_type": 3, "detail": 4}
        for name in ("kind", "event", "module", "gb_type", "location", "detail"):
            events.add_column(
                name, overflow="fold", ratio=ratios.get(name), no_wrap=name in ("event", "location")
            )
        for row in summary.kinds:
            for event in row.event_records:
                events.add_row(
                    Text(row.kind),
                    Text(event.kind, style="red"),
                    Text(event.module),
                    Text(one_line(event.gb_type) or "-"),
                    Text(short_location(event.location)),
                    Text(one_line(event.detail)),
                )
            if row.error is not None:
                events.add_row(
                    Text(row.kind),
                    Text("error", style="red"),
                    Text(row.layers_label),
                    "-",
                    "-",
                    Text(one_line(row.error)),
                )
        console.print(events)

    if report.price is not None:
        _render_price(report.price, console)

    by_cause = ", ".join(f"{cause} {n}" for cause, n in summary.by_cause) or "none"
    console.print(
        Text(
            f"Totals: {summary.breaks} break(s) [{by_cause}], {summary.events} event(s), "
            f"{summary.errors} error(s), {summary.graphs} graph(s) over {summary.blocks} block(s)."
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


def _render_price(price: PriceReport, console: Console) -> None:
    for title, headers, rows in (
        ("Price per block kind", KIND_HEADERS, kind_rows(price)),
        ("Price per distinct break (ms per training step)", PRICE_HEADERS, break_rows(price)),
    ):
        if not rows:
            continue
        table = Table(title=title, title_justify="left", expand=True)
        for name in headers:
            table.add_column(name, overflow="fold", no_wrap=name in ("cause", "gb id", "share"))
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
    for line in (cause_totals(price), price_headline(price), price_check(price), *price.notes):
        if line:
            console.print(Text(line))


_NOTABLE_ROWS = 12
"""Readiness findings shown per kind in the table (the JSON has them all)."""


def _render_cudagraphs(summary: ScanSummary, console: Console) -> None:
    """CUDA-graph readiness per kind, then its blockers and caveats (copies are only counted)."""
    rows = [row for row in summary.kinds if row.cudagraphs is not None]
    if not rows:
        return
    table = Table(title="CUDA-graph readiness", title_justify="left", expand=True)
    for name, ratio in (("kind", 1), ("readiness / finding", 3), ("where", 3), ("detail", 4)):
        table.add_column(name, overflow="fold", ratio=ratio)
    for row in rows:
        ready = row.cudagraphs
        style = {"ready": "green", "blocked": "red"}.get(ready.status, "yellow")
        table.add_row(Text(row.kind), Text(ready.summary, style=style), "", "")
        for group in row.cudagraph_notable[:_NOTABLE_ROWS]:
            f = group.finding
            where = f"{short_location(f.location)} ({f.region} {f.graph}: {group.node_label})"
            table.add_row(
                "",
                Text(f"{f.kind} ({f.effect})", style="red" if f.effect == "blocks" else "dim"),
                Text(where),
                Text(one_line(group.detail)),
            )
        hidden = len(row.cudagraph_notable) - _NOTABLE_ROWS
        if hidden > 0:
            table.add_row("", Text(f"... {hidden} more (--format json)"), "", "")
    console.print(table)


def _render_recompiles(report: ScanReport, console: Console) -> None:
    """The probe's recompiles per captured block (step 1: new data and length; step 2: again)."""
    if not report.setup.probed_recompiles:
        console.print(
            Text("Recompiles: not probed (scan with --recompile-probe to record them)", style="dim")
        )
        return
    rows = [(b, rec) for b in report.blocks if b.same_as is None for rec in b.recompiles]
    if not rows:
        return
    table = Table(
        title="Recompiles when a block runs again with changed inputs (probe steps 1 and 2; "
        "step 2 = on every step)",
        title_justify="left",
        expand=True,
    )
    for name, ratio in (
        ("kind", None),
        ("step", None),
        ("guard that failed", 4),
        ("location", 2),
        ("code", 2),
    ):
        table.add_column(name, overflow="fold", ratio=ratio, no_wrap=name == "step")
    for block, rec in rows:
        step = Text(
            f"{rec.step}" + (" (every step)" if rec.measured else ""),
            style="red" if rec.measured else "yellow",
        )
        table.add_row(
            Text(block.kind), step, Text(rec.reason), Text(rec.location or "-"), Text(rec.function)
        )
    console.print(table)


class TableFormat:
    """Formatter for ``--format table`` (plain text when rendered through the registry)."""

    def render(self, report: ScanReport) -> str:
        console = recording_console()
        render_table(report, console)
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


def render_gate_table(result: GateResult, console: Console, title: str = GATE_TITLE) -> None:
    """Print the gate verdict and one row per finding."""
    verdict = Text(
        f"{title}: PASSED" if result.passed else f"{title}: FAILED",
        style="bold green" if result.passed else "bold red",
    )
    console.print(verdict)
    if not result.findings:
        console.print(Text("No change against the baseline."))
        return
    specs = list(dict.fromkeys([*result.specs, *(f.spec for f in result.findings)]))
    for spec in specs:
        findings = [f for f in result.findings if f.spec == spec]
        if not findings:
            console.print(Text(f"{spec}: no change against the baseline."))
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
    console.print(Text(result.headline))


class GateTableFormat:
    """Gate formatter for ``--format table``."""

    title = GATE_TITLE

    def render(self, result: GateResult) -> str:
        console = recording_console()
        render_gate_table(result, console, self.title)
        return plain_text(console)
