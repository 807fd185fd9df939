"""Formatters for :class:`~gbdoctor.run.RunReport` (``gbdoctor run``).

``table`` (rich, plain text at a fixed width: one comparison row per mode, a bar chart of
tokens/s scaled to the fastest mode, then each mode's failures, recompiles and notes),
``json`` (the records; timings vary run to run, the structure does not), ``markdown`` (the
comparison table, for READMEs and PR comments) and :func:`write_csv` (one row per mode, via
pandas). Everything shown is computed by ``gbdoctor.run``; these only lay out its records.
``run_table``, ``run_markdown`` and ``run_csv`` lay out each format, from ``run_cells``.
"""

from __future__ import annotations

from gbdoctor.errors import SpecError
from gbdoctor.records import RunReport
from gbdoctor.records.io import dumps
from gbdoctor.report.run_csv import CSV_COLUMNS, csv_rows, write_csv
from gbdoctor.report.run_markdown import render_markdown
from gbdoctor.report.run_table import render_table, tokens_bar

__all__ = ["CSV_COLUMNS", "RUN_FORMAT_NAMES", "csv_rows", "render_run", "tokens_bar", "write_csv"]

RUN_FORMAT_NAMES: tuple[str, ...] = ("table", "json", "markdown", "html")


def render_run(report: RunReport, fmt: str, *, details: bool = True) -> str:
    """The report in ``fmt`` (``table``, ``json`` or ``markdown``); SpecError for other names.
    ``details``: the table's secondary sections (``run --details``; the others hold all)."""
    if fmt == "json":
        return dumps(report)
    if fmt == "markdown":
        return render_markdown(report)
    if fmt == "table":
        return render_table(report, details)
    if fmt == "html":
        from gbdoctor.report.html import render_html, run_document

        return render_html([run_document(report)])
    raise SpecError(
        f"unknown format {fmt!r} for run",
        hint=f"valid formats: {', '.join(RUN_FORMAT_NAMES)} (and --csv FILE)",
    )
