"""The formatter contract and the registry of scan-report formats.

A formatter lays out a :class:`~gbdoctor.records.ScanReport` (with the counts of
:mod:`gbdoctor.summary`) and returns text; it computes nothing and never prints. Adding a
format means one module with one class and one entry in :data:`FORMATS`.
"""

from __future__ import annotations

from typing import Protocol

from gbdoctor.errors import SpecError
from gbdoctor.records import ScanReport
from gbdoctor.report.github import GithubFormat
from gbdoctor.report.html import HtmlFormat
from gbdoctor.report.json import JsonFormat
from gbdoctor.report.junit import JunitFormat
from gbdoctor.report.markdown import MarkdownFormat
from gbdoctor.report.table import TableFormat
from gbdoctor.summary import with_user_names

__all__ = ["FORMATS", "FORMAT_NAMES", "Formatter", "formatter_for", "render"]


class Formatter(Protocol):
    """Renders a scan report as text (stdout or ``--output``)."""

    def render(self, report: ScanReport) -> str: ...


FORMATS: dict[str, type[Formatter]] = {
    "table": TableFormat,
    "json": JsonFormat,
    "markdown": MarkdownFormat,
    "junit": JunitFormat,
    "github": GithubFormat,
    "html": HtmlFormat,
}
"""``--format`` name -> formatter class (constructed without arguments)."""

FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)


def formatter_for(fmt: str) -> Formatter:
    """A formatter instance; :class:`SpecError` (exit 2) naming the valid formats otherwise."""
    try:
        return FORMATS[fmt]()
    except KeyError:
        raise SpecError(
            f"unknown format {fmt!r}", hint=f"valid formats: {', '.join(FORMAT_NAMES)}"
        ) from None


def render(report: ScanReport, fmt: str, *, details: bool = True, width: int | None = None) -> str:
    """The report rendered in format ``fmt``, with Dynamo's generated names said in the user's
    terms (``summary.with_user_names``). ``details``: ``table``'s full readiness and recompile
    tables (``scan --details``); the other formats always hold everything. ``width``: the
    table's columns (the CLI passes the terminal's; 100 otherwise, the same on every machine)."""
    formatter = formatter_for(fmt)
    if isinstance(formatter, TableFormat):
        formatter.details = details
        formatter.width = width or formatter.width
    return formatter.render(with_user_names(report))
