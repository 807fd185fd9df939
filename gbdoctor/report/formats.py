"""The one registry of output formats: for each record a command prints (:class:`Printout`),
its ``--format`` values and the renderer of each. :class:`~gbdoctor.records.enums.OutputFormat`
is the only source of format names.

A command declares the printout it prints; its ``--format`` choices and help (``cli/options``),
the check before any work (``cli/output.preflight``) and its renderer (:func:`render`) all come
from :data:`RENDERERS`. Adding a format is one renderer plus one line here; a test renders every
format of every printout.

A renderer is named ``"module:function"`` inside ``gbdoctor.report`` and imported on first use,
so that the CLI reads the names at startup without loading rich or any formatter module. It is
called as ``renderer(record, options)`` and returns the text (it computes nothing and never
prints).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.records.enums import OutputFormat

__all__ = [
    "RENDERERS",
    "Printout",
    "RenderOptions",
    "Renderer",
    "check_format",
    "format_help",
    "formats_of",
    "render",
    "renderer_for",
]


class Printout(StrEnum):
    """What a command prints: the record its renderers lay out."""

    SCAN = "scan"
    """A :class:`~gbdoctor.records.ScanReport` (``scan``)."""
    PRICE = "price"
    """A priced :class:`~gbdoctor.records.ScanReport` (``price``)."""
    PLAN = "plan"
    """A :class:`~gbdoctor.report.plan_table.PlanPrintout` (``plan``)."""
    RUN = "run"
    """A :class:`~gbdoctor.records.RunReport` (``run``)."""
    GATE = "gate"
    """A :class:`~gbdoctor.report.gate_formats.GatePrintout` (``gate`` and ``diff``)."""
    TIMELINE = "timeline"
    """A :class:`~gbdoctor.records.TimelineReport` (``timeline``)."""
    INSPECT = "inspect"
    """A :class:`~gbdoctor.records.SetupReport` (``inspect``)."""
    CAUSES = "causes"
    """A :class:`~gbdoctor.report.causes_table.CausesPrintout` (``causes``)."""
    REPORT = "report"
    """A :class:`~gbdoctor.report.html.Results` (``report``: one page, no ``--format``)."""


@dataclass(frozen=True)
class RenderOptions:
    """How a renderer lays its record out; a format that has no use for an option ignores it."""

    details: bool = True
    """The table's secondary sections (``--details``); the other formats always hold all."""
    width: int | None = None
    """The table's columns (the terminal's); None: the format's fixed width."""


Renderer = Callable[[Any, RenderOptions], str]

RENDERERS: dict[Printout, dict[OutputFormat, str]] = {
    Printout.SCAN: {
        OutputFormat.TABLE: "base:scan_table",
        OutputFormat.JSON: "base:scan_json",
        OutputFormat.MARKDOWN: "base:scan_markdown",
        OutputFormat.JUNIT: "base:scan_junit",
        OutputFormat.GITHUB: "base:scan_github",
        OutputFormat.HTML: "base:scan_html",
    },
    Printout.PRICE: {
        OutputFormat.TABLE: "base:scan_table",
        OutputFormat.JSON: "base:scan_json",
        OutputFormat.MARKDOWN: "base:scan_markdown",
        OutputFormat.JUNIT: "base:scan_junit",
        OutputFormat.GITHUB: "base:scan_github",
        OutputFormat.HTML: "base:scan_html",
    },
    Printout.PLAN: {
        OutputFormat.TABLE: "plan_table:plan_table",
        OutputFormat.HTML: "plan_table:plan_html",
    },
    Printout.RUN: {
        OutputFormat.TABLE: "run_formats:run_table",
        OutputFormat.JSON: "run_formats:run_json",
        OutputFormat.MARKDOWN: "run_formats:run_markdown",
        OutputFormat.HTML: "run_formats:run_html",
    },
    Printout.GATE: {
        OutputFormat.TABLE: "gate_formats:gate_table",
        OutputFormat.JSON: "gate_formats:gate_json",
        OutputFormat.MARKDOWN: "gate_formats:gate_markdown",
        OutputFormat.JUNIT: "gate_formats:gate_junit",
        OutputFormat.GITHUB: "gate_formats:gate_github",
        OutputFormat.HTML: "gate_formats:gate_html",
    },
    Printout.TIMELINE: {
        OutputFormat.TABLE: "timeline:timeline_table",
        OutputFormat.JSON: "timeline:timeline_json",
    },
    Printout.INSPECT: {
        OutputFormat.TABLE: "inspect:inspect_table",
        OutputFormat.JSON: "inspect:inspect_json",
    },
    Printout.CAUSES: {
        OutputFormat.TABLE: "causes_table:causes_table",
        OutputFormat.JSON: "causes_table:causes_json",
    },
    Printout.REPORT: {
        OutputFormat.HTML: "html:results_html",
    },
}
"""Printout -> ``--format`` value -> renderer (``"module:function"`` in ``gbdoctor.report``);
the first format of each is listed first in its help."""


def formats_of(printout: Printout) -> tuple[OutputFormat, ...]:
    """The ``--format`` values of ``printout``, in the order its help lists them."""
    return tuple(RENDERERS[printout])


def format_help(printout: Printout) -> str:
    """The ``--format`` option's help: ``table|json|...``."""
    return "|".join(formats_of(printout))


def check_format(printout: Printout, fmt: str, *, named: str = "format") -> OutputFormat:
    """``fmt`` as a format of ``printout``; :class:`SpecError` (exit 2) naming the valid ones
    otherwise. ``named``: how the message names the value (``--format`` on the command line)."""
    if fmt not in RENDERERS[printout]:
        valid = ", ".join(formats_of(printout))
        raise SpecError(f"unknown {named} {str(fmt)!r}", hint=f"valid formats: {valid}")
    return OutputFormat(fmt)


def renderer_for(printout: Printout, fmt: str) -> Renderer:
    """The renderer of ``printout`` in ``fmt``, imported now (see :func:`check_format`)."""
    module, _, name = RENDERERS[printout][check_format(printout, fmt)].partition(":")
    renderer: Renderer = getattr(importlib.import_module(f"gbdoctor.report.{module}"), name)
    return renderer


def render(printout: Printout, fmt: str, record: Any, options: RenderOptions | None = None) -> str:
    """``record`` (what ``printout`` names) laid out in format ``fmt``."""
    return renderer_for(printout, fmt)(record, options or RenderOptions())
