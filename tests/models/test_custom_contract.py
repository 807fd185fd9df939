"""The custom-model contract: outputs, block discovery, MoE recognition by structure, routing
statistics classified by behaviour, and region_eager under the default strategy's flags."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn as nn
from repo_paths import FIXTURES

from gbdoctor.errors import SpecError
from gbdoctor.models.structure import ep_refusal, find_blocks, find_moe_layers
from gbdoctor.scan import scan
from gbdoctor.setup.apply import _expert_stores
from gbdoctor.setup.outputs import LossSource, training_loss
from gbdoctor.spec import load_spec

# --------------------------------------------------------------------------- outputs


class _Out:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def _labels():
    return torch.randint(0, 10, (2, 3))


@pytest.mark.parametrize(
    "make, source",
    [
        (lambda t: t, LossSource.LOGITS),
        (lambda t: (t, None), LossSource.LOGITS),
        (lambda t: {"logits": t, "aux": 1}, LossSource.LOGITS),
        (lambda t: _Out(loss=None, logits=t), LossSource.LOGITS),
        (lambda t: _Out(last_hidden_state=t[..., :4]), LossSource.HIDDEN),
        (lambda t: [t[..., :4]], LossSource.HIDDEN),
        (lambda t: {"loss": t.mean(), "logits": t}, LossSource.LOSS),
    ],
)
def test_training_loss_accepts_what_models_return(make, source):
    labels = _labels()
    out = torch.randn(2, 3, 10, requires_grad=True)
    loss, used = training_loss(make(out), labels, 1, vocab=10)
    assert used is source and loss.dim() == 0
    loss.backward()
    assert out.grad is not None and out.grad.abs().sum() > 0


def test_surrogate_loss_reaches_every_block():
    blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
    x = torch.randn(2, 3, 8)
    for block in blocks:
        x = block(x)
    loss, used = training_loss({"last_hidden_state": x}, _labels(), 1, vocab=10)
    loss.backward()
    assert used is LossSource.HIDDEN
    assert all(b.weight.grad is not None and b.weight.grad.abs().sum() > 0 for b in blocks)


# --------------------------------------------------------------------------- blocks, MoE


class _Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)

    def forward(self, x):
        return self.up(x)


class _ListMoE(nn.Module):
    """Experts as a ModuleList (more entries than the model has blocks) plus a router."""

    def __init__(self) -> None:
        super().__init__()
        self.pick = nn.Linear(8, 6, bias=False)
        self.pool = nn.ModuleList(_Expert() for _ in range(6))


class _Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(10, 8)
        self.h = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), _ListMoE()) for _ in range(2))
        self.heads = nn.ModuleList([nn.Linear(8, 10), nn.Linear(8, 3)])


def test_blocks_found_by_structure_and_by_path():
    model = nn.Module()
    model.transformer = _Tower()
    found = find_blocks(model)
    assert found.path == "transformer.h"
    assert [fqn for fqn, _, _ in found.items()] == ["transformer.h.0", "transformer.h.1"]
    assert find_blocks(model, "transformer.heads").path == "transformer.heads"
    with pytest.raises(SpecError, match="no module at that path"):
        find_blocks(model, "transformer.layers")


def test_moe_by_structure_container_of_experts():
    block = _Tower().h[0]
    (moe,) = find_moe_layers(block, hidden=8)
    assert (moe.path, moe.router, moe.experts, moe.num_experts, moe.stacked) == (
        "1",
        "1.pick",
        "1.pool",
        6,
        False,
    )
    assert find_moe_layers(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)), hidden=8) == []
    # gbdoctor's EP shards stacked weights: a container of experts is refused (exit 2).
    assert "container of 6 expert modules" in ep_refusal(moe, block.get_submodule(moe.experts))
    with pytest.raises(SpecError) as err:
        _expert_stores("h.0", block, 8)
    assert (
        err.value.exit_code == 2
        and "expert parallelism is not supported for h.0.1" in err.value.message
    )


# --------------------------------------------------------------------------- planted scans


def _neutral():
    spec = importlib.util.spec_from_file_location(
        "neutral_moe_fixture", FIXTURES / "models" / "neutral_moe.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_neutral_names_bincount_counter_is_moe_load_balancing(custom_spec):
    # No name in the fixture says router, gate, expert or tokens_per_expert: structure and the
    # counting line's behaviour must carry the classification.
    names = {n for n, _ in _neutral().build("counting").named_modules()}
    names |= {n for n, _ in _neutral().build("counting").named_buffers()}
    assert not any(w in n for n in names for w in ("router", "gate", "expert", "count"))
    report = scan(load_spec(custom_spec("neutral_moe.py", "counting")))
    assert [b.fqn for b in report.blocks] == ["stack.0", "stack.1"]
    for block in report.blocks:
        assert str(block.kind) == "moe"
        assert block.breaks and {b.cause for b in block.breaks} == {"moe-load-balancing"}
        assert {b.module for b in block.breaks} == {f"{block.fqn}.mix"}
    plain = scan(load_spec(custom_spec("neutral_moe.py", "plain")))
    assert all(str(b.kind) == "moe" and not b.breaks for b in plain.blocks)


def test_region_eager_under_default_strategy(tmp_path):
    path = tmp_path / "item.toml"
    path.write_text(
        f'[model]\nname = "custom"\nflavor = "item_branch"\nfactory = "{FIXTURES / "models" / "planted.py"}:build"\n'
        '[training]\nlocal_batch_size = 2\nseq_len = 16\n[activation_checkpoint]\nmode = "full"\n'
    )
    report = scan(load_spec(path))
    assert report.setup.strategy == "block"
    assert dict(report.setup.dynamo_config)["capture_scalar_outputs"] == "True"
    for block in report.blocks:
        assert block.graph_count == 0 and block.breaks
        events = [e for e in block.events if e.kind == "region_eager"]
        assert [e.module for e in events] == [block.fqn]
        assert events[0].location is not None and events[0].location.file.endswith("planted.py")


def test_bf16_warm_up_failure_names_the_float32_override(monkeypatch):
    from gbdoctor.errors import SetupError
    from gbdoctor.scan import warm_up

    def fails(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 must have the same dtype, but got Float and BFloat16")

    class Recipe:
        train_step = staticmethod(fails)

    monkeypatch.setattr(warm_up, "forward_loss", fails)
    setup = type(
        "Setup", (), {"optimizer": None, "model": nn.Linear(2, 2), "own_pipeline": False}
    )()
    attempts = warm_up.warm_up_attempts(Recipe(), setup, None, None)
    with pytest.raises(SetupError) as err:
        warm_up.run_warm_up(setup, attempts, [])
    assert "--set training.mixed_precision_param=float32" in err.value.hint
