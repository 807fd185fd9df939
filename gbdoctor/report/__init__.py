"""Formatters: lay out records, compute nothing (counts come from ``summary``).

``FORMATS``/``render``/``Formatter`` (scan reports, :mod:`gbdoctor.report.base`) and
``GATE_FORMATS``/``render_gate`` (gate results, :mod:`gbdoctor.report.gate_formats`) are
re-exported lazily, so importing :mod:`gbdoctor.report.serialize` does not load rich.
"""

from __future__ import annotations

from typing import Any

from gbdoctor.records.enums import OutputFormat

_SCAN = (
    OutputFormat.TABLE,
    OutputFormat.JSON,
    OutputFormat.MARKDOWN,
    OutputFormat.JUNIT,
    OutputFormat.GITHUB,
    OutputFormat.HTML,
)
COMMAND_FORMATS: dict[str, tuple[OutputFormat, ...]] = {
    "scan": _SCAN,
    "inspect": (OutputFormat.TABLE, OutputFormat.JSON),
    "causes": (OutputFormat.TABLE, OutputFormat.JSON),
    "plan": (OutputFormat.TABLE, OutputFormat.HTML),
    "run": (OutputFormat.TABLE, OutputFormat.JSON, OutputFormat.MARKDOWN, OutputFormat.HTML),
    "gate": _SCAN,
    "diff": _SCAN,
    "report": (),
}
"""The one registry of ``--format`` values per command (the CLI's option and its check read
it without importing a formatter; a test checks it against the formatter registries)."""

_LAZY = {
    "FORMATS": "base",
    "FORMAT_NAMES": "base",
    "Formatter": "base",
    "render": "base",
    "GATE_FORMATS": "gate_formats",
    "GATE_FORMAT_NAMES": "gate_formats",
    "render_gate": "gate_formats",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gbdoctor.report' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"gbdoctor.report.{module}"), name)
