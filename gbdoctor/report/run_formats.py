"""Formatters for :class:`~gbdoctor.run.RunReport` (``gbdoctor run``).

``table`` (rich, plain text at a fixed width: one comparison row per mode, a bar chart of
tokens/s scaled to the fastest mode, then each mode's failures, recompiles and notes),
``json`` (the records; timings vary run to run, the structure does not), ``markdown`` (the
comparison table, for READMEs and PR comments) and :func:`write_csv` (one row per mode, via
pandas). Everything shown is computed by ``gbdoctor.run``; these only lay out its records.
``run_table``, ``run_markdown`` and ``run_csv`` lay out each format, from ``run_cells``.
"""

from __future__ import annotations

from gbdoctor.records import RunReport
from gbdoctor.records.io import dumps
from gbdoctor.report.formats import Printout, RenderOptions, render
from gbdoctor.report.run_csv import CSV_COLUMNS, csv_rows, write_csv
from gbdoctor.report.run_markdown import render_markdown
from gbdoctor.report.run_table import render_table, tokens_bar

__all__ = [
    "CSV_COLUMNS",
    "csv_rows",
    "render_run",
    "run_html",
    "run_json",
    "run_markdown",
    "run_table",
    "tokens_bar",
    "write_csv",
]


def run_table(report: RunReport, options: RenderOptions) -> str:
    """``--format table``; ``options.details``: its secondary sections (``run --details``)."""
    return render_table(report, options.details)


def run_json(report: RunReport, options: RenderOptions) -> str:
    return dumps(report)


def run_markdown(report: RunReport, options: RenderOptions) -> str:
    return render_markdown(report)


def run_html(report: RunReport, options: RenderOptions) -> str:
    from gbdoctor.report.html import render_html, run_document

    return render_html([run_document(report)])


def render_run(report: RunReport, fmt: str, *, details: bool = True) -> str:
    """The report in ``fmt`` (:func:`gbdoctor.report.formats.render` of ``Printout.RUN``);
    SpecError for other names. ``details``: the table's secondary sections (``run --details``;
    the others hold all)."""
    return render(Printout.RUN, fmt, report, RenderOptions(details=details))
