"""CUDA-graph readiness: every blocker kind planted once, read from the graphs gbdoctor captures.

Where inductor has its own check (``get_first_incompatible_cudagraph_node``: host reads and
data-dependent shapes), the same AOT forward graph is handed to it as an oracle.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import torch._dynamo
from repo_paths import FIXTURES

from gbdoctor.capture import CaptureSession, run_block
from gbdoctor.capture.cudagraph_verdict import readiness
from gbdoctor.causes import BLOCKER_EXPLANATIONS
from gbdoctor.frameworks.registry import cause_taxonomy
from gbdoctor.records import BlockerEffect, BlockerKind, CudaGraphFinding

PLANTED = FIXTURES / "models" / "cudagraph_blockers.py"


def _planted():
    spec = importlib.util.spec_from_file_location("gbdoctor_fixture_cudagraph_blockers", PLANTED)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Dynamo imports it by name when it traces a wrapped module
    spec.loader.exec_module(module)
    return module


P = _planted()


def capture(module: torch.nn.Module, *args, **config) -> tuple[list[CudaGraphFinding], int]:
    torch.manual_seed(0)
    session = CaptureSession()
    compiled = session.compile_fn(module, "m", False)
    with torch._dynamo.config.patch(
        capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True, **config
    ):
        with session.capture() as raw:
            run_block(compiled, args, {})
    assert raw.error is None, raw.error
    return raw.cudagraph_findings, raw.aten_graphs


def x() -> torch.Tensor:
    return torch.randn(4, 8, requires_grad=True)


def kinds(findings, effect=None) -> set[BlockerKind]:
    return {f.kind for f in findings if effect is None or f.effect == effect}


def test_clean_module_is_ready_with_copies_of_its_activations():
    findings, graphs = capture(P.Clean(), x())
    verdict = readiness(findings, graphs)
    assert graphs == 2  # forward and backward
    assert kinds(findings) == {BlockerKind.INPUT_COPY}
    # forward: the activation input (parameters are static); backward: the incoming gradient
    assert sorted(f.graph for f in findings) == ["backward 0", "forward 0"]
    assert verdict.status == "ready" and verdict.summary == "ready with 2 static copies"


def test_mutating_a_non_static_input_blocks_and_names_the_line():
    findings, graphs = capture(P.MutatesInput(), x(), torch.zeros(8))
    blocked = [f for f in findings if f.kind == BlockerKind.MUTATED_INPUT]
    assert [f.effect for f in blocked] == [BlockerEffect.BLOCKS]
    assert blocked[0].target == "aten.copy_.default"
    assert blocked[0].location.file.endswith("cudagraph_blockers.py")
    assert "counts.add_" in _line(blocked[0])
    assert readiness(findings, graphs).summary.startswith("blocked by mutated-input (1)")


def test_mutating_a_buffer_is_allowed():
    findings, _ = capture(P.CountsInBuffer(), x())
    mutated = [f for f in findings if f.kind == BlockerKind.MUTATED_INPUT]
    assert [f.effect for f in mutated] == [BlockerEffect.ALLOWED]
    assert "self.seen.add_" in _line(mutated[0])


def test_findings_name_inputs_by_the_module_path_torch_gives_them():
    """A finding names a graph input by where Dynamo read it (``self.seen``, not Dynamo's
    mangled ``l_self_buffers_seen_``), without the attributes torch's own wrappers insert
    (checkpoint_wrapper's ``_checkpoint_wrapped_module``). Oracle: the unwrapped module's
    ``named_buffers``/``named_parameters``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    plain = P.CountsInBuffer()
    for module in (plain, checkpoint_wrapper(P.CountsInBuffer())):
        findings, _ = capture(module, x())
        mutated = [f for f in findings if f.kind == BlockerKind.MUTATED_INPUT]
        (buffer,) = (name for name, _ in plain.named_buffers())
        assert mutated[0].detail.startswith(f"writes in place into self.{buffer}, "), mutated[
            0
        ].detail
        copied = {f.detail.split(":")[0] for f in findings if f.kind == BlockerKind.INPUT_COPY}
        assert not copied & {f"self.{name}" for name, _ in plain.named_parameters()}


def test_item_is_a_host_sync_and_inductor_agrees():
    findings, graphs = capture(P.ReadsItem(), x())
    sync = [f for f in findings if f.kind == BlockerKind.HOST_SYNC]
    assert sync and all(f.effect == BlockerEffect.BLOCKS for f in sync)
    assert any(
        f.target == "aten._local_scalar_dense.default" and ".item()" in _line(f) for f in sync
    )
    assert _inductor_incompatible(P.ReadsItem(), x()) is not None


def test_host_copy_and_factory_without_device_would_be_cpu_tensors_on_cuda():
    copy_findings, _ = capture(P.HostCopy(), x())
    sync = [f for f in copy_findings if f.graph.startswith("dynamo")]
    assert [(f.kind, f.target) for f in sync] == [(BlockerKind.HOST_SYNC, "to")]
    assert '.to("cpu")' in _line(sync[0])
    factory, _ = capture(P.FactoryWithoutDevice(), x())
    cpu = [f for f in factory if f.kind == BlockerKind.CPU_TENSOR]
    assert len(cpu) == 1 and "torch.arange" in _line(cpu[0])
    # A factory that takes its device from an input is fine.
    assert not kinds(capture(P.Clean(), x())[0]) & {BlockerKind.CPU_TENSOR, BlockerKind.HOST_SYNC}


def test_random_ops_and_checkpointed_rng_state():
    findings, graphs = capture(P.Random(), x())
    rng = [f for f in findings if f.kind == BlockerKind.RNG_STATE]
    targets = {f.target for f in rng}
    # On the CPU the recomputed dropout saves the RNG state with run_and_save_rng_state; on one
    # CUDA device it would be graphsafe_run_with_rng_state, hence "allowed" with the caveat.
    assert {"run_and_save_rng_state", "run_with_rng_state"} <= targets
    assert any("rand_like" in t for t in targets)
    assert all(f.effect == BlockerEffect.ALLOWED for f in rng)
    assert readiness(findings, graphs).status == "ready"


def test_data_dependent_shape_blocks_and_inductor_agrees():
    findings, _ = capture(P.DataDependentShape(), x())
    dynamic = [
        f
        for f in findings
        if f.kind == BlockerKind.DYNAMIC_SHAPE and f.effect == BlockerEffect.BLOCKS
    ]
    assert dynamic and any("nonzero" in f.target for f in dynamic)
    node = _inductor_incompatible(P.DataDependentShape(), x())
    assert node is not None and node.name in {f.node for f in dynamic}


def test_symbolic_sizes_and_int_inputs_re_record():
    findings, graphs = capture(P.TakesSize(), x(), 3, assume_static_by_default=False)
    effects = {(f.kind, f.effect) for f in findings}
    assert (BlockerKind.SYMINT_INPUT, BlockerEffect.RERECORD) in effects
    assert (BlockerKind.DYNAMIC_SHAPE, BlockerEffect.RERECORD) in effects
    summary = readiness(findings, graphs).summary
    assert summary.startswith("ready with") and "re-recorded per distinct symint-input" in summary


def test_collectives_are_allowed_with_nccl():
    from gbdoctor.setup.dist import single_process_group

    with single_process_group("cpu"):
        findings, _ = capture(P.AllReduces(), x())
    coll = [f for f in findings if f.kind == BlockerKind.COLLECTIVE]
    assert coll and {f.target for f in coll} == {"_c10d_functional.all_reduce.default"}
    assert all(f.effect == BlockerEffect.ALLOWED and "NCCL" in f.detail for f in coll)


def test_parameters_fsdp2_frees_after_the_step_block_cudagraphs():
    """FSDP2 (real ``fully_shard`` on a one-rank gloo group) frees each unsharded parameter
    after backward and gathers it at a new address the next step: the forward's static inputs
    are reported, the activation stays a copy. Unsharded, the same module is ready (above)."""
    from torch.distributed.fsdp import fully_shard

    from gbdoctor.setup.dist import single_process_group

    with single_process_group("cpu"):
        module = P.Clean()
        fully_shard(module)
        findings, graphs = capture(module, x())
        # The oracle: what FSDP2 itself left behind, the parameters' unsharded storage freed.
        group = module._get_fsdp_state()._fsdp_param_group
        assert all(p._unsharded_param.untyped_storage().nbytes() == 0 for p in group.fsdp_params)
    released = [f for f in findings if f.kind == BlockerKind.RELEASED_STATIC_INPUT]
    assert sorted(f.detail.split(":")[0] for f in released) == sorted(
        f"self.{name}" for name, _ in P.Clean().named_parameters()
    )
    assert {f.graph for f in released} == {"forward 0"}
    assert all(f.effect == BlockerEffect.BLOCKS and "183451" in f.detail for f in released)
    assert readiness(findings, graphs).summary.startswith("blocked by released-static-input (2)")


PLANTED_KINDS: set[BlockerKind] = set()
"""Kinds the tests above saw planted (filled as they run; checked last)."""


@pytest.fixture(autouse=True)
def _record_kinds(monkeypatch):
    def recording(module, *args, **config):
        out = _capture(module, *args, **config)
        PLANTED_KINDS.update(kinds(out[0]))
        return out

    monkeypatch.setitem(globals(), "capture", recording)


_capture = capture


def test_zz_every_kind_is_planted_and_explained():
    """Runs after the planted tests (file order): together they planted every kind."""
    if len(PLANTED_KINDS) < 3:
        pytest.skip("run the whole file: this checks what the planted tests saw")
    assert PLANTED_KINDS == set(BlockerKind)
    assert set(BLOCKER_EXPLANATIONS) == set(BlockerKind) == set(cause_taxonomy().blockers)


def _line(f: CudaGraphFinding) -> str:
    import linecache

    return linecache.getline(str(PLANTED), f.location.line) if f.location else ""


def _inductor_incompatible(module: torch.nn.Module, *args):
    """Inductor's own cudagraph-compatibility check on the same AOT forward graph."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.debugging import aot_eager
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    seen = []

    def fw(gm, inputs):
        seen.append(get_first_incompatible_cudagraph_node(gm))
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    with torch._dynamo.config.patch(
        capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True
    ):
        torch.compile(module, backend=lambda gm, ins: aot_eager(gm, ins, fw_compiler=fw))(*args)
    torch._dynamo.reset()
    return next((n for n in seen if n is not None), None)


@pytest.mark.parametrize("status", ["ready", "blocked"])
def test_verdict_words(status):
    f = CudaGraphFinding(
        kind=BlockerKind.HOST_SYNC,
        effect=BlockerEffect.BLOCKS,
        region="r",
        graph="forward 0",
        node="n",
    )
    verdict = readiness([f] if status == "blocked" else [], 2)
    assert verdict.status == status
    assert verdict.summary == ("blocked by host-sync (1)" if status == "blocked" else "ready")
    assert readiness([], 0).status == "unknown"


def test_run_cudagraphs_mode_is_unavailable_on_cpu(tmp_path):
    """On CPU the mode is reported unavailable (not run, not faked) and is not a finding."""
    from plan_factory import make_plan
    from repo_paths import FIXTURES

    from gbdoctor.records import KindPlan
    from gbdoctor.records.io import dumps
    from gbdoctor.run import run_modes, run_settings
    from gbdoctor.spec import load_spec

    spec = load_spec(FIXTURES / "llama3_debug.toml", ["gbdoctor.device=cpu"])
    kind = KindPlan(
        kind="dense",
        layers=("layers.0",),
        mode="block",
        fullgraph=True,
        verified=True,
        cudagraphs="ready with 2 static copies",
        cudagraph_ready=True,
    )
    plan = make_plan(
        kind,
        spec=spec.path,
        model="llama3/debugmodel",
        torch_version=torch.__version__,
        baseline_strategy="block",
    )
    path = tmp_path / "plan.json"
    path.write_text(dumps(plan))
    report = run_modes(spec, run_settings(spec, steps=5), modes=["cudagraphs"], plan_path=str(path))
    (mode,) = [m for m in report.modes if m.mode == "cudagraphs"]
    assert mode.status == "unavailable" and mode.step_times_s == ()
    assert "need a CUDA device" in mode.error
    assert not any("cudagraphs" in f for f in report.findings)


def test_cudagraphs_mode_with_no_ready_kind_is_unavailable_not_a_second_plan():
    """On CUDA with no kind ready (every FSDP2 setup: released-static-input), the mode would
    train the plan again under another name: unavailable, with the reason."""
    from gbdoctor.run.driver import _unavailable

    assert _unavailable(["plan"], "cuda", ()) == {}
    assert _unavailable(["cudagraphs"], "cuda", ("layers.0",)) == {}
    assert "nothing to compile" in _unavailable(["cudagraphs"], "cuda", ())["cudagraphs"]
    assert "need a CUDA device" in _unavailable(["cudagraphs"], "cpu", ("layers.0",))["cudagraphs"]
