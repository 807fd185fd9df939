"""Llama 4 (interleaved dense/MoE blocks), with torchtitan v0.2.2's flavors.

iRoPE flavors drop RoPE on every ``every_n_layers_nope``-th layer (the "NoPE" layers) and use flex
attention; their chunked (``fixed_attn_block_size``) mask is approximated by a causal one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

import torch

from .attention import Attention
from .common import FeedForward, ffn_hidden_dim, llama_scaled_frequencies, rope_frequencies
from .decoder import Decoder, TransformerBlock
from .moe import MoE, MoEArgs


@dataclass(frozen=True, kw_only=True, slots=True)
class RoPEScalingArgs:
    scaling_factor: float = 16.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 1.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, kw_only=True, slots=True)
class Llama4Args:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None
    vocab_size: int = 202048
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RoPEScalingArgs | None = None
    max_seq_len: int = 4096
    """Length of the RoPE table; torchtitan overrides it with ``training.seq_len``."""
    attn_type: str = "sdpa"
    attn_mask_type: str = "causal"
    every_n_layers_nope: int | None = None
    fixed_attn_block_size: int = 8192
    """Chunk size of the iRoPE chunked attention; recorded, run as causal."""
    moe: MoEArgs = field(default_factory=MoEArgs)
    auto_scale_hidden_dim: bool = True
    """Divide the expert hidden size by ``top_k + num_shared_experts`` (constant active compute)."""
    interleave_moe_layer_step: int = 2


# Variants are ``replace``d from a base (not ``**`` of a dict) so that mypy checks every field.
_DEBUG = Llama4Args(
    dim=256,
    n_layers=6,
    n_heads=16,
    vocab_size=2048,
    rope_theta=500000.0,
    rope_scaling=RoPEScalingArgs(),
)
_17B = Llama4Args(
    dim=5120,
    n_layers=48,
    n_heads=40,
    n_kv_heads=8,
    ffn_dim_multiplier=1.2,
    multiple_of=2048,
    rope_theta=500000.0,
)


def _irope(args: Llama4Args) -> Llama4Args:
    """``args`` with iRoPE: every 4th layer without RoPE, chunked attention (run as causal)."""
    return replace(args, every_n_layers_nope=4, attn_type="flex", attn_mask_type="block_causal")


FLAVORS: dict[str, Llama4Args] = {
    "debugmodel": _DEBUG,
    "debugmodel_irope": replace(_irope(_DEBUG), fixed_attn_block_size=256),
    "17bx16e": replace(
        _17B,
        rope_scaling=RoPEScalingArgs(),
        moe=MoEArgs(num_experts=16),
        interleave_moe_layer_step=1,
    ),
    "17bx128e": replace(_17B, moe=MoEArgs(num_experts=128)),
    "17bx16e_irope": replace(
        _irope(_17B),
        rope_scaling=RoPEScalingArgs(),
        moe=MoEArgs(num_experts=16),
        interleave_moe_layer_step=1,
    ),
    "17bx128e_irope": replace(_irope(_17B), moe=MoEArgs(num_experts=128)),
}


def moe_enabled(args: Llama4Args, layer_id: int) -> bool:
    return (layer_id + 1) % args.interleave_moe_layer_step == 0


def expert_hidden_dim(args: Llama4Args) -> int:
    divisor = args.moe.top_k + args.moe.num_shared_experts if args.auto_scale_hidden_dim else 1
    return ffn_hidden_dim(
        args.dim,
        multiple_of=args.multiple_of,
        ffn_dim_multiplier=args.ffn_dim_multiplier,
        divisor=divisor,
    )


def _frequencies(args: Llama4Args) -> torch.Tensor:
    freqs = rope_frequencies(args.dim // args.n_heads, args.rope_theta)
    if args.rope_scaling is None:
        return freqs
    s = args.rope_scaling
    return llama_scaled_frequencies(
        freqs,
        scaling_factor=s.scaling_factor,
        low_freq_factor=s.low_freq_factor,
        high_freq_factor=s.high_freq_factor,
        original_max_position_embeddings=s.original_max_position_embeddings,
    )


class Transformer(Decoder):
    def __init__(self, args: Llama4Args) -> None:
        dense_hidden = ffn_hidden_dim(
            args.dim, multiple_of=args.multiple_of, ffn_dim_multiplier=args.ffn_dim_multiplier
        )
        blocks = []
        for i in range(args.n_layers):
            nope = args.every_n_layers_nope is not None and (i + 1) % args.every_n_layers_nope == 0
            attention = Attention(
                args.dim, args.n_heads, args.n_kv_heads, attn_type=args.attn_type, use_rope=not nope
            )
            moe = (
                MoE(args.moe, dim=args.dim, hidden_dim=expert_hidden_dim(args))
                if moe_enabled(args, i)
                else None
            )
            ffn = FeedForward(args.dim, dense_hidden) if moe is None else None
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
            rope_freqs_fn=partial(_frequencies, args),
        )
        self.model_args = args


def build(args: Llama4Args) -> Transformer:
    return Transformer(args)
