"""A scan in HTML: the model strip, distinct breaks by kind and cause with the user's source,
events, recompiles, CUDA-graph readiness and rank divergence. Counts come from
:func:`gbdoctor.summary.summarize`, the function the JSON's ``totals`` come from."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from gbdoctor.records import Break, EventKind, KindSummary, ScanReport, ScanSummary
from gbdoctor.report.html.extras import break_price, price_section
from gbdoctor.report.html.page import (
    KIND_COLORS,
    Page,
    badge,
    fields,
    h,
    section,
    table,
    tag,
)
from gbdoctor.report.html.source import SourceReader
from gbdoctor.report.layout import header_fields, one_line
from gbdoctor.summary import summarize

__all__ = ["scan_article"]

EAGER_EVENTS = frozenset(
    {EventKind.REGION_EAGER, EventKind.FRAME_SKIPPED, EventKind.RECOMPILE_LIMIT}
)
"""Events after which (part of) a block runs eagerly: the strip hatches its cell."""
_READINESS_TONE = {"ready": "good", "blocked": "bad"}


def scan_article(page: Page, report: ScanReport, doc: str, reader: SourceReader) -> str:
    """The article of one scan; ``doc`` prefixes its element ids (several documents per page)."""
    summary = summarize(report)
    colors = {row.kind: KIND_COLORS[i % len(KIND_COLORS)] for i, row in enumerate(summary.kinds)}
    price = getattr(report, "price", None)
    sections = [
        _overview(summary),
        _strip(report, summary, doc, colors),
        _breaks(summary, doc, reader, colors, price),
        price_section(page, price, doc) if price is not None else "",
        _events(summary, doc),
        _recompiles(report, doc),
        _cudagraphs(summary, doc),
        _divergence(report, doc),
        section(
            f"{doc}-setup",
            "Setup and notes",
            fields((label, h(value)) for label, value in header_fields(report)),
        ),
    ]
    return "".join(s for s in sections if s)


def _overview(summary: ScanSummary) -> str:
    cards = [
        ("blocks", summary.blocks),
        ("graph breaks", summary.breaks),
        ("events", summary.events),
        ("errors", summary.errors),
        ("graphs", summary.graphs),
    ]
    card_html = "".join(
        tag("div", tag("b", h(value)) + h(label), class_="card") for label, value in cards
    )
    by_cause = ", ".join(f"{cause} {n}" for cause, n in summary.by_cause) or "none"
    return tag("div", card_html, class_="cards") + tag(
        "p", h(f"Breaks by cause (every layer counts its own copy): {by_cause}")
    )


def _eager(events: Iterable[Any]) -> bool:
    return any(e.kind in EAGER_EVENTS for e in events)


def _strip(report: ScanReport, summary: ScanSummary, doc: str, colors: dict[str, str]) -> str:
    """One cell per layer, in model order: colour = kind, dot = breaks, hatching = eager."""
    cells = []
    for i, block in enumerate(report.blocks):
        marks = [
            "breaks" if block.breaks else "",
            "eager" if _eager(block.events) else "",
            "error" if block.error is not None else "",
        ]
        words = [
            w for w, mark in zip(("breaks", "runs eager", "error"), marks, strict=True) if mark
        ]
        title = f"{block.fqn}: {block.kind}" + (f" ({', '.join(words)})" if words else "")
        cells.append(
            tag(
                "button",
                h(i),
                class_=" ".join(["cell", *filter(None, marks)]),
                style=f"background-color: {colors[block.kind]}",
                title=title,
                type="button",
                data_kind=block.kind,
                data_fqn=block.fqn,
                data_card=f"{doc}-kind-{_slug(block.kind)}",
            )
        )
    legend = "".join(
        tag("span", tag("span", "", class_="swatch", style=f"background: {color}") + h(kind))
        for kind, color in colors.items()
    ) + (
        tag("span", tag("span", "", class_="swatch breaks") + "has graph breaks")
        + tag("span", tag("span", "", class_="swatch eager") + "runs eager (region or frame)")
    )
    cards = "".join(_kind_card(row, doc, colors[row.kind]) for row in summary.kinds)
    body = (
        tag("div", legend, class_="legend")
        + tag("div", "".join(cells), class_="strip")
        + tag("p", h("Click a layer for its kind."), class_="muted no-print")
        + tag("div", cards, class_="kind-details")
    )
    return section(f"{doc}-strip", f"Model ({summary.blocks} layers)", body)


def _kind_card(row: KindSummary, doc: str, color: str) -> str:
    ready = row.cudagraphs.summary if row.cudagraphs is not None else "nothing compiled"
    pairs = [
        ("kind", tag("b", h(row.kind), class_="kind-name")),
        ("layer", tag("span", h(row.layers[0]), class_="layer")),
        ("layers", h(f"{len(row.layers)}: {row.layers_label}")),
        ("graphs per block", h(row.graphs)),
        ("breaks per block", h(row.breaks)),
        ("events per block", h(row.events)),
        ("errors", h(row.errors)),
        ("causes", h(", ".join(row.causes) or "none")),
        ("CUDA graphs", h(ready)),
    ]
    if row.error:
        pairs.append(("error", h(one_line(row.error))))
    return tag(
        "div",
        fields(pairs),
        class_="kind-card",
        id=f"{doc}-kind-{_slug(row.kind)}",
        style=f"--kind: {color}",
        data_kind=row.kind,
    )


def _slug(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-") or "x"


BREAKS_SHOWN_PER_KIND = 100
"""Distinct breaks of one kind shown in full (a fix for the first ones usually fixes the rest;
a hand-made or runaway scan with 600k breaks made a page of ~0.8 GB, issue 45)."""


def _breaks(
    summary: ScanSummary,
    doc: str,
    reader: SourceReader,
    colors: dict[str, str],
    price: Any,
) -> str:
    """Distinct breaks (a shared capture's once) grouped by kind, then by cause."""
    from gbdoctor.frameworks.registry import cause_taxonomy

    taxonomy = cause_taxonomy().causes
    if not any(row.break_records for row in summary.kinds):
        return section(
            f"{doc}-breaks",
            "Graph breaks",
            tag("p", badge("no graph breaks", "good") + h(f" in {summary.blocks} block(s)")),
        )
    parts = []
    for row in summary.kinds:
        if not row.break_records:
            continue
        parts.append(
            tag(
                "h4",
                tag("span", "", class_="swatch", style=f"background: {colors[row.kind]}")
                + h(f"{row.kind} ({row.layers_label})"),
            )
        )
        by_cause: dict[str, list[Break]] = {}
        for brk in row.break_records[:BREAKS_SHOWN_PER_KIND]:
            by_cause.setdefault(brk.cause, []).append(brk)
        for cause, records in sorted(by_cause.items()):
            entry = taxonomy.get(cause)
            title = entry.title if entry is not None else cause
            head = tag("b", h(cause)) + h(f": {title}")
            why = tag("p", h(entry.explanation), class_="muted") if entry is not None else ""
            rows = "".join(
                _break(brk, reader, entry, break_price(price, row.kind, brk) if price else None)
                for brk in records
            )
            parts.append(tag("div", tag("p", head) + why + rows, class_="cause"))
        hidden = len(row.break_records) - BREAKS_SHOWN_PER_KIND
        if hidden > 0:
            parts.append(
                tag(
                    "p",
                    h(
                        f"... and {hidden} more distinct break(s) of {row.kind} not shown here "
                        f"(the first {BREAKS_SHOWN_PER_KIND} are): every one is in the JSON twin"
                    ),
                    class_="muted more-breaks",
                )
            )
    return section(f"{doc}-breaks", "Distinct graph breaks, by kind and cause", "".join(parts))


def _break(brk: Break, reader: SourceReader, entry: Any, price: str | None) -> str:
    count = f" (logged {brk.count} times)" if brk.count > 1 else ""
    head = (
        badge(brk.gb_id or "no gb id", "bad")
        + tag("span", h(one_line(brk.gb_type)), class_="gbtype")
        + h(count)
        + (badge("inside activation checkpoint", "warn") if brk.in_checkpoint else "")
    )
    pairs: list[tuple[str, str]] = []
    if brk.location is not None:
        snippet = reader.snippet(brk.location)
        where = tag("code", h(f"{brk.location}"))
        if brk.location.function:
            where += h(f" in {brk.location.function}")
        if snippet is not None:
            where = tag("a", where, href=snippet.path.as_uri())
        pairs.append(("where", where))
        if snippet is not None:
            lines = "".join(
                tag(
                    "span",
                    tag("i", h(snippet.first + i)) + h(text),
                    class_="hit" if snippet.first + i == snippet.line else None,
                )
                for i, text in enumerate(snippet.lines)
            )
            pairs.append(("source", tag("pre", lines, class_="src")))
        else:
            pairs.append(
                ("source", h("not found at report time (run the report where the code is)"))
            )
    else:
        pairs.append(("where", h("no user frame (torch internals only)")))
    pairs.append(("module", tag("code", h(brk.module))))
    if brk.region:
        pairs.append(("compiled region", tag("code", h(brk.region))))
    pairs.append(("set up by", h(brk.component)))
    if brk.explanation:
        pairs.append(("Dynamo says", h(one_line(brk.explanation))))
    if brk.context:
        pairs.append(("context", tag("code", h(one_line(brk.context)))))
    if entry is not None and entry.fixes:
        pairs.append(("fix", h(entry.fixes[0])))
        if len(entry.fixes) > 1:
            more = "".join(tag("li", h(fix)) for fix in entry.fixes[1:])
            pairs.append(("other fixes", tag("ul", more)))
    for hint in brk.hints:
        pairs.append(("Dynamo hint", h(one_line(hint))))
    if price is not None:
        pairs.append(("price", price))
    body = tag("div", head, class_="head") + tag(
        "dl", "".join(tag("dt", h(k)) + tag("dd", v) for k, v in pairs)
    )
    return tag("div", body, class_="break break-row", data_gb_id=brk.gb_id or "")


def _events(summary: ScanSummary, doc: str) -> str:
    rows = []
    for row in summary.kinds:
        for event in row.event_records:
            if event.kind == EventKind.RANK_DIVERGENCE:
                continue
            where = h(str(event.location)) if event.location is not None else "-"
            tone = "bad" if event.kind in EAGER_EVENTS else "warn"
            rows.append(
                (
                    h(row.kind),
                    badge(event.kind, tone),
                    tag("code", h(event.module)),
                    where,
                    h(one_line(event.detail or event.gb_type)),
                )
            )
        if row.error is not None:
            rows.append(
                (
                    h(row.kind),
                    badge("error", "bad"),
                    h(row.layers_label),
                    "-",
                    h(one_line(row.error)),
                )
            )
    if not rows:
        return ""
    return section(
        f"{doc}-events",
        "Events and errors (what runs eager or fails)",
        table(("kind", "event", "module", "location", "detail"), rows),
    )


def _recompiles(report: ScanReport, doc: str) -> str:
    if not report.setup.probed_recompiles:
        return section(
            f"{doc}-recompiles",
            "Recompiles",
            tag("p", h("not probed (scan with --recompile-probe to record them)"), class_="muted"),
        )
    rows = [
        (
            h(block.kind),
            badge(f"{rec.step} (every step)", "bad") if rec.measured else h(rec.step),
            tag("code", h(rec.reason)),
            h(rec.location or "-"),
            h(rec.function),
            badge("recompile limit hit", "bad") if rec.limit_hit else "",
        )
        for block in report.blocks
        if block.same_as is None
        for rec in block.recompiles
    ]
    if not rows:
        return section(f"{doc}-recompiles", "Recompiles", tag("p", badge("none", "good")))
    return section(
        f"{doc}-recompiles",
        "Recompiles when a block runs again with changed inputs (probe step 2 = on every step)",
        table(("kind", "step", "guard that failed", "location", "code", ""), rows),
    )


def _cudagraphs(summary: ScanSummary, doc: str) -> str:
    rows = [row for row in summary.kinds if row.cudagraphs is not None]
    if not rows:
        return ""
    body = []
    for row in rows:
        ready = row.cudagraphs
        assert ready is not None
        status = badge(ready.status, _READINESS_TONE.get(ready.status, "warn"))
        lines = [
            (
                badge(
                    f"{g.finding.kind} ({g.finding.effect})",
                    "bad" if g.finding.effect == "blocks" else "info",
                ),
                tag("code", h(g.finding.region)),
                h(f"{g.finding.graph}: {g.node_label}"),
                h(str(g.finding.location) if g.finding.location is not None else "-"),
                h(one_line(g.detail)),
            )
            for g in row.cudagraph_notable
        ]
        body.append(
            tag("h4", h(f"{row.kind} ") + status)
            + tag(
                "p",
                h(
                    f"{ready.summary}; {ready.graphs} graph(s) analysed, "
                    f"{ready.static_copies} static input copies"
                ),
            )
            + (
                table(("finding", "region", "graph: node", "location", "detail"), lines)
                if lines
                else ""
            )
        )
    return section(f"{doc}-cudagraphs", "CUDA-graph readiness per kind and region", "".join(body))


_RANK = re.compile(r"rank (\d+): ([^;]*)")


def _divergence(report: ScanReport, doc: str) -> str:
    """Rank x block: what each rank captured where ranks disagree (the events' own words)."""
    columns: list[str] = []
    cells: dict[tuple[int, str], str] = {}
    for block in report.blocks:
        for event in block.events:
            if event.kind != EventKind.RANK_DIVERGENCE:
                continue
            columns.append(block.fqn)
            for rank, text in _RANK.findall(event.detail):
                cells[(int(rank), block.fqn)] = text.strip()
    if not columns:
        return ""
    ranks = sorted({rank for rank, _ in cells})
    rows = [
        (h(f"rank {rank}"), *(h(cells.get((rank, fqn), "-")) for fqn in columns)) for rank in ranks
    ]
    return section(
        f"{doc}-divergence",
        "Rank divergence (ranks that captured something else than rank 0)",
        table(("rank", *columns), rows),
    )
