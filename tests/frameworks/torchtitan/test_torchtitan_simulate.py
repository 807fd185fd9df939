"""``--simulate`` on a torchtitan >= 0.3 run: its own config, model registry and
``parallelize_fn`` on the meta device, rank 0 of the config's world on a fake process group, the
warm-up and captures on fake tensors, with the installed torchtitan 0.3.0 as the oracle: the
simulated scan of a debug config equals the real scan of it, and a full-size config's simulation
has the real debug scan's block kinds, regions, graphs and break causes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.frameworks.registry import spec_for_run
from gbdoctor.scan import scan, simulate_scan

pytestmark = pytest.mark.extra("torchtitan")

DSV3_DEBUG = "deepseek_v3:deepseek_v3_debugmodel"
COMPILE = ("--compile.enable",)
# deepseek_v3_16b as shipped compiles the loss only, on EP 8 (world 8): its blocks are compiled
# too, and more than one rank needs partial_dtensor on torch 2.13 (docs/torchtitan.md).
DSV3_16B = (
    "--compile.enable",
    "--compile.components",
    "model,loss",
    "--parallelism.spmd_backend",
    "partial_dtensor",
)
runner = CliRunner()


@pytest.fixture(scope="module")
def debug_real():
    """The real one-rank scan of deepseek_v3's debug config (dense+sac and moe+sac blocks)."""
    spec = spec_for_run("--torchtitan", DSV3_DEBUG, COMPILE)
    return spec, scan(spec, recompiles=False)  # a simulation never probes recompiles


@pytest.mark.slow  # the real debug scan plus its simulation (~35 s at load 4 on 2 cores)
def test_simulated_debug_scan_equals_the_real_one(debug_real):
    spec, real = debug_real
    simulated = simulate_scan(spec)
    assert simulated.setup.simulated and not real.setup.simulated
    assert replace(simulated.setup, simulated=False) == real.setup
    # Every block record, field for field: kinds, dedupe, regions, graph and op counts,
    # CUDA-graph findings, breaks, events, errors.
    assert simulated.blocks == real.blocks
    assert {b.kind for b in real.blocks} == {"dense+sac", "moe+sac"}
    assert [n for n in simulated.notes if n in real.notes] == list(real.notes)
    assert any(n.startswith("simulated: rank 0 of 1") for n in simulated.notes)


@pytest.mark.slow  # a 16B-parameter model on 8 simulated ranks (12 s at load 2, 28 s at load 6)
def test_full_size_simulation_has_the_debug_scans_kinds_and_breaks(debug_real):
    """deepseek_v3 16B (27 layers, 64 experts, EP 8 over 8 ranks) simulated, against the real
    debug scan of the same family: per block kind the same regions, graphs and break causes."""
    _, real = debug_real
    spec = spec_for_run("--torchtitan", "deepseek_v3:deepseek_v3_16b", DSV3_16B, simulate=True)
    full = scan(spec)
    assert full.setup.simulated
    p = full.setup
    assert (p.world_size, p.dp_shard, p.ep_degree) == (8, 8, 8)
    assert len(full.blocks) == 27 and all(b.error is None for b in full.blocks)

    def per_kind(report):
        kinds = {}
        for b in report.blocks:
            if b.same_as is None:
                kinds.setdefault(
                    b.kind,
                    (
                        tuple(r.removeprefix(b.fqn) for r in b.regions),
                        tuple(r.removeprefix(b.fqn) for r in b.fullgraph_regions),
                        b.graph_count,
                        sorted((x.cause, x.gb_type) for x in b.breaks),
                        sorted(e.kind for e in b.events),
                    ),
                )
        return kinds

    assert per_kind(full) == per_kind(real)
    assert set(per_kind(full)) == {"dense+sac", "moe+sac"}
    # EP 8's token dispatch read its split sizes on the host from the routing stand-in.
    assert any(n.startswith("stand-in: uniform routing") for n in full.notes)


@pytest.mark.parametrize(
    "args, code, words",
    [
        # varlen attention: masks from the positions' values, CUDA-only kernels.
        (("gpt_oss:gpt_oss_20b", "--simulate"), 2, "varlen attention cannot be simulated"),
        # the config fixes every degree: --world-size has nothing to take.
        (
            (DSV3_DEBUG, "--world-size", "2", "--parallelism.data_parallel_shard_degree", "1"),
            2,
            "fixes every parallel degree",
        ),
    ],
)
def test_what_cannot_simulate_is_one_line(args, code, words):
    result = runner.invoke(app, ["scan", "--torchtitan", *args])
    assert result.exit_code == code and words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_gpt_oss_blocks_are_moe_by_structure():
    """gpt-oss's expert store holds stacked weights (E, out, in) and per-expert biases (E, out)
    beside them; its blocks are MoE blocks (they were labelled dense while 2-D biases kept the
    store from counting as stacked)."""
    from gbdoctor.frameworks.torchtitan.config import meta_model
    from gbdoctor.models.structure import find_blocks, find_moe_layers, hidden_size

    spec = spec_for_run("--torchtitan", "gpt_oss:gpt_oss_debugmodel_flex", COMPILE)
    model = meta_model(spec)
    hidden = hidden_size(model)
    layers = [find_moe_layers(block, hidden) for _, _, block in find_blocks(model).items()]
    assert len(layers) == 4 and all(len(found) == 1 for found in layers)
    moe = layers[0][0]
    assert (moe.num_experts, moe.stacked) == (8, True)
    store = model.get_submodule(f"layers.0.{moe.experts}")
    shapes = sorted(p.dim() for p in store.parameters())
    assert shapes == [2, 2, 3, 3]  # two stacked weights, two per-expert biases
    router = model.get_submodule(f"layers.0.{moe.router}")
    assert tuple(router.weight.shape) == (8, hidden)
    # The scan's block kinds follow: every gpt-oss block is an MoE block.
    report = simulate_scan(spec)
    assert [b.kind for b in report.blocks] == ["moe"] * 4
    assert all(b.error is None for b in report.blocks)


def test_world_size_is_the_launch_of_a_dp_shard_minus_one_config():
    """llama3_8b leaves data_parallel_shard_degree at -1: --world-size 8 is FSDP 8 (resolved by
    torchtitan's own ParallelDims), and more than one rank needs partial_dtensor; llama3_70b's
    TP 8 with FSDP 1 needs it too (torch 2.13 refuses its plain norm weights)."""
    from gbdoctor.errors import SpecError

    partial = ("--parallelism.spmd_backend", "partial_dtensor")
    spec = spec_for_run("--torchtitan", "llama3:llama3_8b", partial, world_size=8, simulate=True)
    p = spec.parallelism
    assert (p.world_size, p.dp_shard, p.tensor_parallel_degree) == (8, 8, 1)
    assert spec.gbdoctor.simulate
    for name, world in (("llama3:llama3_8b", 8), ("llama3:llama3_70b", None)):
        with pytest.raises(SpecError, match="more than one rank"):
            spec_for_run("--torchtitan", name, (), world_size=world)
    with pytest.raises(SpecError, match="rejects --world-size 4"):
        spec_for_run("--torchtitan", "llama3:llama3_70b", partial, world_size=4)
