"""MoE pieces: grouped vs loop experts, router semantics, buffers, grouped-mm support probe."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gbdoctor.models.moe import (
    GroupedExperts,
    MoE,
    MoEArgs,
    TokenChoiceTopKRouter,
    TokenReorderer,
    grouped_mm_supported,
)

D, H, E = 32, 48, 4


def _experts(seed=0):
    torch.manual_seed(seed)
    ex = GroupedExperts(D, H, E, use_grouped_mm=True)
    ex.init_weights(0.05)
    return ex


def test_grouped_mm_supported():
    assert grouped_mm_supported("cpu") == hasattr(torch, "_grouped_mm")
    assert grouped_mm_supported("meta") == hasattr(torch, "_grouped_mm")
    if not torch.cuda.is_available():
        assert grouped_mm_supported("cuda") is False


@pytest.mark.parametrize("counts", [[5, 0, 7, 4], [16, 0, 0, 0], [1, 2, 3, 10]])
def test_grouped_and_loop_paths_agree(counts):
    ex = _experts()
    n = torch.tensor(counts, dtype=torch.float32)
    x = torch.randn(int(n.sum()), D, requires_grad=True)

    grouped = ex(x, n)
    (g_grad,) = torch.autograd.grad(grouped.pow(2).sum(), x)
    ex.use_grouped_mm = False
    loop = ex(x, n)
    (l_grad,) = torch.autograd.grad(loop.pow(2).sum(), x)

    assert grouped.dtype == x.dtype == loop.dtype and grouped.shape == loop.shape == x.shape
    torch.testing.assert_close(grouped, loop, atol=2e-2, rtol=2e-2)  # grouped path computes in bf16
    torch.testing.assert_close(g_grad, l_grad, atol=5e-2, rtol=5e-2)


def test_grouped_experts_param_grads():
    ex = _experts()
    n = torch.tensor([3.0, 5.0, 0.0, 8.0])
    out = ex(torch.randn(16, D), n)
    (out * torch.randn_like(out)).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in ex.parameters())
    assert ex.w1.grad[2].abs().sum() == 0  # the empty group gets a zero gradient


def test_loop_path_pads_rows_past_the_routed_ones():
    ex = _experts()
    ex.use_grouped_mm = False
    out = ex(torch.randn(10, D), torch.tensor([2.0, 2.0, 2.0, 2.0]))
    assert out.shape == (10, D) and out[8:].abs().sum() == 0


def test_router_bias_picks_but_does_not_gate():
    torch.manual_seed(0)
    router = TokenChoiceTopKRouter(
        D, E, top_k=1, score_func="sigmoid", route_norm=False, route_scale=1.0
    )
    x = torch.randn(6, D)
    bias = torch.tensor([0.0, 0.0, 10.0, 0.0])
    scores, chosen = router(x, bias)
    assert (chosen == 2).all()
    torch.testing.assert_close(scores[:, 0], torch.sigmoid(router.gate(x).float())[:, 2])
    assert scores.dtype == torch.float32


def test_router_route_norm_and_scale():
    torch.manual_seed(0)
    router = TokenChoiceTopKRouter(
        D, E, top_k=2, score_func="softmax", route_norm=True, route_scale=2.5
    )
    scores, chosen = router(torch.randn(5, D))
    torch.testing.assert_close(scores.sum(-1), torch.full((5,), 2.5))
    assert chosen.shape == (5, 2)


def test_reorderer_counts_and_order():
    reorder = TokenReorderer(num_experts=E, top_k=2)
    ids = torch.tensor([[3, 0], [0, 1], [3, 3]])
    scores = torch.arange(6, dtype=torch.float32).view(3, 2)
    sorted_scores, order, counts = reorder(scores, ids)
    assert counts.tolist() == [2.0, 1.0, 0.0, 3.0]
    assert order.tolist() == [1, 2, 3, 0, 4, 5]  # stable within an expert
    assert sorted_scores.tolist() == [1.0, 2.0, 3.0, 0.0, 4.0, 5.0]
    assert (order // 2).tolist() == [0, 1, 1, 0, 2, 2]


@pytest.mark.parametrize("score_before", [True, False])
def test_moe_matches_dense_reference(score_before):
    """Route through the module and through a per-token loop: same output."""
    torch.manual_seed(0)
    args = MoEArgs(
        num_experts=E,
        num_shared_experts=1,
        top_k=2,
        score_func="softmax",
        score_before_experts=score_before,
    )
    moe = MoE(args, dim=D, hidden_dim=H)
    moe.init_weights(0.05)
    x = torch.randn(2, 5, D)
    out = moe(x)

    flat = x.reshape(-1, D)
    scores, chosen = moe.router(flat, moe.expert_bias)
    ex = moe.experts
    ref = moe.shared_experts(flat).clone()
    for t in range(flat.shape[0]):
        for j in range(2):
            e = chosen[t, j]
            xe = flat[t] * scores[t, j] if score_before else flat[t]
            h = torch.nn.functional.silu(ex.w1[e] @ xe) * (ex.w3[e] @ xe)
            y = ex.w2[e] @ h
            ref[t] += y if score_before else y * scores[t, j]
    torch.testing.assert_close(out.reshape(-1, D), ref, atol=2e-2, rtol=2e-2)


def test_moe_buffers_and_disabled_balancing():
    moe = MoE(MoEArgs(num_experts=E), dim=D, hidden_dim=H)
    assert moe.expert_bias.dtype == torch.float32 and moe.expert_bias.shape == (E,)
    assert "expert_bias" in moe.state_dict() and "tokens_per_expert" not in moe.state_dict()
    assert moe.load_balance_coeff == 1e-3 and moe.num_experts == E and moe.top_k == 1

    off = MoE(
        MoEArgs(num_experts=E, load_balance_coeff=None, num_shared_experts=0), dim=D, hidden_dim=H
    )
    assert off.expert_bias is None and off.tokens_per_expert is None and off.shared_experts is None
    off.init_weights(0.02)
    assert off(torch.randn(1, 4, D)).shape == (1, 4, D)


def test_use_grouped_mm_override():
    moe = MoE(replace(MoEArgs(), use_grouped_mm=False), dim=D, hidden_dim=H)
    assert moe.experts.use_grouped_mm is False


def test_experts_use_local_shard_of_dtensor_weights():
    """Under EP the weights become DTensors sharded on dim 0; the experts compute with the local
    shard and the local token counts (contract with the expert-parallel setup)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already running")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        sharded = _experts()
        local = GroupedExperts(D, H, E // 2, use_grouped_mm=True)
        with torch.no_grad():
            for name in ("w1", "w2", "w3"):
                full = getattr(sharded, name).detach()
                getattr(local, name).copy_(full[: E // 2])
                setattr(
                    sharded, name, torch.nn.Parameter(distribute_tensor(full, mesh, [Shard(0)]))
                )
        x, counts = torch.randn(10, D), torch.tensor([4.0, 6.0])
        for grouped in (True, False):
            sharded.use_grouped_mm = local.use_grouped_mm = grouped
            torch.testing.assert_close(sharded(x, counts), local(x, counts))
        sharded(x, counts).pow(2).sum().backward()
        assert isinstance(sharded.w1.grad, DTensor)
    finally:
        dist.destroy_process_group()
