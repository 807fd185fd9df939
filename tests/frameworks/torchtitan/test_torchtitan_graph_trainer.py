"""torchtitan's ``experiments/graph_trainer`` as a setup: its config registry, its own
``parallelize`` (SimpleFSDP on a real gloo group, applied unconditionally) and its whole-model
tracing, scanned per block. The installed torchtitan 0.3.0 is the oracle: its SimpleFSDP
parameters, and Dynamo's own graph-break log (``torch._dynamo.explain``) on the same block with
the inputs torchtitan's training step gave it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.report.json import load_scan_json

pytestmark = pytest.mark.extra("torchtitan")

GT_LLAMA = ("--torchtitan", "graph_trainer.llama3:graph_trainer_llama3_debugmodel")
runner = CliRunner()


def _cli(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def gt_scan(tmp_path_factory):
    out = tmp_path_factory.mktemp("gt") / "scan.json"
    code, _, err = _cli("scan", *GT_LLAMA, "--no-recompile-probe", "-f", "json", "-o", str(out))
    assert code == 0, err
    return load_scan_json(out)


def test_graph_trainer_scans_per_block_under_simple_fsdp(gt_scan):
    """graph_trainer traces the whole step with make_fx (compile.mode aot_fx_trace): no block is
    a Dynamo region of its own, so each is compiled fullgraph=True; SimpleFSDP is FSDP (its
    parametrized all-gather is traced: no FSDP2 hooks, no fsdp-hook break)."""
    report = gt_scan
    assert report.spec == "torchtitan:graph_trainer.llama3:graph_trainer_llama3_debugmodel"
    assert report.model == "llama3/graph_trainer_llama3_debugmodel"
    assert report.setup.fsdp and report.setup.world_size == 1
    # No eager AC wrapper: graph_trainer applies SAC to the traced graph (memory_policy).
    assert [b.kind for b in report.blocks] == ["dense"] * 6
    for block in report.blocks:
        assert block.regions == block.fullgraph_regions == (block.fqn,)
        assert block.graph_count == 1 and not block.breaks and block.error is None
    notes = " ".join(report.notes)
    assert "make_fx" in notes and "fullgraph=True" in notes
    assert "SimpleFSDP" in notes and "wraps no block" in notes


def _titan_block_inputs():
    """graph_trainer's model set up by its own parallelize (compile off) on a world-size-1 gloo
    group, one torchtitan training step, and block 0's call as torchtitan made it."""
    from gbdoctor.frameworks.registry import framework_for, spec_for_run

    spec = spec_for_run("--torchtitan", GT_LLAMA[1], ())
    titan = framework_for(spec)
    model, meshes = titan.build(spec, "cpu")
    setup = titan.set_up(model, spec, meshes, strategy="eager")
    calls = []
    block = setup.blocks[0].outer
    hook = block.register_forward_pre_hook(
        lambda m, args, kwargs: calls.append((args, kwargs)), with_kwargs=True
    )
    import torch

    tokens = torch.randint(0, 256, (2, 64))
    with titan.step_context(setup):
        titan.train_step(setup, tokens, tokens)
    hook.remove()
    return setup, titan, block, calls[0]


@pytest.mark.slow  # a second torchtitan setup plus an eager step (~15 s idle, 35 s at load 11)
def test_dynamo_graph_break_log_on_the_same_block_agrees(gt_scan):
    """Oracle: plain Dynamo (``torch._dynamo.explain``) on block 0 as graph_trainer's SimpleFSDP
    leaves it, with the arguments torchtitan's own step passed: the scan's graph and break
    counts, and the SimpleFSDP parameters torchtitan made (DTensors) are what the note counts."""
    import torch
    import torch._dynamo
    from torch.distributed.tensor import DTensor

    from gbdoctor.setup.dist import single_process_group

    with single_process_group("cpu"):
        setup, titan, block, (args, kwargs) = _titan_block_inputs()
        sharded = sum(isinstance(p, DTensor) for p in setup.model.parameters())
        # What torchtitan's step wrapper would copy per replay, flattened by its own code.
        from torchtitan.distributed.cudagraph import CUDAGraphInputSpec

        tokens = torch.randint(0, 256, (2, 64))
        inputs, extra, labels = setup.batch(tokens, tokens)
        flat = [inputs, labels, torch.tensor(labels.numel())]
        flat += CUDAGraphInputSpec(extra).flatten(extra)
        copied = sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))
        torch._dynamo.reset()
        with titan.step_context(setup):
            explained = torch._dynamo.explain(block)(*args, **kwargs)
        torch._dynamo.reset()
    scanned = gt_scan.blocks[0]
    assert explained.graph_break_count == len(scanned.breaks) == 0
    assert explained.graph_count == scanned.graph_count == 1
    notes = " ".join(gt_scan.notes)
    assert f"SimpleFSDP: {sharded} parameters" in notes
    assert f"{copied / 1024:.1f} KiB at the capture shape" in notes
    assert "graph_trainer's cudagraph_pass on" in notes


