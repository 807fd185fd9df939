"""Paths every test module shares (importable because pytest puts ``tests/`` on ``sys.path``)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
