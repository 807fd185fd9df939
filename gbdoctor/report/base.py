"""The formatter contract and the renderers of scan reports (``scan`` and ``price``; the
registry of formats is :mod:`gbdoctor.report.formats`).

A formatter lays out a :class:`~gbdoctor.records.ScanReport` (with the counts of
:mod:`gbdoctor.summary`) and returns text; it computes nothing and never prints. Adding a
format means one module with one class, one renderer here and one line in
``formats.RENDERERS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gbdoctor.records import ScanReport
from gbdoctor.report.formats import Printout, RenderOptions
from gbdoctor.report.formats import render as render_printout
from gbdoctor.report.github import GithubFormat
from gbdoctor.report.html import HtmlFormat
from gbdoctor.report.json import JsonFormat
from gbdoctor.report.junit import JunitFormat
from gbdoctor.report.markdown import MarkdownFormat
from gbdoctor.report.table import TableFormat
from gbdoctor.summary import with_user_names

__all__ = [
    "Formatter",
    "render",
    "scan_github",
    "scan_html",
    "scan_json",
    "scan_junit",
    "scan_markdown",
    "scan_table",
]


class Formatter(Protocol):
    """Renders a scan report as text (stdout or ``--output``)."""

    def render(self, report: ScanReport) -> str: ...


def scan_table(report: ScanReport, options: RenderOptions) -> str:
    """``--format table``: ``options.details`` adds the full readiness and recompile tables
    (``scan --details``); ``options.width``: the terminal's columns (100 otherwise, the same
    on every machine)."""
    formatter = TableFormat(details=options.details)
    formatter.width = options.width or formatter.width
    return _in_user_terms(formatter, report)


def _in_user_terms(formatter: Formatter, report: ScanReport) -> str:
    """Every format says Dynamo's generated names in the user's terms
    (``summary.with_user_names``)."""
    return formatter.render(with_user_names(report))


def _whole(formatter: type[Formatter]) -> Callable[[ScanReport, RenderOptions], str]:
    """The renderer of a format that always holds everything, at no width."""

    def render_whole(report: ScanReport, options: RenderOptions) -> str:
        return _in_user_terms(formatter(), report)

    return render_whole


scan_json = _whole(JsonFormat)
scan_markdown = _whole(MarkdownFormat)
scan_junit = _whole(JunitFormat)
scan_github = _whole(GithubFormat)
scan_html = _whole(HtmlFormat)


def render(report: ScanReport, fmt: str, *, details: bool = True, width: int | None = None) -> str:
    """The scan report in format ``fmt`` (:func:`gbdoctor.report.formats.render` of
    ``Printout.SCAN``); :class:`~gbdoctor.errors.SpecError` (exit 2) for an unknown format."""
    return render_printout(Printout.SCAN, fmt, report, RenderOptions(details, width))
