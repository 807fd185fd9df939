"""DeepSeek-V3 (MLA attention, dense first layers then MoE), with torchtitan v0.2.2's flavors.

Node-limited routing (``num_expert_groups``/``num_limited_groups`` of the 236B/671B flavors) is
recorded in ``MoEArgs`` but not applied; multi-token prediction is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

from .attention import MLAttention, mla_softmax_scale
from .common import FeedForward, yarn_frequencies
from .decoder import Decoder, TransformerBlock
from .moe import MoE, MoEArgs


@dataclass(frozen=True, kw_only=True, slots=True)
class DeepSeekV3Args:
    vocab_size: int = 102400
    dim: int = 2048
    inter_dim: int = 10944
    """Hidden size of the dense FFN layers."""
    moe_inter_dim: int = 1408
    """Hidden size of each routed expert (shared experts: times ``num_shared_experts``)."""
    n_layers: int = 27
    n_dense_layers: int = 1
    n_heads: int = 16
    norm_eps: float = 1e-5
    moe: MoEArgs = field(
        default_factory=lambda: MoEArgs(
            num_experts=64,
            num_shared_experts=2,
            top_k=6,
            score_func="softmax",
            route_norm=False,
            score_before_experts=False,
        )
    )
    q_lora_rank: int = 0
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    attn_type: str = "sdpa"
    attn_mask_type: str = "causal"
    max_seq_len: int = 4096
    """Length of the RoPE table; torchtitan overrides it with ``training.seq_len``. YaRN (and the
    mscale softmax correction) only kick in when it exceeds ``original_seq_len``."""
    original_seq_len: int = 4096
    rope_theta: float = 10000.0
    rope_factor: float = 40.0
    beta_fast: int = 32
    beta_slow: int = 1
    mscale: float = 1.0


def _moe(
    num_experts: int,
    num_shared_experts: int,
    top_k: int,
    score_func: str,
    *,
    route_norm: bool = False,
    route_scale: float = 1.0,
    groups: tuple[int, int] | None = None,
) -> MoEArgs:
    return MoEArgs(
        num_experts=num_experts,
        num_shared_experts=num_shared_experts,
        top_k=top_k,
        score_func=score_func,
        route_norm=route_norm,
        route_scale=route_scale,
        score_before_experts=False,
        num_expert_groups=groups[0] if groups else None,
        num_limited_groups=groups[1] if groups else None,
    )


# Variants are ``replace``d from a base (not ``**`` of a dict) so that mypy checks every field.
_DEBUG = DeepSeekV3Args(
    vocab_size=2048,
    dim=256,
    inter_dim=1024,
    moe_inter_dim=256,
    n_layers=6,
    n_dense_layers=1,
    n_heads=16,
    moe=_moe(8, 2, 3, "softmax"),
    q_lora_rank=0,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    mscale=0.70,
)

FLAVORS: dict[str, DeepSeekV3Args] = {
    "debugmodel": _DEBUG,
    "debugmodel_flex_attn": replace(_DEBUG, attn_type="flex", attn_mask_type="block_causal"),
    "16B": DeepSeekV3Args(
        vocab_size=102400,
        dim=2048,
        inter_dim=10944,
        moe_inter_dim=1408,
        n_layers=27,
        n_dense_layers=1,
        n_heads=16,
        moe=_moe(64, 2, 6, "softmax"),
        q_lora_rank=0,
        kv_lora_rank=512,
        mscale=0.70,
    ),
    "236B": DeepSeekV3Args(
        vocab_size=102400,
        dim=5120,
        inter_dim=12288,
        moe_inter_dim=1536,
        n_layers=60,
        n_dense_layers=1,
        n_heads=128,
        moe=_moe(160, 2, 6, "softmax", route_scale=16.0, groups=(8, 3)),
        q_lora_rank=1536,
        kv_lora_rank=512,
    ),
    "671B": DeepSeekV3Args(
        vocab_size=129280,
        dim=7168,
        inter_dim=18432,
        moe_inter_dim=2048,
        n_layers=61,
        n_dense_layers=3,
        n_heads=128,
        moe=_moe(256, 1, 8, "sigmoid", route_norm=True, route_scale=2.5, groups=(8, 4)),
        q_lora_rank=1536,
        kv_lora_rank=512,
    ),
}


def moe_enabled(args: DeepSeekV3Args, layer_id: int) -> bool:
    return layer_id >= args.n_dense_layers


class Transformer(Decoder):
    def __init__(self, args: DeepSeekV3Args) -> None:
        scale = mla_softmax_scale(
            args.qk_nope_head_dim + args.qk_rope_head_dim,
            max_seq_len=args.max_seq_len,
            original_seq_len=args.original_seq_len,
            rope_factor=args.rope_factor,
            mscale=args.mscale,
        )
        blocks = []
        for i in range(args.n_layers):
            attention = MLAttention(
                args.dim,
                args.n_heads,
                q_lora_rank=args.q_lora_rank,
                kv_lora_rank=args.kv_lora_rank,
                qk_nope_head_dim=args.qk_nope_head_dim,
                qk_rope_head_dim=args.qk_rope_head_dim,
                v_head_dim=args.v_head_dim,
                softmax_scale=scale,
                norm_eps=args.norm_eps,
                attn_type=args.attn_type,
            )
            moe = (
                MoE(args.moe, dim=args.dim, hidden_dim=args.moe_inter_dim)
                if moe_enabled(args, i)
                else None
            )
            ffn = FeedForward(args.dim, args.inter_dim) if moe is None else None
            blocks.append(
                TransformerBlock(
                    layer_id=i,
                    dim=args.dim,
                    norm_eps=args.norm_eps,
                    attention=attention,
                    feed_forward=ffn,
                    moe=moe,
                )
            )
        super().__init__(
            vocab_size=args.vocab_size,
            dim=args.dim,
            norm_eps=args.norm_eps,
            max_seq_len=args.max_seq_len,
            attn_type=args.attn_type,
            blocks=blocks,
            rope_freqs_fn=partial(
                yarn_frequencies,
                args.qk_rope_head_dim,
                args.rope_theta,
                max_seq_len=args.max_seq_len,
                original_seq_len=args.original_seq_len,
                rope_factor=args.rope_factor,
                beta_fast=args.beta_fast,
                beta_slow=args.beta_slow,
            ),
        )
        self.model_args = args


def build(args: DeepSeekV3Args) -> Transformer:
    return Transformer(args)
