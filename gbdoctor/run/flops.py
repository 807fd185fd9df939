"""Model FLOPs per token and device peaks, for ``gbdoctor run``'s MFU column.

FLOPs per token follow torchtitan's convention (``get_nparams_and_flops``): a training step
(forward + backward) costs 6 FLOPs per active parameter per token, plus the attention score and
value matmuls, ``6 * heads * (qk_head_dim + v_head_dim) * seq_len`` per attention layer (for
``qk == v`` head dims that is torchtitan's ``12 * heads * head_dim * seq_len``; causal masking is
not discounted). Embedding tables are lookups, not matmuls, and are left out. In an MoE layer only
``top_k`` of ``num_experts`` routed experts run per token, so routed-expert parameters count with
that fraction; shared experts count whole.

The counts come from the model as the spec's config builds it (on the meta device: nothing is
allocated) and from its modules' configuration attributes (``n_heads``, ``head_dim`` or
``qk_head_dim``/``v_head_dim``; an MoE layer's ``top_k``/``num_experts`` next to its ``experts``;
without head dims, ``head_dim = model dim / n_heads`` from the module's first linear), so built-in
families and custom models are counted the same way.

MFU = achieved FLOP/s (tokens/s x FLOPs per token) / (ranks x the device's dense bf16 peak).
CPU peaks are not tabulated (they depend on the SKU, cores and vector units), so MFU is reported
on GPUs only; the achieved TFLOP/s is reported everywhere.
"""

from __future__ import annotations

from torch import nn

from gbdoctor.records.base import record
from gbdoctor.records.spec import ModelSpec


@record
class FlopsCount:
    params: int
    """All parameters (global, unsharded)."""
    embedding_params: int
    routed_expert_params: int
    """Parameters of routed experts (all of them; ``active_params`` counts the routed share)."""
    active_params: int
    """Parameters a token's forward multiplies by: all but embeddings, routed experts x top_k/E."""
    attention_flops_per_token: int
    """Training FLOPs per token of the attention score/value matmuls at ``seq_len``."""
    seq_len: int
    flops_per_token: int
    """6 x active_params + attention_flops_per_token (forward + backward)."""


def count_flops_per_token(model: nn.Module, seq_len: int) -> FlopsCount:
    """:class:`FlopsCount` of ``model`` (any device, meta included) at ``seq_len``."""
    params = sum(p.numel() for p in model.parameters())
    embedding = sum(
        p.numel()
        for m in model.modules()
        if isinstance(m, nn.Embedding)
        for p in m.parameters(recurse=False)
    )
    routed = 0
    inactive = 0.0
    for module in model.modules():
        experts = getattr(module, "experts", None)
        top_k, num = getattr(module, "top_k", None), getattr(module, "num_experts", None)
        if (
            isinstance(experts, nn.Module)
            and isinstance(top_k, int)
            and isinstance(num, int)
            and num > 0
        ):
            n = sum(p.numel() for p in experts.parameters())
            routed += n
            inactive += n * (1 - min(top_k, num) / num)
    attention = 0
    for module in model.modules():
        heads = getattr(module, "n_heads", None)
        linear = next((c for c in module.children() if isinstance(c, nn.Linear)), None)
        if not isinstance(heads, int) or heads < 1 or linear is None:
            continue
        # Without head-dim attributes, the llama convention: head_dim = model dim / heads.
        default = linear.in_features // heads
        qk = getattr(module, "qk_head_dim", None) or getattr(module, "head_dim", None) or default
        v = getattr(module, "v_head_dim", None) or getattr(module, "head_dim", None) or default
        attention += 6 * heads * (qk + v) * seq_len
    active = params - embedding - round(inactive)
    return FlopsCount(
        params=params,
        embedding_params=embedding,
        routed_expert_params=routed,
        active_params=active,
        attention_flops_per_token=attention,
        seq_len=seq_len,
        flops_per_token=6 * active + attention,
    )


def model_flops_per_token(model_spec: ModelSpec, seq_len: int) -> FlopsCount:
    """:func:`count_flops_per_token` of the spec's model, built on the meta device."""
    from gbdoctor.models import build_model

    return count_flops_per_token(
        build_model(model_spec, device="meta", max_seq_len=seq_len), seq_len
    )


PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    # Dense bf16 tensor-core peaks from the vendors' datasheets (no sparsity), matched against
    # torch.cuda.get_device_name() in this order (the first substring that matches wins).
    ("H200", 989.4),
    ("GH200", 989.4),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.4),  # SXM
    ("H800", 989.4),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.05),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("MI300X", 1307.4),
    ("MI325X", 1307.4),
)


def peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak TFLOP/s of a GPU by its name; None when unknown (and for CPUs)."""
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops
    return None


def mfu(
    tokens_per_s: float | None, flops_per_token: int, peak: float | None, ranks: int
) -> float | None:
    """Model FLOPs utilization in [0, 1]: achieved FLOP/s over ``ranks`` x ``peak`` TFLOP/s."""
    if not tokens_per_s or not peak or ranks < 1:
        return None
    return tokens_per_s * flops_per_token / (ranks * peak * 1e12)
