"""Real DeepSpeed on real gloo ranks: ``deepspeed.initialize`` (ZeRO-1 and ZeRO-3, world size 2)
+ ``engine.compile()``, three training steps captured per rank. One spawned scan per stage is
shared by every assertion (DeepSpeed's import and initialize dominate the cost)."""

from __future__ import annotations

import re

import pytest
from repo_paths import FIXTURES

from gbdoctor.records import ScanReport
from gbdoctor.spec import load_spec

pytestmark = [pytest.mark.slow, pytest.mark.extra("deepspeed")]


@pytest.fixture(scope="module")
def zero3() -> ScanReport:
    from gbdoctor.scan import scan

    return scan(load_spec(FIXTURES / "deepspeed_zero3.toml"))


@pytest.fixture(scope="module")
def zero1() -> ScanReport:
    from gbdoctor.scan import scan

    return scan(load_spec(FIXTURES / "deepspeed_zero1.toml"))


def _breaks(report: ScanReport):
    return [b for block in report.blocks for b in block.breaks]


def test_zero1_engine_compile_is_one_clean_graph_per_step(zero1):
    assert (
        zero1.setup.framework == "deepspeed"
        and zero1.setup.zero_stage == 1
        and zero1.setup.world_size == 2
    )
    assert _breaks(zero1) == []
    assert all(not block.events and block.error is None for block in zero1.blocks)
    root = next(b for b in zero1.blocks if b.fqn == "model")
    # Forward+backward of the whole model: one graph, compiled once and reused in steps 1 and 2.
    assert root.graph_count == 1 and root.op_count > 0
    # Its ATen graphs (forward and backward) are read for CUDA-graph readiness on that row.
    assert root.cudagraphs is not None and root.cudagraphs.graphs >= 2
    assert not any(r for block in zero1.blocks for r in block.recompiles)


def test_zero3_breaks_are_zero_hooks_at_the_hooks_with_the_module_that_broke(zero3):
    breaks = _breaks(zero3)
    assert breaks, "ZeRO-3's hooks inside engine.compile() must break the graph"
    assert {b.component for b in breaks} == {"zero"} and {b.cause for b in breaks} == {"zero-hook"}
    # The hook's own file:line (the gather hook DeepSpeed disables, the release and pre-backward
    # hooks), never torch's module.py or DeepSpeed's nvtx decorator.
    assert all(b.location.file.startswith("deepspeed/runtime/zero/") for b in breaks)
    assert {"GB0098", "GB0008", "GB0116"} <= {b.gb_id for b in breaks}
    gather = [b for b in breaks if b.gb_id == "GB0098"]
    assert all(b.location.function == "_pre_forward_module_hook" for b in gather)
    # Attributed to the real module instance whose frame broke: inside a block, and by instance.
    layer0 = next(b for b in zero3.blocks if b.fqn == "layers.0")
    assert layer0.breaks and all(b.module.startswith("layers.0") for b in layer0.breaks)
    assert {b.module for b in layer0.breaks} >= {"layers.0.self_attn", "layers.0.self_attn.q_proj"}


def test_zero3_recompiles_carry_guard_failures_and_the_limit_hits(zero3):
    recompiles = [r for block in zero3.blocks for r in block.recompiles]
    plain = [r for r in recompiles if not r.limit_hit]
    limits = [r for r in recompiles if r.limit_hit]
    assert plain and all(r.reason and r.reason != "unknown" for r in plain)
    # ZeRO's hooks recompile per module: guards on the module's type / ds_id / the module stack.
    assert any("sub_module.ds_id ==" in r.reason or "FWD_MODULE_STACK" in r.reason for r in plain)
    assert any("parameter_offload.py" in r.function for r in limits)
    root = next(b for b in zero3.blocks if b.fqn == "model")
    assert {e.kind for e in root.events} >= {"recompile_limit"}
    assert all(0 <= r.step < zero3.setup.steps for r in recompiles)


def test_ranks_agree_and_the_json_round_trips(zero3):
    from gbdoctor.report.json import load_scan_json, render_json

    assert not any(e.kind == "rank_divergence" for block in zero3.blocks for e in block.events)
    text = render_json(zero3)
    assert not re.search(
        r"0x[0-9a-f]{6,}|_id\(\w+, \d{6,}\)", text
    )  # no addresses or object ids: stable JSON
    assert load_scan_json(text) == zero3


def test_gate_and_diff_work_on_deepspeed_scans(zero1, zero3):
    from gbdoctor.gate import baseline_from_reports, check_gate, diff_reports

    assert check_gate([zero3], baseline_from_reports([zero3])).passed
    # Moving the same model from ZeRO-1 to ZeRO-3 is a regression the gate names.
    diff = diff_reports(zero1, zero3)
    assert not diff.passed
    assert any("zero-hook" in f.what for f in diff.findings if f.severity == "regression")
