"""What a framework contributes to records and reports without stages naming it: its plan section
(``Plan.framework_section``, laid out by report/ as is) and its ZeRO stage (``ZeroStages``, the
setup record's ``zero_stage``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from plan_factory import make_plan
from repo_paths import FIXTURES

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.registry import framework_named, zero_stage_of
from gbdoctor.records import DeepSpeedPlan, DeepSpeedSpec, KindPlan
from gbdoctor.records.io import dumps
from gbdoctor.report.html import plan_document, render_html
from gbdoctor.report.plan_table import render_plan_table
from gbdoctor.spec import load_spec

KIND = KindPlan(kind="dense", layers=("layers.0",), mode="block", fullgraph=True, verified=True)


def test_a_plan_without_a_framework_section_shows_none():
    plan = make_plan(KIND)
    assert plan.framework_section() is None
    assert "DeepSpeed" not in render_plan_table(plan)


def test_the_deepspeed_section_is_laid_out_from_its_description():
    ds = DeepSpeedPlan(
        mode="forward",
        fullgraph=True,
        zero_stage=3,
        leaf_modules=("tiny.Block", "tiny.Other"),
        remaining=("model: frame_skipped <x>",),
    )
    plan = make_plan(KIND, framework="deepspeed", deepspeed=ds)
    section = plan.framework_section()
    assert section is not None and section.key == "deepspeed" and section.title == "DeepSpeed"
    lines = render_plan_table(plan).splitlines()
    headline = "DeepSpeed (ZeRO-3): compile forward, fullgraph=True; ZeRO-3 leaf modules: "
    assert headline + "tiny.Block, tiny.Other" in lines
    assert "  remains: model: frame_skipped <x>" in lines
    page = render_html([plan_document(plan, dumps(plan), ())])
    assert 'id="d0-deepspeed"' in page  # the section's id: the document's, then the key
    for text in ("forward fullgraph", "tiny.Block, tiny.Other", "frame_skipped &lt;x&gt;"):
        assert text in page
    # No leaf modules: no leaf clause, and "-" on the page.
    bare = make_plan(KIND, framework="deepspeed", deepspeed=replace(ds, leaf_modules=()))
    assert "DeepSpeed (ZeRO-3): compile forward, fullgraph=True" in render_plan_table(bare)
    assert bare.framework_section().fields[-1] == ("leaf modules", "-")


def test_the_zero_stage_comes_from_the_framework():
    spec = load_spec(FIXTURES / "llama3_debug.toml")
    torchtitan = framework_named(spec.gbdoctor.framework)
    deepspeed = framework_named("deepspeed")
    assert zero_stage_of(torchtitan, spec) is None  # no ZeroStages capability
    staged = replace(spec, deepspeed=DeepSpeedSpec(config_json="{}", source="[x]", zero_stage=3))
    assert zero_stage_of(deepspeed, staged) == 3
    assert zero_stage_of(deepspeed, spec) is None  # a spec that sets no stage


def test_apply_setup_resolves_only_generic_presets_by_name():
    from gbdoctor.setup.apply import generic_strategy

    assert generic_strategy("block").name == "block"
    with pytest.raises(SpecError, match="'titan-v0.2.2' is not a generic compile strategy"):
        generic_strategy("titan-v0.2.2")
    # The framework's own presets are objects from its strategies.
    titan = framework_named("torchtitan").strategies
    assert tuple(titan) == framework_named("torchtitan").strategy_names
    assert titan["block"].summary.endswith("(torchtitan main, 2026)")
