"""Simulated scans: fake process group + meta/fake tensors give the real scan's records."""

from __future__ import annotations

import math
import resource
from dataclasses import replace

import pytest
import torch
from repo_paths import FIXTURES

from gbdoctor.scan import estimate, memory_estimate, scan, simulate_scan
from gbdoctor.scan.simulate import (
    SimulatedValueError,
    UniformRouting,
    fake_process_group,
    simulation_mode,
)
from gbdoctor.spec import load_spec

MULTI_RANK_NOTE = "captured on 2 ranks"


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["llama4_debug_ep2", "llama3_debug_dp2"])
def test_simulated_scan_equals_real_two_rank_scan(fixture):
    spec = load_spec(f"fixtures/{fixture}.toml")
    assert spec.parallelism.world_size == 2 and not spec.gbdoctor.simulate
    real = scan(spec)  # two spawned gloo ranks
    simulated = simulate_scan(spec)  # rank 0 of 2 in-process, fake process group, fake tensors

    assert simulated.setup.simulated and not real.setup.simulated
    assert replace(simulated.setup, simulated=False) == real.setup
    # Every block record: kinds, dedupe, graph and op counts, errors, and each break (cause,
    # gb_type, location, module, hop, component, region, count, text) and event, field for field.
    assert simulated.blocks == real.blocks
    if fixture == "llama4_debug_ep2":  # EP ran, and its records are the interesting ones
        assert any(b.breaks for b in real.blocks)
        assert any(e.kind == "region_eager" for b in real.blocks for e in b.events)
    # Caveats of the real scan (e.g. a failing eager step) are reported by the simulation too;
    # only the multi-rank merge note is the real scan's own.
    assert [n for n in real.notes if MULTI_RANK_NOTE not in n] == [
        n for n in simulated.notes if n in real.notes
    ]
    assert any(n.startswith("simulated: rank 0 of 2") for n in simulated.notes)
    assert any(n.startswith("not simulated: numerics") for n in simulated.notes)
    assert any(n.startswith("stand-in: uniform routing") for n in simulated.notes) == (
        fixture == "llama4_debug_ep2"
    )


def test_world_too_large_for_local_ranks_is_simulated_with_a_notice(monkeypatch):
    monkeypatch.setattr(estimate, "local_world_limit", lambda: 2)
    spec = load_spec("fixtures/llama3_debug.toml", ["parallelism.data_parallel_shard_degree=4"])
    assert estimate.decide(spec).reason.startswith("world size 4 exceeds the 2 ranks")
    messages = []
    report = scan(spec, progress=lambda msg, done, total: messages.append(msg))
    assert report.setup.simulated and report.setup.world_size == 4 and report.setup.dp_shard == 4
    assert report.notes[0].startswith("notice: world size 4 exceeds the 2 ranks")
    assert any("simulating rank 0 of 4" in m for m in messages)
    assert all(b.error is None and b.graph_count == 1 and not b.breaks for b in report.blocks)


def test_simulation_is_only_chosen_when_asked_or_needed(monkeypatch):
    monkeypatch.setattr(estimate, "local_world_limit", lambda: 4)
    small = load_spec("fixtures/llama4_debug_ep2.toml")
    decision = estimate.decide(small, available=64 * memory_estimate.GiB)
    assert not decision.simulate and decision.reason is None and decision.estimate.fits
    asked = load_spec("fixtures/llama4_debug_ep2.toml", ["gbdoctor.simulate=true"])
    assert estimate.decide(asked).reason == "requested"


