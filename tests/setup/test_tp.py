"""Tensor parallelism: torchtitan's plans applied first in the setup, real on gloo ranks, and
simulated scans (fake process group, fake tensors) equal to the real ones."""

from __future__ import annotations

from dataclasses import replace

import pytest
from repo_paths import FIXTURES
from torch.distributed.tensor import DTensor, Replicate, Shard

from gbdoctor.scan import scan, simulate_scan
from gbdoctor.scan.simulate import fake_process_group
from gbdoctor.spec import load_spec


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)


def _placement(param) -> tuple:
    assert isinstance(param, DTensor), type(param)
    return tuple(param.placements)


@pytest.mark.parametrize("fixture", ["llama4_debug_tp2", "deepseek_v3_debug"])
def test_plans_shard_what_torchtitan_shards(fixture):
    """Layouts after the setup (TP, then FSDP on a dp_shard x tp mesh), on rank 0 of a fake group."""
    from gbdoctor.models import build_model
    from gbdoctor.setup.apply import apply_setup
    from gbdoctor.setup.mesh import build_meshes

    spec = load_spec(
        f"fixtures/{fixture}.toml",
        [
            "parallelism.tensor_parallel_degree=2",
            "parallelism.data_parallel_shard_degree=2",
            "parallelism.expert_parallel_degree=1",
            "activation_checkpoint.mode=none",
        ],
    )
    with fake_process_group(4):
        meshes = build_meshes(spec.parallelism, "cpu")
        assert meshes.tp.size() == 2 and meshes.dp.size() == 2 and meshes.data_world == 2
        model = build_model(spec.model, device="meta")
        setup = apply_setup(model, spec, meshes, strategy="none", build_optimizer=False)
        params = dict(model.named_parameters())
        # Placements are (FSDP on dp_shard, TP on tp); FSDP always shards dim 0 (strided when TP
        # sharded it first).
        assert all(_placement(p)[0].dim == 0 for p in params.values())
        assert _placement(params["tok_embeddings.weight"])[1] == Shard(
            0
        )  # row-wise embedding: vocab
        assert _placement(params["output.weight"])[1] == Shard(0)  # column-wise
        assert _placement(params["norm.weight"])[1] == Replicate()  # sequence-parallel
        moe_block = next(b for b in model.layers.values() if getattr(b, "moe_enabled", False))
        dense = next(b for b in model.layers.values() if not getattr(b, "moe_enabled", False))
        assert dense.feed_forward.w1.weight.placements[1] == Shard(0)
        assert dense.feed_forward.w2.weight.placements[1] == Shard(1)
        assert moe_block.moe.router.gate.weight.placements[1] == Replicate()
        assert [moe_block.moe.experts.w1.placements[1], moe_block.moe.experts.w2.placements[1]] == [
            Shard(1),
            Shard(2),
        ]
        assert moe_block.moe.shared_experts.w2.weight.placements[1] == Shard(1)
        attn = dense.attention
        if hasattr(attn, "wkv_a"):  # MLA: low-rank path replicated, head projections column-wise
            assert attn.wkv_a.weight.placements[1] == Replicate() and attn.wkv_b.weight.placements[
                1
            ] == Shard(0)
        else:
            assert attn.wq.weight.placements[1] == Shard(0) and attn.wo.weight.placements[
                1
            ] == Shard(1)
        assert setup.loss_parallel
        tp_hooks = {(h.module, h.kind) for h in setup.hooks if h.installer == "tp"}
        assert ("layers.0.attention", "forward_pre") in tp_hooks and (
            "output",
            "forward",
        ) in tp_hooks
        assert any(m.endswith("moe") and k == "forward" for m, k in tp_hooks)  # Partial -> Shard(1)


@pytest.fixture(scope="module")
def real_tp2():
    """llama4 (dense and MoE blocks) with TP 2 on two spawned gloo ranks: shared by the tests."""
    import os

    os.chdir(FIXTURES.parent)
    spec = load_spec("fixtures/llama4_debug_tp2.toml")
    return spec, scan(spec)


@pytest.mark.slow
def test_tp2_scan_records(real_tp2):
    spec, report = real_tp2
    assert spec.parallelism.world_size == 2 and report.setup.tp_degree == 2
    reps = {b.kind: b for b in report.blocks if b.same_as is None}
    assert set(reps) == {"dense", "moe"}
    for block in reps.values():
        assert block.error is None and not block.breaks and block.graph_count == 1
    # Sequence parallelism inside the compiled block: its all-gathers / reduce-scatters are in
    # the graph (allowed with NCCL); the MoE's in-place token counter blocks CUDA graphs.
    for block in reps.values():
        assert any(f.kind == "collective" for f in block.cudagraphs.findings)
    # FSDP2 (dp_shard 1 still shards, as torchtitan does) frees every parameter after the step:
    # the dense kind's only blocker; TP's collectives themselves are allowed.
    assert reps["dense"].cudagraphs.summary.startswith("blocked by released-static-input (")
    counter = [f for f in reps["moe"].cudagraphs.findings if f.kind == "mutated-input"]
    assert counter and counter[0].location.file.endswith("models/moe.py")
    assert reps["moe"].cudagraphs.summary.startswith("blocked by mutated-input (1)")


@pytest.mark.slow
def test_simulated_tp_scan_equals_real(real_tp2):
    spec, real = real_tp2
    simulated = simulate_scan(spec)
    assert replace(simulated.setup, simulated=False) == real.setup
    assert simulated.blocks == real.blocks


def test_tp_breaks_are_attributed_to_the_tp_component():
    from gbdoctor.causes import classify, recompile_cause
    from gbdoctor.records import RawBreak

    assert (
        classify(
            RawBreak(
                gb_type="Attempted to call function marked as skipped", message="x", component="tp"
            )
        )
        == "tensor-parallel"
    )
    assert recompile_cause("type(L['x']) == AsyncCollectiveTensor") == "tensor-parallel"
    assert recompile_cause("L['x'].size()[0] == 8") is None


@pytest.mark.slow
def test_dp2_x_tp2_on_four_ranks():
    """FSDP over dp_shard 2 x TP 2: four spawned gloo ranks (the one world-size-4 test: slow)."""
    spec = load_spec("fixtures/llama3_debug_dp2tp2.toml")
    report = scan(spec)
    assert (report.setup.world_size, report.setup.dp_shard, report.setup.tp_degree) == (4, 2, 2)
    assert all(b.error is None and not b.breaks and b.graph_count == 1 for b in report.blocks)
    assert not any(e.kind == "rank_divergence" for b in report.blocks for e in b.events)
    # Ready but for FSDP2 freeing the parameters after the step (released-static-input).
    for b in report.blocks:
        assert b.cudagraphs.summary.startswith("blocked by released-static-input ("), b.cudagraphs
