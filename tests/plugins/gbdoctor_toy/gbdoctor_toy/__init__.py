"""Toy: a training framework outside gbdoctor's repository (the example of docs/plugins.md).

It compiles every block whole, without ``fullgraph``, and is set up by gbdoctor's framework-neutral
building blocks (``BuildingBlocksFramework``: the spec's model, FSDP2, AC, the optimizer); it runs
on one rank. It has the core of the interface only: no planner, emitters or run modes, so
``gbdoctor scan`` and ``inspect`` take its specs and ``plan`` and ``run`` refuse them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gbdoctor.frameworks.common.base import BuildingBlocksFramework
from gbdoctor.frameworks.interface import (
    CaptureStyle,
    CompileStrategy,
    SpecContext,
    TomlTable,
)
from gbdoctor.records import Spec


class Toy(BuildingBlocksFramework):
    """Every block compiled whole without fullgraph, on one rank."""

    api_version = 1  # the gbdoctor.frameworks.interface.PLUGIN_API_VERSION this was written for
    name = "toy"  # the value of `[gbdoctor] framework` in a spec, and the entry point's name
    title = "Toy"
    capture_style = CaptureStyle.PER_BLOCK
    strategy_names = ("whole",)
    default_strategy = "whole"

    @property
    def strategies(self) -> Mapping[str, CompileStrategy]:
        from gbdoctor.setup.compile import BlockRecipe, Strategy  # torch: only when used

        whole = BlockRecipe(fullgraph=False)
        return {"whole": Strategy(name="whole", dense=whole, moe=whole, summary="toy: blocks")}

    def check_spec(
        self, spec: Spec, data: TomlTable, strategy_set: bool, spec_dir: str, ctx: SpecContext
    ) -> Spec:
        if spec.parallelism.world_size != 1:
            ctx.fail("the toy framework runs on one rank", "set the parallelism degrees to 1")
        if strategy_set:
            return spec
        tool = dataclasses.replace(spec.gbdoctor, strategy=self.default_strategy)
        return dataclasses.replace(spec, gbdoctor=tool)
