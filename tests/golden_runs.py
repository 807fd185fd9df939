"""What the golden tests share (``test_golden.py``, ``test_recompile_goldens.py``): when they
regenerate or run the full set, the versions the goldens were recorded with, the environment a
golden command runs in, and the first lines where a produced JSON differs."""

from __future__ import annotations

import importlib.metadata
import json
import os

from repo_paths import FIXTURES, REPO

VERSIONS = FIXTURES / "golden" / "versions.json"
REGENERATE = os.environ.get("GBDOCTOR_REGENERATE_GOLDEN", "").strip() not in ("", "0")
ALL = REGENERATE or os.environ.get("GBDOCTOR_GOLDEN", "").strip() == "all"


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def recorded_versions() -> dict[str, str]:
    return json.loads(VERSIONS.read_text()) if VERSIONS.exists() else {}


def golden_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["GBDOCTOR_AVAILABLE_MEMORY_GIB"] = "16"
    env["GBDOCTOR_RECOMPILE_PROBE"] = "0"
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    # The gbdoctor under test is this checkout's, whatever else is on the path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def first_difference(expected: str, produced: str) -> str:
    import difflib

    lines = difflib.unified_diff(
        expected.splitlines(), produced.splitlines(), "golden", "produced", lineterm="", n=2
    )
    return "\n".join(list(lines)[:60])
