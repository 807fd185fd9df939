"""Paths and optional extras every test module shares (importable because pytest puts ``tests/``
on ``sys.path``)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"

EXTRA_INSTALL = {
    "deepspeed": 'DS_BUILD_OPS=0 pip install -e ".[test,deepspeed]"',
    "torchtitan": 'pip install -e ".[test,torchtitan]"',
    "accelerate": 'pip install -e ".[test,accelerate]"',
}
"""The optional extras some tests need, with the command that installs each (README: Install)."""


def extra_installed(extra: str) -> bool:
    """Whether the extra's distribution is installed.

    Asked of the installed distributions, not of the import system: with ``tests/`` on
    ``sys.path`` a test folder named after a package (``tests/deepspeed/``) is found by
    ``importlib.util.find_spec`` as a namespace package of that name, and the tests ran without
    the package and failed instead of skipping."""
    try:
        metadata.distribution(extra)
    except metadata.PackageNotFoundError:
        return False
    return True
