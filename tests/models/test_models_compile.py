"""Built-in blocks are compile-clean on torch 2.13: one graph, zero breaks, with grouped mm."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from gbdoctor.models import build_model
from gbdoctor.records import ModelSpec

B, S = 2, 32

CASES = [  # (family, flavor, layer): dense and MoE blocks of each debug model
    ("llama3", "debugmodel", "0"),
    ("llama4", "debugmodel", "0"),
    ("llama4", "debugmodel", "1"),
    ("deepseek_v3", "debugmodel", "0"),
    ("deepseek_v3", "debugmodel", "1"),
]

_MODELS: dict[str, torch.nn.Module] = {}


def _model(family, flavor):
    key = f"{family}/{flavor}"
    if key not in _MODELS:
        torch.manual_seed(0)
        _MODELS[key] = build_model(ModelSpec(name=family, flavor=flavor))
    return _MODELS[key]


def _inputs(model, requires_grad=True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, S, model.dim, generator=g).requires_grad_(requires_grad)
    return x, model.rope_cache[:S]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("family, flavor, layer", CASES)
def test_block_explain_single_graph(family, flavor, layer):
    model = _model(family, flavor)
    block = model.layers[layer]
    if block.moe_enabled:
        assert block.moe.experts.use_grouped_mm
    out = torch._dynamo.explain(block)(*_inputs(model))
    assert out.graph_break_count == 0, [r.reason for r in out.break_reasons]
    assert out.graph_count == 1


@pytest.mark.parametrize("family, flavor, layer", [c for c in CASES if c[2] == "1"] + [CASES[0]])
def test_block_fullgraph_strict_fwd_bwd(family, flavor, layer):
    model = _model(family, flavor)
    block = model.layers[layer]
    x, rope = _inputs(model)
    compiled = torch.compile(block, backend="eager", fullgraph=True)
    with torch._dynamo.error_on_graph_break(True):
        y = compiled(x, rope)
    y.float().pow(2).mean().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize(
    "family, flavor, top_k", [("llama4", "debugmodel", 1), ("deepseek_v3", "debugmodel", 3)]
)
def test_tokens_per_expert_counts_once_eager_and_compiled(family, flavor, top_k):
    model = _model(family, flavor)
    block = model.layers["1"]
    buf = block.moe.tokens_per_expert
    x, rope = _inputs(model, requires_grad=False)

    before = buf.clone()
    block(x, rope)
    assert (buf - before).sum().item() == B * S * top_k
    assert ((buf - before) >= 0).all()

    before = buf.clone()
    torch.compile(block, backend="eager", fullgraph=True)(x, rope)
    assert (buf - before).sum().item() == B * S * top_k


def test_whole_model_explain_single_graph():
    model = _model("llama4", "debugmodel")
    tokens = torch.randint(0, 2048, (B, S))
    out = torch._dynamo.explain(model)(tokens)
    assert (out.graph_count, out.graph_break_count) == (1, 0)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_block_single_graph_no_grad():
    model = _model("llama4", "debugmodel_irope")
    x, rope = _inputs(model, requires_grad=False)
    with torch.no_grad():
        model(torch.zeros(B, S, dtype=torch.long))  # warms the BlockMask cache, as training would
        out = torch._dynamo.explain(model.layers["1"])(x, rope)
    assert (out.graph_count, out.graph_break_count) == (1, 0)


def test_loop_experts_break_on_tolist():
    """The for-loop expert path is the documented data-dependent break (``.tolist()``)."""
    model = _model("llama4", "debugmodel")
    experts = model.layers["1"].moe.experts
    experts.use_grouped_mm = False
    try:
        out = torch._dynamo.explain(model.layers["1"])(*_inputs(model, requires_grad=False))
    finally:
        experts.use_grouped_mm = True
    assert out.graph_break_count >= 1
    assert any("Data dependent" in r.reason or "tolist" in r.reason for r in out.break_reasons)


def test_loop_experts_clean_with_capture_scalar_outputs():
    """With torchtitan's ``capture_scalar_outputs=True`` the loop path traces into one graph too
    (no data-dependent ``if`` on the token counts)."""
    model = _model("llama4", "debugmodel")
    experts = model.layers["1"].moe.experts
    experts.use_grouped_mm = False
    try:
        with torch._dynamo.config.patch(capture_scalar_outputs=True):
            out = torch._dynamo.explain(model.layers["1"])(*_inputs(model, requires_grad=False))
    finally:
        experts.use_grouped_mm = True
    assert (out.graph_count, out.graph_break_count) == (1, 0), [r.reason for r in out.break_reasons]


def test_rope_extension_past_max_seq_len_is_compile_clean():
    """Sequences longer than the RoPE table extend it inside forward without a break."""
    torch.manual_seed(0)
    model = build_model(ModelSpec(name="llama3", flavor="debugmodel"), max_seq_len=16)
    out = torch._dynamo.explain(model)(torch.randint(0, 2048, (B, S)))
    assert (out.graph_count, out.graph_break_count) == (1, 0), [r.reason for r in out.break_reasons]
