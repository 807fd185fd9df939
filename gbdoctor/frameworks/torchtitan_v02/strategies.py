"""The compile presets of the torchtitan v0.2 mirror: ``setup.compile``'s generic presets plus
the two releases it re-implements (``titan-v0.2.0``, ``titan-v0.2.2``), in the order messages
list them. Imports torch (``setup.compile``): the framework reads it when first asked."""

from __future__ import annotations

from dataclasses import replace

from gbdoctor.records import CompileMode
from gbdoctor.setup.compile import STRATEGIES as GENERIC
from gbdoctor.setup.compile import V022_FLAGS, BlockRecipe, Strategy

TITAN_V020 = Strategy(
    name="titan-v0.2.0",
    dense=BlockRecipe(),
    moe=BlockRecipe(fullgraph=False),
    summary="torchtitan v0.2.0: blocks whole, MoE blocks fullgraph=False, no scalar capture",
)
TITAN_V022 = Strategy(
    name="titan-v0.2.2",
    dense=BlockRecipe(),
    # v0.2.1-0.2.2 compile every MoE child but the experts, parameter-free ones included, and
    # the experts' grouped-mm function on its own.
    moe=BlockRecipe(mode=CompileMode.CHILDREN, skip_parameterless=False, compile_kernels=True),
    flags=V022_FLAGS,
    summary="torchtitan v0.2.1-0.2.2: MoE children compiled fullgraph (7 regions per MoE "
    "block), experts eager, their grouped-mm kernel compiled on its own",
)

STRATEGIES: dict[str, Strategy] = {
    "none": GENERIC["none"],
    # The generic preset is what torchtitan's main branch compiles (2026): say so where it is
    # this framework's.
    "block": replace(
        GENERIC["block"], summary=GENERIC["block"].summary + " (torchtitan main, 2026)"
    ),
    "block-nofullgraph": GENERIC["block-nofullgraph"],
    TITAN_V020.name: TITAN_V020,
    TITAN_V022.name: TITAN_V022,
    "children": GENERIC["children"],
}
"""Strategy name -> strategy (``[gbdoctor] strategy``, ``--strategy``, ``run``'s modes)."""
