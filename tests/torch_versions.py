"""What the tests expect where supported torch releases really differ: the one table.

Tests state their expectations in torch 2.13's words (the release CI runs) and read them through
here, so that the same test holds on every release gbdoctor supports (2.11-2.15,
``gbdoctor/torch_compat.py``). A gb_type torch renamed comes from ``gbdoctor/causes/renames.py``
(the table the gate uses too); a difference that is a torch bug, not a rename, is listed in
:data:`TORCH_BUGS` with its upstream link and the releases that have it.
"""

from __future__ import annotations

from collections.abc import Iterable

from gbdoctor.causes import gb_type_in
from gbdoctor.torch_compat import torch_release, torch_version


def expected_gb_types(names: Iterable[str]) -> set[str]:
    """The gb_types the running torch raises for the cases torch 2.13 calls ``names``."""
    return {gb_type_in(name, torch_version()) for name in names}


TORCH_BUGS: dict[str, tuple[tuple[int, int], tuple[int, int], str]] = {}
"""Test id -> (first, last affected release, upstream link): a torch bug that makes the test's
premise false on those releases (the scan still reports it, as a block error)."""


def torch_bug(test: str) -> str | None:
    """Why ``test`` cannot hold on the running torch (its upstream link), or None."""
    entry = TORCH_BUGS.get(test)
    release = torch_release()
    if entry is None or release is None or not entry[0] <= release <= entry[1]:
        return None
    return entry[2]
