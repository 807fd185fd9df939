"""The installed torch's graph-break registry (``torch/_dynamo/graph_break_registry.json``):
gb_type text -> stable id (``GB0059``), read as a JSON file without importing torch."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- registry


@dataclass(frozen=True, kw_only=True, slots=True)
class RegistryEntry:
    """One gb_type of the installed torch's graph-break registry."""

    gb_id: str
    gb_type: str
    explanation: str
    """Dynamo's explanation template for this gb_type (may hold ``{placeholders}``)."""
    hints: tuple[str, ...]


def registry_path() -> Path | None:
    """``torch/_dynamo/graph_break_registry.json`` of the installed torch (no torch import)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("built-in", "namespace"):
        roots = [Path(spec.origin).parent]
    else:
        roots = [Path(p) for p in (spec.submodule_search_locations or ())]
    for root in roots:
        path = root / "_dynamo" / "graph_break_registry.json"
        if path.is_file():
            return path
    return None


def load_registry(path: Path | str) -> dict[str, RegistryEntry]:
    """Parse a registry file: every variant's ``Gb_type`` -> its id, explanation and hints.

    The file maps ``GBxxxx`` to a list of variants, newest first. Newest variants win over
    older ones when two ids share a name (torch calls that case undefined); among newest
    variants the lower id wins. Template names such as ``_gb_type`` are skipped.
    Raises ``OSError``/``ValueError`` on an unreadable file.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of GB ids")
    by_age: list[tuple[int, str, dict[str, Any]]] = []
    for gb_id, variants in data.items():
        if not isinstance(variants, list):
            continue
        for age, variant in enumerate(variants):
            if isinstance(variant, dict):
                by_age.append((age, str(gb_id), variant))
    by_age.sort(key=lambda item: (item[0], item[1]))
    out: dict[str, RegistryEntry] = {}
    for _, gb_id, variant in by_age:
        name = variant.get("Gb_type")
        if not isinstance(name, str) or not name.strip() or name.startswith("_"):
            continue
        name = name.strip()
        if name in out:
            continue
        hints = variant.get("Hints") or ()
        if isinstance(hints, str):
            hints = (hints,)
        out[name] = RegistryEntry(
            gb_id=gb_id,
            gb_type=name,
            explanation=str(variant.get("Explanation") or ""),
            hints=tuple(str(h) for h in hints),
        )
    return out


@functools.cache
def registry() -> dict[str, RegistryEntry]:
    """The installed torch's registry (cached); empty when the file is absent or unreadable."""
    path = registry_path()
    if path is None:
        return {}
    try:
        return load_registry(path)
    except (OSError, ValueError):
        return {}


_GB_URL = re.compile(r"/gb/gb(\d{4})\.html", re.IGNORECASE)


def gb_id_from_text(text: str) -> str | None:
    """The id in the graph-break site URL that ends Dynamo's message (``gb0059.html``)."""
    m = _GB_URL.search(text or "")
    return f"GB{m.group(1)}" if m else None


def gb_id_for(gb_type: str, message: str = "") -> str | None:
    """Registry id for ``gb_type`` (``GB0059``); falls back to the URL in ``message``.

    None when the registry file is absent and the message has no URL, or the type is unknown.
    """
    entry = registry().get((gb_type or "").strip())
    if entry is not None:
        return entry.gb_id
    return gb_id_from_text(message) if message else None


@functools.cache
def _torch_dir() -> str | None:
    path = registry_path()
    return _posix(str(path.parent.parent)) + "/" if path else None


def _posix(path: str) -> str:
    return (path or "").replace("\\", "/")


_INSTALLED_TORCH = re.compile(r"(^|/)(site|dist)-packages/torch/")


def is_torch_file(path: str) -> bool:
    """``path`` is PyTorch's own code: under the installed torch package (absolute or relative to
    the working directory), or a report path from ``site-packages/torch/`` on."""
    root = _torch_dir()
    posix = _posix(path)
    if root and (posix.startswith(root) or _posix(os.path.abspath(path)).startswith(root)):
        return True
    return bool(_INSTALLED_TORCH.search(posix))