def test_graph_trainer_cudagraph_predicate_is_the_installed_one_less_the_cpu_rule():
    """Per compiled region, torchtitan's own ``is_cudagraphable`` on every ATen graph the scan
    captures (a session graph check). Oracle: the installed predicate itself on the same nodes.
    Everything it rejects is reported, except what it rejects only because a CPU scan puts every
    tensor on the host (the linear's matmul here); the host read and the data-dependent shapes
    are reported as blockers of its wrapper."""
    import torch
    from torch import nn

    from gbdoctor.capture import CaptureSession
    from gbdoctor.frameworks.registry import spec_for_run
    from gbdoctor.frameworks.torchtitan.cudagraph_wrappers import wrapper_graph_check

    spec_for_run("--torchtitan", GT_LLAMA[1], ())  # imports torchtitan (triton stand-in)
    from torchtitan.experiments.graph_trainer.cudagraph import is_cudagraphable

    class HostReads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            kept = int((y > 0).sum().item())  # a host read
            return y.flatten()[:kept].sum()  # a data-dependent shape

    graphs = []
    session = CaptureSession()
    session.graph_checks += [wrapper_graph_check, lambda gm, *_: graphs.append(gm) or []]
    model = session.compile_fn(HostReads(), "m", True)
    with (
        torch._dynamo.config.patch(
            capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True
        ),
        session.capture() as raw,
    ):
        model(torch.randn(4, 8)).backward()
    torch._dynamo.reset()
    ours = [f for f in raw.cudagraph_findings if "graph_trainer" in f.detail]
    blocking = {(f.node, f.kind) for f in raw.cudagraph_findings if f.effect == "blocks"}
    rejected = [
        n
        for gm in graphs
        for n in gm.graph.nodes
        if n.op == "call_function" and not is_cudagraphable(n)
    ]
    assert graphs and ours and {f.node for f in ours} <= {n.name for n in rejected}
    # A finding inductor's own readiness made already (the host read) is not repeated.
    host_reads = [n.name for n in rejected if "scalar_dense" in str(n.target)]
    assert host_reads and all((name, "host-sync") in blocking for name in host_reads)
    assert not any("scalar_dense" in f.target for f in ours)
    assert any(f.kind == "dynamic-shape" for f in ours)
    cpu_only = [n for n in rejected if n.name not in {name for name, _ in blocking}]
    assert any(str(n.target) == "aten.mm.default" for n in cpu_only)  # host op only on CPU
    assert all(
        isinstance(v := m.meta.get("val"), torch.Tensor)
        and v.device.type == "cpu"
        and all(isinstance(d, int) for d in v.shape)
        for n in cpu_only
        for m in (n, *n.all_input_nodes)
        if isinstance(m.meta.get("val"), torch.Tensor)
    )


ASYNC_EP = (
    "graph_trainer.deepseek_v3:graph_trainer_deepseek_v3_debugmodel_minimal_async_ep",
    "--parallelism.expert_parallel_degree",
    "2",
)


@pytest.mark.parametrize(
    "run, code, words",
    [
        # torchtitan's own config checks, raised while it builds the model: bad input.
        (("graph_trainer.llama3:graph_trainer_llama3_debugmodel_dist_gemm",), 2, "spmd_types"),
        (ASYNC_EP, 2, "full recompute"),
        # Its MinimalAsyncEP dispatcher allocates CUDA memory when built: not on this machine.
        ((*ASYNC_EP, "--compile.memory_policy", "full"), 3, "CUDA-only"),
    ],
)
def test_configs_that_cannot_run_here_are_one_line_refusals(run, code, words):
    exit_code, out, err = _cli("scan", "--torchtitan", *run)
    assert exit_code == code and words in err and "Traceback" not in err, err
    assert "internal error" not in err


@pytest.mark.slow  # two spawned ranks (~40 s at load 5 on 2 cores)
def test_simple_fsdp_on_two_ranks_traces_its_collectives_inside_each_block(tmp_path):
    """SimpleFSDP sharded over 2 gloo ranks: each block is still 1 graph with 0 breaks, and its
    all-gather (forward) and reduce-scatter (backward) are traced into the block's graphs, one
    per parameter of the block as torchtitan builds it (FSDP2 runs them in eager hooks)."""
    from gbdoctor.frameworks.registry import framework_for, spec_for_run

    out = tmp_path / "scan.json"
    shard = ("--parallelism.data_parallel_shard_degree", "2")
    code, _, err = _cli(
        "scan", *GT_LLAMA, *shard, "--no-recompile-probe", "-f", "json", "-o", str(out)
    )
    assert code == 0, err
    report = load_scan_json(out)
    assert report.setup.world_size == 2 and report.setup.fsdp
    spec = spec_for_run("--torchtitan", GT_LLAMA[1], shard)
    block_params = len(list(framework_for(spec).meta_model(spec).layers["0"].parameters()))
    for block in report.blocks:
        assert block.graph_count == 1 and not block.breaks
    found = [f for f in report.blocks[0].cudagraphs.findings if f.kind == "collective"]
    gathers = [f for f in found if "all_gather" in f.target and f.graph.startswith("forward")]
    scatters = [f for f in found if "reduce_scatter" in f.target and f.graph.startswith("backward")]
    assert len(gathers) == len(scatters) == block_params
    assert all(f.location and f.location.file.endswith("simple_fsdp.py") for f in found)