def test_uniform_routing_gives_ep_dispatch_its_split_sizes():
    """The real EP dispatch hook, on fake tensors: split sizes come from uniform routing."""
    from torch.distributed.device_mesh import init_device_mesh

    from gbdoctor.setup.ep import TokenDispatcher

    tokens, top_k, experts, ep = 64, 2, 16, 4
    mode, routing = simulation_mode()
    with fake_process_group(8):
        # Meshes are built outside the fake mode, as the scan builds them (their rank tables are real).
        mesh = init_device_mesh("cpu", (2, ep), mesh_dim_names=("efsdp", "ep"))["ep"]
        with mode:
            selected = torch.empty(tokens, top_k, dtype=torch.int64)
            counts = torch.histc(selected.view(-1).float(), bins=experts, min=0, max=experts)
            routed = torch.empty(tokens * top_k, 32)
            dispatcher = TokenDispatcher(mesh)
            received, local_counts = dispatcher.token_dispatch(None, (routed, counts))
            assert dispatcher.input_splits == [tokens * top_k // ep] * ep
            assert dispatcher.output_splits == [tokens * top_k // ep] * ep
            assert received.shape == (tokens * top_k, 32)
            assert local_counts.tolist() == [tokens * top_k // experts * ep] * (experts // ep)
            combined = dispatcher.token_combine(None, (), received)
            assert combined.shape == routed.shape and isinstance(
                combined, torch._subclasses.FakeTensor
            )
    assert routing.stand_in_reads > 0


def test_host_reads_without_a_stand_in():
    mode, routing = simulation_mode()
    with mode:
        loss = torch.empty(()).sum()
        assert math.isnan(float(loss))
        with pytest.raises(SimulatedValueError, match="no value for this data-dependent"):
            torch.empty(3, dtype=torch.int64).sum().item()
        # counts spread evenly, remainder to the first bins
        counts = torch.histc(torch.empty(10), bins=4, min=0, max=4)
        assert counts.tolist() == [3.0, 3.0, 2.0, 2.0]
        # a value is dropped once an op writes into it from data without one
        counts.add_(torch.empty(4))
        assert math.isnan(counts[0].item())
    assert routing.nan_reads == 2
    assert isinstance(routing, UniformRouting)


def test_topk_routing_map_counts_are_round_robin():
    """torchtitan >= 0.3 counts tokens per expert from a one-hot map of the router's ``topk``
    (``zeros_like(scores, dtype=bool).scatter_(-1, ids, True).sum(dim=(0, 1))``), not with
    ``histc``: the ids are round-robin, so the counts are even and readable on the host."""
    batch, seq, experts, top_k = 2, 12, 8, 2
    mode, routing = simulation_mode()
    with mode:
        scores = torch.empty(batch, seq, experts).sigmoid()
        _, ids = torch.topk(scores, top_k, dim=-1)
        assert ids[0, 0].tolist() == [0, 1] and ids[1, 11].tolist() == [6, 7]  # (r*K + j) % E
        routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, ids, True)
        counts = routing_map.sum(dim=(0, 1))
        assert counts.tolist() == [batch * seq * top_k // experts] * experts
        # split sizes per EP rank, as the token dispatcher reads them on the host
        assert counts.view(4, -1).sum(dim=1).to("cpu").tolist() == [12] * 4
        # floating-point fills carry no value (only counts, ids and masks do)
        assert math.isnan(torch.zeros_like(scores).sum().item())
    assert routing.stand_in_reads > 0


def test_production_size_setup_allocates_nothing_at_full_size():
    """llama4 17Bx16E at world 64 / EP 8: every parameter is fake after the real setup code."""
    from torch._subclasses.fake_tensor import FakeTensor

    from gbdoctor.capture import CaptureSession
    from gbdoctor.frameworks import framework_for
    from gbdoctor.scan import ScanJob, build_and_setup, strategy_for

    spec = load_spec("benchmarks/specs/llama4_17bx16e_ep8_w64.toml")
    framework = framework_for(spec)
    job = ScanJob(
        spec=spec,
        framework=framework,
        strategy=strategy_for(framework, spec, None),
        device="cpu",
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mode, _ = simulation_mode()
    with fake_process_group(spec.parallelism.world_size):
        setup, meshes = build_and_setup(job, CaptureSession(), mode)
        assert meshes.ep.size() == 8 and meshes.edp.size() == 8 and meshes.dp.size() == 64
        params = list(setup.model.parameters())
        assert params and all(isinstance(p._local_tensor, FakeTensor) for p in params)
        assert setup.optimizer is not None and any(
            h.installer == "load-balancing" for h in setup.hooks
        )
        w1 = setup.blocks[0].block.moe.experts.w1
        assert w1.shape == (16, 8192, 5120)  # global: 16 experts, 5120 -> 8192 hidden
        assert w1._local_tensor.shape == (1, 8192, 5120)  # 2 experts per EP rank, 1 per efsdp shard
        total = sum(p.numel() for p in params)
        assert total > 100e9  # ~109B parameters, none of them allocated
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 1024
