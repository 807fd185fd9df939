"""The parts of ``scan``'s table that a person reads on request (``--details``), and the one
line per kind that stands for each of them by default.

- CUDA-graph readiness: each kind's findings, every explanation printed once with the places
  that share it (under FSDP2 one explanation holds for every parameter of every graph);
- recompiles: the probe's (or the engine steps') failed guards, identical rows counted;
- the price tables of a priced scan.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from gbdoctor.causes.guards import guard_in_words
from gbdoctor.records import KindSummary, NotableFinding, PriceReport, ScanReport, ScanSummary
from gbdoctor.report.layout import fit_path, location_label, one_line
from gbdoctor.report.price_rows import (
    KIND_HEADERS,
    PRICE_HEADERS,
    break_rows,
    cause_totals,
    kind_rows,
    price_check,
    price_headline,
)
from gbdoctor.summary import recompile_location, recompiled_code

__all__ = [
    "CUDAGRAPHS_LABEL",
    "MODULE_WIDTH",
    "WHERE_WIDTH",
    "cudagraph_line",
    "keep_words_whole",
    "recompile_line",
    "render_cudagraph_details",
    "render_price",
    "render_recompile_details",
]

WHERE_WIDTH = 26
"""The most a location takes in a table cell (longer paths are shortened from the left)."""
MODULE_WIDTH = 22
"""The most a module path takes in a table cell (shortened from the left, by whole names)."""

CUDAGRAPHS_LABEL = "CUDA graphs (optional)"
"""What introduces readiness: it matters only to those who will use CUDA graphs
(``mode="reduce-overhead"``, torchtitan's cudagraph wrappers); a kind "blocked" for them is
not a problem with the block."""


def compact_table(title: str | None = None) -> Table:
    """A table with a rule under its header and no frame: two lines fewer than rich's box, and
    nothing a terminal has to wrap."""
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        expand=False,
    )


def keep_words_whole(table: Table, most: int = 16) -> Table:
    """Give each wrapping column at least its longest word (up to ``most`` characters: a cell's
    prose wraps between words; the paths and module names sit in columns that never wrap, fitted
    beforehand with ``layout.fit_path``)."""
    for column in table.columns:
        if column.no_wrap:
            continue
        words = [
            len(word)
            for cell in column.cells
            for word in (cell.plain if isinstance(cell, Text) else str(cell)).split()
        ]
        column.min_width = min(max([len(str(column.header)), *words]), most)
    return table


# --------------------------------------------------------------------------- CUDA graphs


def cudagraph_line(row: KindSummary) -> str:
    """One kind's readiness in a sentence: ``ready``, or what would stop CUDA graphs first."""
    ready = row.cudagraphs
    if ready is None:
        return "nothing compiled"
    first = next((g for g in row.cudagraph_notable if g.finding.effect == "blocks"), None)
    if ready.status == "blocked" and first is not None:
        more = len({g.finding.kind for g in row.cudagraph_notable if g.finding.effect == "blocks"})
        rest = f" (+{more - 1} more kinds of blocker)" if more > 1 else ""
        return f"not ready as set up; first blocker: {first.finding.kind}{_where(first)}{rest}"
    first_part, *others = one_line(ready.summary).split("; ")
    return first_part + (f" (+{len(others)} more)" if others else "")


def _where(group: NotableFinding) -> str:
    loc = group.finding.location
    return f" at {location_label(loc, WHERE_WIDTH)}" if loc is not None else ""


def render_cudagraph_details(summary: ScanSummary, console: Console) -> None:
    """Per kind: its readiness, then each explanation once, with the places that share it."""
    rows = [row for row in summary.kinds if row.cudagraphs is not None]
    if not rows:
        return
    console.print(Text(f"{CUDAGRAPHS_LABEL}: readiness per block kind", style="bold"))
    for row in rows:
        assert row.cudagraphs is not None
        style = {"ready": "green", "blocked": "red"}.get(row.cudagraphs.status, "yellow")
        console.print(Text(f"{row.kind}: {one_line(row.cudagraphs.summary)}", style=style))
        explained: dict[tuple[str, str, str], list[NotableFinding]] = {}
        for group in row.cudagraph_notable:
            key = (group.finding.kind, group.finding.effect, group.reason)
            explained.setdefault(key, []).append(group)
        for (kind, effect, reason), groups in explained.items():
            console.print(Padding(Text(f"{kind} ({effect}): {one_line(reason)}"), (0, 0, 0, 2)))
            for group in groups:
                f = group.finding
                names = ", ".join(group.subjects) if group.subjects else group.node_label
                place = location_label(f.location, WHERE_WIDTH) if f.location else ""
                line = f"- {place + ', ' if place else ''}{f.region} {f.graph}: {names}"
                console.print(Padding(Text(line), (0, 0, 0, 4)))


# --------------------------------------------------------------------------- recompiles


def recompile_line(row: KindSummary) -> str:
    """One kind's recompiles in a sentence: how many, how many on every step, the first guard
    (the first one on every step where there is one) in plain words and where."""
    if not row.recompiles:
        return "none"
    first = next((r for r in row.recompiles if r.measured), row.recompiles[0])
    where = recompile_location(first)
    at = f" at {fit_path(where, WHERE_WIDTH)}" if where else ""
    steady = (
        f"{row.steady_recompiles} on every step" if row.steady_recompiles else "none on every step"
    )
    guards = len({r.reason for r in row.recompiles})
    others = f" (+{guards - 1} other guards)" if guards > 1 else ""
    return f"{len(row.recompiles)}, {steady}; first: {guard_in_words(first.reason)}{at}{others}"


def render_recompile_details(report: ScanReport, console: Console) -> None:
    """Every recompile of the captured blocks; identical rows once, counted."""
    rows: dict[tuple[str, str, str, str, str], int] = {}
    for block in report.blocks:
        if block.same_as is not None:
            continue
        for rec in block.recompiles:
            step = f"{rec.step}" + (" (every step)" if rec.measured else "")
            where = recompile_location(rec)
            key = (
                block.kind,
                step,
                one_line(rec.reason) + (" (recompile_limit hit)" if rec.limit_hit else ""),
                fit_path(where, WHERE_WIDTH) if where else "-",
                recompiled_code(rec),
            )
            rows[key] = rows.get(key, 0) + 1
    if not rows:
        if not report.setup.probed_recompiles:
            console.print(
                Text(
                    "Recompiles: not probed (scan with --recompile-probe to record them)",
                    style="dim",
                )
            )
        return
    table = compact_table(
        "Recompiles when a block runs again with changed inputs "
        + (
            "(probe steps 1 and 2; step 2 = on every step)"
            if report.setup.probed_recompiles
            else "(engine steps)"
        )
    )
    for name in ("kind", "step", "guard that failed", "location", "code", "n"):
        table.add_column(
            name,
            no_wrap=name in ("kind", "step", "location", "n"),
            justify="right" if name == "n" else "left",
            ratio=3 if name == "guard that failed" else None,
        )
    for (kind, step, reason, where, code), count in rows.items():
        table.add_row(
            Text(kind),
            Text(step, style="red" if "every" in step else "yellow"),
            Text(reason),
            Text(where),
            Text(code),
            str(count),
        )
    console.print(keep_words_whole(table))


# --------------------------------------------------------------------------- price


def render_price(price: PriceReport, console: Console) -> None:
    """The priced scan's per-kind and per-break price tables and its checks."""
    for title, headers, rows in (
        ("Price per block kind", KIND_HEADERS, kind_rows(price)),
        ("Price per distinct break (ms per training step)", PRICE_HEADERS, break_rows(price)),
    ):
        if not rows:
            continue
        table = compact_table(title)
        for name in headers:
            table.add_column(name, no_wrap=name in ("cause", "gb id", "share", "location"))
        for row in rows:
            table.add_row(
                *(
                    Text(fit_path(cell, WHERE_WIDTH) if name == "location" else cell)
                    for name, cell in zip(headers, row, strict=True)
                )
            )
        console.print(keep_words_whole(table, most=10))
    for line in (cause_totals(price), price_headline(price), price_check(price), *price.notes):
        if line:
            console.print(Text(line))
