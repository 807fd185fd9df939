"""Fixtures of the report tests; the records themselves are built in ``scan_factory.py``."""

from __future__ import annotations

import pytest
from scan_factory import SCAN_FIXTURES


@pytest.fixture(params=sorted(SCAN_FIXTURES))
def fixture_name(request: pytest.FixtureRequest) -> str:
    """Name of each recorded scan fixture (``fixtures/scans/<name>.json``)."""
    return request.param
