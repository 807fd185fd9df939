"""A framework is a plug-in: a test-only framework registers itself and a spec naming it scans.

How to add a framework (the steps this file walks through with ``Toy``):

1. Make a package ``gbdoctor/frameworks/<name>/`` whose ``__init__`` holds a light class (no
   torch or framework import at module level: spec loading reads it), a subclass of
   ``frameworks.common.base.FrameworkBase`` (the defaults every plug-in shares) or of its
   ``BuildingBlocksFramework`` (set up by ``setup/``'s building blocks, as ``Toy`` is).
2. Give it a ``name`` (the ``[gbdoctor] framework`` value), a ``title`` for messages, and its
   ``capture_style``: per block (``scan.rank``) or whole engine steps (``scan.engine_steps``,
   which also asks for ``root_region``, ``set_up_words``, ``engine_setup_info``, ``engine_notes``).
3. Say whether a spec too large for local ranks may be ``simulate``-d (fake process group).
4. List its compile strategies (``strategy_names`` without torch, ``strategies`` lazily) and the
   ``default_strategy``.
5. Read its own spec sections (``spec_sections``) in ``check_spec`` (set the default strategy
   when the spec names none, refuse what it cannot set up with ``ctx.fail``), refuse them in
   other frameworks' specs (``check_foreign_spec``), and say whether ``[compile]`` decides what
   training compiles (``compiles_per_compile_section``).
6. ``build`` the model and its meshes, ``set_up_model`` the framework's setup (``setup/``'s
   neutral building blocks, or the framework's own), returning a ``setup.apply.Setup``.
7. ``step_context``, ``train_step``, ``timed_train_step``: its training step, as training runs.
8. ``prepare_ranks`` / ``release_rank``: what would hang ranks before they start, and what a
   rank leaves behind.
9. ``run_modes``, ``propose_plan``, ``plan_strategy``, ``plan_modes``, ``check_plan``,
   ``plan_section`` and ``emitters``: what ``run`` measures and how a plan is made and applied.
10. ``registry.register(Framework())`` (the built-ins in ``registry._builtins``), then a golden
    case in ``tests/test_golden.py`` for a bundled spec of it.

``Toy`` below does steps 1-8 and 10 for a scan (``setup/``'s building blocks, the base's
defaults, one strategy of its own); planning (step 9) is what a real framework adds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
from repo_paths import FIXTURES

from gbdoctor.errors import SpecError
from gbdoctor.frameworks import CaptureStyle, framework_names, registry
from gbdoctor.frameworks.common.base import BuildingBlocksFramework
from gbdoctor.scan import scan
from gbdoctor.spec import load_spec


class Toy(BuildingBlocksFramework):
    """A framework that compiles every block whole, without fullgraph, set up by ``setup/``."""

    name = "toy"
    title = "Toy"
    capture_style = CaptureStyle.PER_BLOCK
    strategy_names = ("whole",)
    default_strategy = "whole"

    @property
    def strategies(self) -> Mapping[str, Any]:
        from gbdoctor.setup.compile import BlockRecipe, Strategy

        whole = BlockRecipe(fullgraph=False)
        return {"whole": Strategy(name="whole", dense=whole, moe=whole, summary="toy: blocks")}

    def check_spec(self, spec, data, strategy_set, spec_dir, ctx):
        if spec.parallelism.world_size != 1:
            ctx.fail("the toy framework runs on one rank", "set the parallelism degrees to 1")
        if strategy_set:
            return spec
        tool = dataclasses.replace(spec.gbdoctor, strategy=self.default_strategy)
        return dataclasses.replace(spec, gbdoctor=tool)


@pytest.fixture
def toy(monkeypatch):
    """``Toy`` registered for one test (the registry is restored afterwards)."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    return registry.register(Toy())


def _toy_spec(tmp_path, extra: str = ""):
    path = tmp_path / "toy.toml"
    path.write_text(
        f'[model]\nname = "custom"\nflavor = "tiny"\n'
        f'factory = "{FIXTURES / "models" / "tiny_custom.py"}:build"\n'
        f"[training]\nlocal_batch_size = 2\nseq_len = 16\n"
        f'[gbdoctor]\nframework = "toy"\n{extra}'
    )
    return path


def test_a_registered_framework_is_known_to_specs_and_scans(toy, tmp_path):
    assert framework_names()[-1] == "toy"
    spec = load_spec(_toy_spec(tmp_path))
    assert spec.gbdoctor.strategy == "whole"  # the framework's default, set by its check_spec
    report = scan(spec, recompiles=False)
    assert report.setup.framework == "toy" and report.setup.strategy == "whole"
    assert report.blocks and all(b.error is None for b in report.blocks)
    # Compiled whole without fullgraph: regions, but none claimed fullgraph.
    assert all(b.regions and not b.fullgraph_regions for b in report.blocks)


def test_its_spec_checks_and_strategy_names_apply(toy, tmp_path):
    with pytest.raises(SpecError, match="is not a known strategy \\(framework 'toy'\\)"):
        load_spec(_toy_spec(tmp_path, 'strategy = "block"\n'))
    with pytest.raises(SpecError, match="the toy framework runs on one rank"):
        load_spec(_toy_spec(tmp_path), ["parallelism.data_parallel_shard_degree=2"])


def test_an_unregistered_framework_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(SpecError, match="'toy' is not one of torchtitan, deepspeed"):
        load_spec(_toy_spec(tmp_path))
