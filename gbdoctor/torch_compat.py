"""Which torch gbdoctor supports, and the one place that asks which torch is running.

No other module compares ``torch.__version__``: what differs between the supported releases is
kept in tables keyed by the release (major, minor) this module parses, measured by
``benchmarks/compat/run.py`` and explained in docs/versions.md:

- gb_types torch renamed: ``causes/renames.py`` (the gate and the tests read it);
- Dynamo settings whose defaults move: ``gate/pins.py`` pins them in baselines;
- torch bugs a test meets on some releases: ``tests/torch_versions.py``.

Features are asked of torch itself (``hasattr``), not keyed on releases: builds differ too.
This module imports nothing from gbdoctor and imports torch only when asked about the running
one, so the records, the gate and the cause rules use it without torch.
"""

from __future__ import annotations

import re
import types
from typing import Any

SUPPORTED = ((2, 11), (2, 15))
"""Oldest and newest torch release (major, minor) gbdoctor supports: pyproject.toml's range
(``torch>=2.11,<2.16``) says the same, and tests/torch_compat/test_torch_compat.py keeps them equal."""

TESTED = ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
"""Releases ``benchmarks/compat/run.py`` measured (docs/versions.md has the table); CI runs the
whole suite on 2.13.0 (CPU)."""

_RELEASE = re.compile(r"^(\d+)\.(\d+)")


def torch_version() -> str:
    """The running torch's version string, local build tag included (``2.11.0+cu130``)."""
    import torch

    return str(torch.__version__)


def torch_release(version: str | None = None) -> tuple[int, int] | None:
    """(major, minor) of a torch version string (``2.15.0+cu132`` -> (2, 15)), of the running
    torch when ``version`` is None; None when the string is not a version (an empty one is what
    records from before versions were kept carry)."""
    m = _RELEASE.match(torch_version() if version is None else version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def release_name(version: str) -> str:
    """The version without its local build tag: ``2.15.0+cu132`` -> ``2.15.0``."""
    return (version or "").split("+", 1)[0]


def is_supported(version: str | None = None) -> bool:
    """Whether the torch release (the running one by default) lies in :data:`SUPPORTED`."""
    release = torch_release(version)
    return release is not None and SUPPORTED[0] <= release <= SUPPORTED[1]


def supported_range() -> str:
    """:data:`SUPPORTED` as a pip requirement's range: ``>=2.11,<2.16``."""
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}"


def higher_order_op(name: str) -> Any | None:
    """The higher-order op ``torch._higher_order_ops.<name>`` (``flex_attention``, ...), or None
    where this torch has none by that name (asked of torch, not keyed on its release)."""
    import torch

    return getattr(torch._higher_order_ops, name, None)


def dynamo_config() -> types.ModuleType:
    """``torch._dynamo.config``: the Dynamo settings training sets (torchtitan's
    ``apply_compile``), plans and baselines pin, and ``--dynamo`` overrides; read, set and
    ``patch``-ed by name. torch has no public name for it; every stage outside ``capture/``
    reaches it here (``tests/test_layering.py``)."""
    import torch._dynamo

    return torch._dynamo.config
