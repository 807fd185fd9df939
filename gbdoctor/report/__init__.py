"""Formatters: lay out records, compute nothing (counts come from ``summary``).

:mod:`gbdoctor.report.formats` is the one registry of output formats (each command's printout,
its ``--format`` values and their renderers). ``render``/``Formatter`` (scan reports,
:mod:`gbdoctor.report.base`) and ``render_gate`` (gate results,
:mod:`gbdoctor.report.gate_formats`) are re-exported lazily, so importing this package (the
CLI does, at startup) does not load rich or a formatter.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "Formatter": "base",
    "render": "base",
    "render_gate": "gate_formats",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gbdoctor.report' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"gbdoctor.report.{module}"), name)
