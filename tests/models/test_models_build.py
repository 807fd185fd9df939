"""Every built-in flavor builds; debug flavors train a step on CPU; full sizes build on meta."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from gbdoctor.models import build_model, family_flavors, vocab_size
from gbdoctor.records import ModelSpec

B, S = 2, 32
SDPA_DEBUG = [("llama3", "debugmodel"), ("llama4", "debugmodel"), ("deepseek_v3", "debugmodel")]
FLEX_DEBUG = [
    ("llama3", "debugmodel_flex_attn"),
    ("llama4", "debugmodel_irope"),
    ("deepseek_v3", "debugmodel_flex_attn"),
]


def _build(family, flavor, device="cpu", seed=0):
    torch.manual_seed(seed)
    return build_model(ModelSpec(name=family, flavor=flavor), device=device)


def _tokens(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size(model), (B, S), generator=g)


@pytest.mark.parametrize("family, flavor", SDPA_DEBUG)
def test_debug_forward_backward(family, flavor):
    model = _build(family, flavor)
    tokens = _tokens(model)
    logits = model(tokens)
    assert logits.shape == (B, S, 2048)
    loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    assert torch.isfinite(loss)
    loss.backward()
    # 64 tokens x top_k over 8 experts: every expert is hit with overwhelming probability at init.
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("family, flavor", FLEX_DEBUG)
def test_flex_debug_forward_no_grad(family, flavor):
    """torch 2.13 has no FlexAttention backward on CPU, so flex flavors only run forward here."""
    model = _build(family, flavor)
    tokens = _tokens(model)
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == (B, S, 2048) and torch.isfinite(logits).all()
    if torch.cuda.is_available():
        return
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        model(tokens)


def test_debug_structure_llama4():
    model = _build("llama4", "debugmodel", device="meta")
    moe_layers = [int(k) for k, b in model.layers.items() if b.moe_enabled]
    assert moe_layers == [1, 3, 5]
    moe = model.layers["1"].moe
    assert tuple(moe.experts.w1.shape) == (8, 512, 256) and tuple(moe.experts.w2.shape) == (
        8,
        256,
        512,
    )
    assert moe.shared_experts.w1.out_features == 512
    assert model.layers["0"].feed_forward.w1.out_features == 768
    assert moe.router.score_func == "sigmoid" and moe.top_k == 1 and moe.score_before_experts
    irope = _build("llama4", "debugmodel_irope", device="meta")
    assert [k for k, b in irope.layers.items() if not b.attention.use_rope] == ["3"]


def test_debug_structure_deepseek():
    model = _build("deepseek_v3", "debugmodel", device="meta")
    assert [k for k, b in model.layers.items() if not b.moe_enabled] == ["0"]
    assert model.layers["0"].feed_forward.w1.out_features == 1024
    moe = model.layers["1"].moe
    assert moe.top_k == 3 and moe.router.score_func == "softmax" and not moe.score_before_experts
    assert tuple(moe.experts.w1.shape) == (8, 256, 256)
    assert moe.shared_experts.w1.out_features == 512
    attn = model.layers["1"].attention
    assert attn.wq.out_features == 16 * 192 and attn.wkv_a.out_features == 512 + 64
    assert attn.wkv_b.out_features == 16 * (128 + 128) and attn.wo.in_features == 16 * 128
    big = _build("deepseek_v3", "671B", device="meta")
    assert hasattr(big.layers["0"].attention, "wq_a") and not hasattr(
        big.layers["0"].attention, "wq"
    )


def test_builtin_names_match_torchtitan():
    model = _build("llama3", "debugmodel", device="meta")
    names = {n for n, _ in model.named_parameters()}
    for expected in (
        "tok_embeddings.weight",
        "layers.0.attention.wq.weight",
        "layers.0.feed_forward.w3.weight",
        "layers.5.ffn_norm.weight",
        "norm.weight",
        "output.weight",
    ):
        assert expected in names
    moe = _build("llama4", "debugmodel", device="meta").layers["1"]
    names = {n for n, _ in moe.named_parameters()} | {n for n, _ in moe.named_buffers()}
    for expected in (
        "moe.router.gate.weight",
        "moe.experts.w1",
        "moe.shared_experts.w2.weight",
        "moe.expert_bias",
        "moe.tokens_per_expert",
    ):
        assert expected in names
    assert "moe.tokens_per_expert" not in moe.state_dict() and "moe.expert_bias" in moe.state_dict()


def test_init_is_deterministic_and_matches_meta_path():
    a = _build("llama3", "debugmodel", seed=3)
    b = _build("llama3", "debugmodel", device="meta")
    b.to_empty(device="cpu")
    torch.manual_seed(3)
    b.init_weights(buffer_device="cpu")
    for (name, ta), tb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(ta, tb), name
    assert torch.equal(a.rope_cache, b.rope_cache)
    c = _build("llama3", "debugmodel", seed=4)
    assert not torch.equal(a.output.weight, c.output.weight)


FULL = [
    ("llama3", "8B", 7.5e9, 8.5e9),
    ("llama3", "70B", 68e9, 72e9),
    ("llama4", "17bx16e", 100e9, 110e9),
    ("llama4", "17bx128e", 390e9, 410e9),
    ("deepseek_v3", "16B", 15e9, 17e9),
    ("deepseek_v3", "671B", 660e9, 680e9),
]


@pytest.mark.parametrize("family, flavor, low, high", FULL)
def test_full_size_builds_on_meta(family, flavor, low, high):
    start = time.perf_counter()
    model = build_model(ModelSpec(name=family, flavor=flavor), device="meta")
    elapsed = time.perf_counter() - start
    assert all(p.device.type == "meta" for p in model.parameters())
    assert all(b.device.type == "meta" for b in model.buffers())
    total = sum(p.numel() for p in model.parameters())
    assert low <= total <= high, f"{flavor}: {total / 1e9:.2f}e9 params"
    assert elapsed < 10.0


def test_every_flavor_builds_on_meta():
    for family in ("llama3", "llama4", "deepseek_v3"):
        for flavor in family_flavors(family):
            model = build_model(ModelSpec(name=family, flavor=flavor), device="meta")
            assert len(model.layers) > 0
