"""scan: real FSDP2 + AC + Dynamo capture on CPU, classified per block kind."""

from __future__ import annotations

import importlib.util

import pytest
from repo_paths import FIXTURES
from torch_versions import expected_gb_types

from gbdoctor.records import SCHEMA_VERSION
from gbdoctor.report import render
from gbdoctor.scan import scan
from gbdoctor.spec import load_spec
from gbdoctor.summary import summarize


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, FIXTURES / "models" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PLANTED = _load("planted")


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)


def test_llama3_debug_is_clean_and_deduplicated():
    report = scan(load_spec("fixtures/llama3_debug.toml"), strategy="block")
    assert summarize(report).breaks == 0
    assert all(b.graph_count == 1 and not b.events and b.error is None for b in report.blocks)
    # selective AC every 2nd layer: two structural kinds, each captured once.
    kinds = {b.kind for b in report.blocks}
    assert kinds == {"dense", "dense+ac"}
    assert [b.same_as for b in report.blocks] == [
        None,
        None,
        "layers.0",
        "layers.1",
        "layers.0",
        "layers.1",
    ]


def test_scan_json_is_byte_identical_across_runs():
    spec = load_spec("fixtures/custom_tiny.toml")
    # With the recompile probe: its records (guards, locations) are byte-stable too.
    first = render(scan(spec, strategy="block", recompiles=True), "json")
    second = render(scan(spec, strategy="block", recompiles=True), "json")
    assert first == second
    assert f'"schema_version": {SCHEMA_VERSION}' in first and '"probed_recompiles": true' in first
    assert '"recompiles": [\n' in first  # the probe recorded something (a new length)
    assert str(FIXTURES.parent) not in first  # machine-independent paths


def test_hugging_face_style_block_arguments_are_replayed():
    # tiny_custom's blocks take (hidden_states, attention_mask=..., position_embeddings=(cos, sin))
    # and return a tuple: capturing them needs the real kwargs from the eager pass.
    report = scan(load_spec("fixtures/custom_tiny.toml"), strategy="block")
    assert all(b.error is None and b.graph_count == 1 and not b.breaks for b in report.blocks)


@pytest.mark.parametrize(
    "flavor", sorted(f for f in PLANTED.EXPECTED_CAUSE if PLANTED.EXPECTED_CAUSE[f])
)
def test_planted_break_gets_its_cause(flavor, custom_spec):
    report = scan(load_spec(custom_spec("planted.py", flavor)))
    rep = report.blocks[0]
    causes = {b.cause for b in rep.breaks}
    assert PLANTED.EXPECTED_CAUSE[flavor] in causes, (
        flavor,
        [(b.cause, b.gb_type) for b in rep.breaks],
    )
    assert expected_gb_types(PLANTED.EXPECTED_GB_TYPE[flavor]) & {b.gb_type for b in rep.breaks}
    located = [b for b in rep.breaks if b.cause == PLANTED.EXPECTED_CAUSE[flavor]]
    assert all(b.location is not None and b.location.file.endswith(".py") for b in located)
    assert report.blocks[1].same_as == "layers.0"


def test_break_inside_ac_region_is_never_zero_breaks(custom_spec):
    report = scan(load_spec(custom_spec("planted.py", "print", ac="full")))
    rep = report.blocks[0]
    assert rep.kind == "dense+ac"
    assert [b.cause for b in rep.breaks] == ["python-side-effect"]
    assert rep.breaks[0].in_checkpoint
    assert [(e.kind, e.module) for e in rep.events] == [("region_eager", "layers.0")]


def test_block_that_cannot_trace_is_an_error_record(custom_spec):
    # FlexAttention has no backward on CPU: the block is data with cause error, the scan goes on.
    report = scan(
        load_spec("fixtures/llama3_debug.toml", ["model.flavor=debugmodel_flex_attn"]),
        strategy="block",
    )
    assert all(b.error for b in report.blocks)
    assert (
        "FlexAttention" in report.blocks[0].error or "NotImplementedError" in report.blocks[0].error
    )


