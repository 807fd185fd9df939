"""FLOPs per token from the model config, device peaks and MFU (``gbdoctor.run_flops``).

The expected numbers are hand counts from the configs (the fixture's constants, torchtitan's
llama4 debug flavor), written out term by term, not the counter's own output.
"""

from __future__ import annotations

import importlib.util

import pytest
from repo_paths import FIXTURES

from gbdoctor.records import ModelSpec
from gbdoctor.run.flops import count_flops_per_token, mfu, model_flops_per_token, peak_tflops

MODELS = FIXTURES / "models"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_flops_{name}", MODELS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dense_model_hand_count():
    # fixtures/models/recompiler.py: vocab 256, dim 64, 4 heads (head_dim 16), 2 blocks, FFN hidden 2 x 64.
    module = _load("recompiler")
    counts = count_flops_per_token(module.build("tiny"), seq_len=32)
    vocab, dim, hidden, layers, heads, head_dim = 256, 64, 128, 2, 4, 16
    block = 2 * dim + dim * 3 * dim + dim * dim + 3 * dim * hidden  # 2 norms, wqkv, wo, w1/w2/w3
    total = vocab * dim + layers * block + dim + dim * vocab  # embedding, blocks, norm, output
    assert counts.params == total
    assert counts.embedding_params == vocab * dim and counts.routed_expert_params == 0
    assert counts.active_params == total - vocab * dim
    # QK^T and AV: 2 FLOPs per multiply-add, forward + backward = 3x: 12 * heads * head_dim * seq per layer.
    assert counts.attention_flops_per_token == layers * 12 * heads * head_dim * 32
    assert counts.flops_per_token == 6 * (total - vocab * dim) + layers * 12 * heads * head_dim * 32


def test_moe_model_counts_top_k_of_the_routed_experts():
    # torchtitan llama4 debugmodel: dim 256, 6 layers, 16 heads, vocab 2048, MoE on every 2nd layer
    # (layers 1, 3, 5), 8 routed experts, top_k 1, 1 shared expert, expert hidden 512
    # (ffn_hidden_dim(256) = 682 -> / (top_k + shared) = 341 -> multiple of 256 = 512).
    counts = model_flops_per_token(ModelSpec(name="llama4", flavor="debugmodel"), seq_len=2048)
    routed = 3 * (3 * 8 * 512 * 256)  # 3 MoE layers x (w1, w2, w3) x 8 experts x 512 x 256
    assert counts.routed_expert_params == routed
    assert counts.embedding_params == 2048 * 256
    assert counts.active_params == counts.params - 2048 * 256 - routed * 7 // 8
    assert counts.attention_flops_per_token == 6 * 12 * 16 * 16 * 2048
    assert counts.flops_per_token == 6 * counts.active_params + counts.attention_flops_per_token


def test_peak_lookup_and_mfu():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == pytest.approx(989.4)
    assert peak_tflops("NVIDIA H100 PCIe") == pytest.approx(756.0)
    assert peak_tflops("NVIDIA H200") == pytest.approx(989.4)
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == pytest.approx(312.0)
    assert peak_tflops("NVIDIA L40S") == pytest.approx(362.05)  # not the L4 entry
    assert peak_tflops("NVIDIA L4") == pytest.approx(121.0)
    assert peak_tflops("AMD EPYC 7B13") is None
    # 1000 tokens/s x 1e9 FLOPs/token = 1 TFLOP/s, over 2 ranks x 1 TFLOP/s peak = 50%.
    assert mfu(1000.0, 10**9, 1.0, 2) == pytest.approx(0.5)
    assert mfu(1000.0, 10**9, None, 2) is None and mfu(None, 10**9, 1.0, 1) is None
