"""``--format markdown``: a PR-comment friendly summary (GitHub-flavoured tables, no ANSI)."""

from __future__ import annotations

from collections.abc import Iterable

from gbdoctor.records import ScanReport
from gbdoctor.report.divergence import divergence_lines
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
from gbdoctor.summary import fix_hint, summarize

__all__ = ["MarkdownFormat", "cell", "md_table", "render_markdown"]


def cell(text: object) -> str:
    """One table cell: a single line with ``|`` and ``<`` escaped; ``-`` when empty."""
    value = one_line(str(text)).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
    return value or "-"


def code(text: str) -> str:
    """Inline code span that survives backticks in the text."""
    text = one_line(text)
    if not text:
        return "-"
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def md_table(headers: Iterable[str], rows: Iterable[Iterable[object]]) -> list[str]:
    """Lines of a GitHub table; cells are escaped with :func:`cell` unless already code spans."""
    headers = list(headers)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    for row in rows:
        lines.append(
            "| " + " | ".join(c.text if isinstance(c, _Raw) else cell(c) for c in row) + " |"
        )
    return lines


class _Raw:
    """A cell that is already markdown (a code span) and must not be escaped again."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text.replace("|", "\\|")


def render_markdown(report: ScanReport) -> str:
    """The scan as markdown: header, per-kind table, breaks, events and errors, totals."""
    summary = summarize(report)
    lines = [f"## gbdoctor scan: `{one_line(report.spec)}`", ""]
    lines += [f"- **{label}**: {cell(value)}" for label, value in header_fields(report)]
    lines.append("")
    lines += md_table(
        ("kind", "layers", "graphs", "breaks", "events", "causes"),
        (
            (row.kind, row.layers_label, row.graphs, row.breaks, row.events, ", ".join(row.causes))
            for row in summary.kinds
        ),
    )
    lines.append("")
    # Each row with its readiness, so that the loop sees it non-None.
    ready_rows = [(row, row.cudagraphs) for row in summary.kinds if row.cudagraphs is not None]
    if ready_rows:
        lines += ["### CUDA-graph readiness", ""]
        rows: list[tuple[object, ...]] = []  # plain cells and _Raw code spans
        for row, readiness in ready_rows:
            rows.append((row.kind, readiness.summary, "", "", "", "", ""))
            rows += [
                (
                    "",
                    "",
                    _Raw(code(f"{g.finding.kind} ({g.finding.effect})")),
                    f"{g.finding.region} {g.finding.graph}",
                    _Raw(code(g.node_label)),
                    _Raw(code(short_location(g.finding.location))),
                    g.detail,
                )
                for g in row.cudagraph_notable
            ]
        lines += md_table(
            ("kind", "readiness", "finding", "graph", "node", "location", "detail"), rows
        )
        lines.append("")
    if summary.clean:
        lines.append(
            f"**All clean**: {summary.blocks} block(s), {summary.graphs} graph(s), no graph breaks."
        )
        return "\n".join(lines) + "\n"

    if summary.breaks:
        lines += [f"### Graph breaks ({summary.breaks} over all layers)", ""]
        lines += md_table(
            ("kind", "cause", "gb id", "gb_type", "location", "module", "fix hint"),
            (
                (
                    row.kind,
                    _Raw(code(brk.cause)),
                    brk.gb_id or "-",
                    brk.gb_type + (f" (x{brk.count})" if brk.count > 1 else ""),
                    _Raw(code(short_location(brk.location))),
                    _Raw(code(brk.module)),
                    fix_hint(brk.cause),
                )
                for row in summary.kinds
                for brk in row.break_records
            ),
        )
        lines.append("")
    if summary.events or summary.errors:
        rows = []
        for row in summary.kinds:
            rows += [
                (
                    row.kind,
                    _Raw(code(e.kind)),
                    _Raw(code(e.module)),
                    e.gb_type,
                    _Raw(code(short_location(e.location))),
                    e.detail,
                )
                for e in row.event_records
            ]
            if row.error is not None:
                rows.append((row.kind, _Raw(code("error")), row.layers_label, "-", "-", row.error))
        lines += ["### Events and errors", ""]
        lines += md_table(("kind", "event", "module", "gb_type", "location", "detail"), rows)
        lines.append("")
    section = divergence_lines(report)
    if section:
        lines += [f"### {section[0]}", "", *section[1:], ""]
    if report.price is not None:
        lines += ["### Price per block kind", ""]
        lines += md_table(KIND_HEADERS, kind_rows(report.price))
        lines += ["", "### Price per distinct break (ms per training step)", ""]
        lines += md_table(PRICE_HEADERS, break_rows(report.price))
        lines.append("")
        check = price_check(report.price)
        by_cause = cause_totals(report.price)
        lines += [
            *([by_cause] if by_cause else []),
            price_headline(report.price),
            *([check] if check else []),
            *report.price.notes,
            "",
        ]
    by_cause = ", ".join(f"`{cause}` {n}" for cause, n in summary.by_cause) or "none"
    lines.append(
        f"**Totals**: {summary.breaks} break(s) ({by_cause}), {summary.events} event(s), "
        f"{summary.errors} error(s), {summary.graphs} graph(s) over {summary.blocks} block(s)."
    )
    return "\n".join(lines) + "\n"


class MarkdownFormat:
    """Formatter for ``--format markdown``."""

    def render(self, report: ScanReport) -> str:
        return render_markdown(report)