def test_pytorch_bug_while_tracing_names_the_inner_error_and_the_user_line(custom_spec):
    # Dynamo re-raises the symbolic-shape failure wrapped; the record keeps the inner exception,
    # the model line it came from, and says it was raised inside PyTorch.
    bug = _load("torch_bug")
    spec = custom_spec("torch_bug.py", "x")
    report = scan(load_spec(spec, ["training.mixed_precision_param=float32"]), strategy="block")
    for block in report.blocks:
        assert block.error is not None and "\n" not in block.error
        assert block.error.startswith("AssertionError: ToFloat")
        assert f"torch_bug.py:{bug.BUG_LINE}" in block.error
        assert "raised inside PyTorch" in block.error


def test_backend_failure_is_reported_by_its_inner_exception():
    import torch

    from gbdoctor.capture import describe_error

    def broken_backend(gm, example_inputs):
        raise KeyError("u0")

    fn = torch.compile(lambda x: x * 2, backend=broken_backend)
    with pytest.raises(Exception) as info:
        fn(torch.ones(2))
    line = describe_error(info.value)
    assert line.startswith("KeyError: 'u0'"), line
    assert f"wrapped in {type(info.value).__name__}" in line
    assert "raised by the model's code" in line  # the backend here is user code, not torch


@pytest.mark.slow
def test_llama4_ep2_titan_v020_reproduces_fsdp_and_ep_breaks():
    # torchtitan v0.2.0 compiled MoE blocks whole with fullgraph=False and no scalar capture:
    # the FSDP hooks of fully_shard(moe.experts) and EP's .tolist() sit inside the region.
    spec = load_spec("fixtures/llama4_debug_ep2.toml", ["activation_checkpoint.mode=none"])
    report = scan(spec, strategy="titan-v0.2.0")
    dense = [b for b in report.blocks if b.kind == "dense"]
    moe = [b for b in report.blocks if b.kind == "moe"]
    assert len(dense) == 3 and len(moe) == 3
    assert all(not b.breaks and not b.events for b in dense)
    for block in moe:
        causes = {b.cause for b in block.breaks}
        assert causes == {"fsdp-hook", "ep-dispatch"}, block.breaks
        fsdp = [b for b in block.breaks if b.cause == "fsdp-hook"]
        assert fsdp[0].location.file == "gbdoctor/models/moe.py"
        assert fsdp[0].module == f"{block.fqn}.moe"
        assert all(
            b.module == f"{block.fqn}.moe.experts" for b in block.breaks if b.cause == "ep-dispatch"
        )
    assert not any(e.kind == "rank_divergence" for b in report.blocks for e in b.events)


@pytest.mark.slow
def test_op_sac_around_a_breaking_moe_block_falls_back_to_eager():
    report = scan(load_spec("fixtures/llama4_debug_ep2.toml"), strategy="titan-v0.2.0")
    for block in report.blocks:
        if block.kind == "moe+sac":
            assert ("region_eager", block.fqn) in {(e.kind, e.module) for e in block.events}
            assert all(b.in_checkpoint for b in block.breaks) and block.breaks
        else:
            assert block.kind == "dense+sac" and not block.breaks and not block.events


def test_library_paths_are_portable_even_with_the_venv_inside_the_repository(tmp_path):
    """CI creates ``.venv`` inside the checkout: an installed library's file is still reported
    from ``site-packages/`` on, never as a path into the repository's virtual environment."""
    from gbdoctor.capture.locate import portable_path

    lib = tmp_path / ".venv/lib/python3.11/site-packages/deepspeed/runtime/zero/hook.py"
    assert portable_path(str(lib), str(tmp_path)) == "deepspeed/runtime/zero/hook.py"
    own = tmp_path / "models" / "m.py"
    assert portable_path(str(own), str(tmp_path)) == "models/m.py"
