"""What the tests expect where supported torch releases really differ: the one table.

Tests state their expectations in torch 2.13's words (the release CI runs) and read them through
here, so that the same test holds on every release gbdoctor supports (2.11-2.15,
``gbdoctor/torch_compat.py``). A gb_type torch renamed comes from ``gbdoctor/causes/renames.py``
(the table the gate uses too); a difference that is a torch bug, not a rename, is listed in
:data:`TORCH_BUGS` with its upstream link and the releases that have it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gbdoctor.causes import gb_type_in
from gbdoctor.torch_compat import torch_release, torch_version


def expected_gb_types(names: Iterable[str]) -> set[str]:
    """The gb_types the running torch raises for the cases torch 2.13 calls ``names`` (a name
    2.13 introduced is its older one on 2.11/2.12; a 2.13 name a later release renamed for some
    cases only stays: the planted cases are not among them, measured on 2.14.1 and 2.15.0)."""
    return {gb_type_in(name, torch_version()) for name in names}


@dataclass(frozen=True)
class TorchBug:
    """A torch bug that makes a test's premise false on some releases: the test then expects
    the bug's error (so it fails once torch fixes it there, and the entry must go)."""

    first: tuple[int, int]
    last: tuple[int, int]
    error: str
    """Regex of the error torch raises."""
    why: str
    """What happens, and the upstream issue."""


TORCH_BUGS: dict[str, TorchBug] = {
    "planted inplace_in_sac backward": TorchBug(
        first=(2, 11),
        last=(2, 12),
        error=r"aten\.mm\.default encountered during backward, but not found in storage",
        why="the attribute mutated inside the SAC region breaks the graph inside the checkpoint "
        "(GB0067 on these releases); the recompute in backward then misses the matmul the "
        "forward saved, and SAC raises. A graph break inside a checkpointed region is "
        "https://github.com/pytorch/pytorch/issues/139989; 2.13+ does not raise (not bisected). "
        "A scan reports it as the block's error, with the break still recorded.",
    ),
}
"""Test situation -> the bug, keyed by what the test does (measured by benchmarks/compat/run.py)."""


def torch_bug(situation: str) -> TorchBug | None:
    """The bug that applies to ``situation`` on the running torch, or None."""
    bug = TORCH_BUGS.get(situation)
    release = torch_release()
    if bug is None or release is None or not bug.first <= release <= bug.last:
        return None
    return bug
