"""TP + activation checkpointing on CPU: torch 2.13's non-graph-safe RNG replay puts the RNG state
after a saved ``DeviceMesh`` (setup/ac.py's docstring), and gbdoctor's stand-in (save the RNG
ops instead) makes the blocks trace. The plain-torch tests are the oracle: they fail the day
torch fixes the ordering (then the stand-in can go) or the stand-in stops avoiding it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from repo_paths import FIXTURES
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.tensor import DTensor, Replicate

from gbdoctor.scan.simulate import fake_process_group
from gbdoctor.setup import ac as ac_mod
from gbdoctor.spec import load_spec

MISORDERED = "expected all tensors_saved_with_vc_check to be Tensors"


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)


class _DTensorWeight(nn.Module):
    """The smallest trigger: a DTensor parameter (its gradient needs the mesh in backward) and a
    dropout (an RNG op that full AC recomputes)."""

    def __init__(self, mesh) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(DTensor.from_local(torch.randn(8, 8), mesh, (Replicate(),)))

    def forward(self, x):
        h = DTensor.from_local(x, self.w.device_mesh, (Replicate(),), run_check=False) @ self.w
        return F.dropout(h.to_local(), 0.1)


def _train(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    torch.manual_seed(2)  # the dropout mask
    out = module(x)
    out.sum().backward()
    return out.detach(), x.grad


def test_plain_torch_fails_on_cpu_and_the_stand_in_trains_like_eager():
    from torch.distributed.device_mesh import init_device_mesh

    torch.compiler.reset()
    with fake_process_group(1):
        mesh = init_device_mesh("cpu", (1,))
        plain = torch.compile(checkpoint_wrapper(_DTensorWeight(mesh)), backend="aot_eager")
        with pytest.raises(AssertionError, match=MISORDERED + ".*DeviceMesh"):
            _train(plain)

        block = _DTensorWeight(mesh)
        assert ac_mod.needs_rng_stand_in(block)
        eager = _train(checkpoint_wrapper(block))
        block.w.grad = None
        stand_in = checkpoint_wrapper(block, context_fn=ac_mod.rng_save_context_fn())
        compiled = _train(torch.compile(stand_in, backend="aot_eager"))
        # Same output (same dropout mask) and same gradients as eager full AC.
        torch.testing.assert_close(compiled, eager)
    torch.compiler.reset()


def test_the_stand_in_is_for_dtensor_parameters_on_a_mesh_without_graph_safe_rng():
    assert not ac_mod.needs_rng_stand_in(nn.Linear(2, 2))  # no DTensor: full AC as torchtitan
    assert ac_mod.GRAPHSAFE_RNG_DEVICES == ("cuda",)


def _tp_block(mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    from gbdoctor.models import build_model
    from gbdoctor.setup.tp import block_plan

    spec = load_spec("fixtures/llama4_debug_tp2.toml", ["activation_checkpoint.mode=full"])
    torch.manual_seed(0)
    model = build_model(spec.model, device="cpu")
    block = model.layers["0"]
    parallelize_module(block, mesh, block_plan(block))
    return block, model.rope_cache[:64]


def test_the_llama4_tp_block_under_plain_torch_compile():
    """The oracle on the debug model's own TP block (torchtitan's plan, 2 fake ranks): plain
    ``compile(checkpoint_wrapper(block))`` fails in AOTAutograd, the stand-in compiles it as one
    graph with no break, as the block compiles without AC."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch.distributed.device_mesh import init_device_mesh

    torch.compiler.reset()
    with fake_process_group(2):
        mesh = init_device_mesh("cpu", (2,))
        x = torch.randn(2, 32, 256, requires_grad=True)  # this rank's half of the sequence
        block, rope = _tp_block(mesh)
        with pytest.raises(AssertionError, match=MISORDERED):
            torch.compile(checkpoint_wrapper(block), backend="aot_eager")(x, rope).sum().backward()

        counts = {}
        for name, wrapped in (
            ("no-ac", block),
            ("stand-in", checkpoint_wrapper(block, context_fn=ac_mod.rng_save_context_fn())),
        ):
            torch.compiler.reset()
            counter = CompileCounterWithBackend("aot_eager")
            torch.compile(wrapped, backend=counter)(x, rope).sum().backward()
            counts[name] = (counter.frame_count, len(counter.graphs))
        assert counts == {"no-ac": (1, 1), "stand-in": (1, 1)}, counts
    torch.compiler.reset()


@pytest.mark.slow  # a real scan on two spawned gloo ranks: minutes on shared cores
def test_tp2_full_ac_traces_on_real_ranks_and_simulation_agrees():
    from gbdoctor.scan import scan, simulate_scan

    spec = load_spec("fixtures/llama4_debug_tp2.toml", ["activation_checkpoint.mode=full"])
    real = scan(spec)
    reps = {b.kind: b for b in real.blocks if b.same_as is None}
    assert set(reps) == {"dense+ac", "moe+ac"}
    for block in reps.values():
        assert block.error is None and not block.breaks and block.graph_count == 1, block.error
    simulated = simulate_scan(spec)
    for report in (real, simulated):  # the stand-in is stated, not silent
        assert any(n.startswith("activation checkpointing: 6 checkpointed") for n in report.notes)
    assert replace(simulated.setup, simulated=False) == real.setup
    assert simulated.blocks == real.blocks
