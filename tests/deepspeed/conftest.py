"""DeepSpeed tests need the ``deepspeed`` extra (CI installs it); without it they are skipped."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def pytest_collection_modifyitems(config, items):
    if HAVE_DEEPSPEED:
        return
    skip = pytest.mark.skip(
        reason='deepspeed is not installed: pip install -e ".[deepspeed]" (CI installs it)'
    )
    for item in items:
        if "tests/deepspeed/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


# DeepSpeed JIT-builds its CPU shm comm op on first use; keep the build in the project.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
