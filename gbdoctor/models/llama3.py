"""Llama 3 (dense), with torchtitan v0.2.2's flavors.

``vocab_size`` is fixed per flavor here; torchtitan takes it from the tokenizer, which gbdoctor does
not load (the graph does not depend on it beyond the embedding/output shapes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from .attention import Attention
from .common import FeedForward, ffn_hidden_dim, rope_frequencies
from .decoder import Decoder, TransformerBlock


@dataclass(frozen=True, kw_only=True, slots=True)
class Llama3Args:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None
    vocab_size: int = 128256
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 4096
    """Length of the RoPE table; torchtitan overrides it with ``training.seq_len``."""
    attn_type: str = "sdpa"
    attn_mask_type: str = "causal"
    """``block_causal`` is accepted and run as causal (see ``attention.py``)."""


# Variants are ``replace``d from a base (not ``**`` of a dict) so that mypy checks every field.
_DEBUG = Llama3Args(dim=256, n_layers=6, n_heads=16, vocab_size=2048, rope_theta=500000.0)

FLAVORS: dict[str, Llama3Args] = {
    "debugmodel": _DEBUG,
    "debugmodel_flex_attn": replace(_DEBUG, attn_type="flex", attn_mask_type="block_causal"),
    "8B": Llama3Args(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim_multiplier=1.3,
        multiple_of=1024,
        rope_theta=500000.0,
    ),
    "70B": Llama3Args(
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        ffn_dim_multiplier=1.3,
        multiple_of=4096,
        rope_theta=500000.0,
    ),
    "405B": Llama3Args(
        dim=16384,
        n_layers=126,
        n_heads=128,
        n_kv_heads=8,
        ffn_dim_multiplier=1.2,
        multiple_of=4096,
        rope_theta=500000.0,
    ),
}


class Transformer(Decoder):
    def __init__(self, args: Llama3Args) -> None:
        hidden = ffn_hidden_dim(
            args.dim, multiple_of=args.multiple_of, ffn_dim_multiplier=args.ffn_dim_multiplier
        )
        blocks = [
            TransformerBlock(
                layer_id=i,
                dim=args.dim,
                norm_eps=args.norm_eps,
                attention=Attention(
                    args.dim, args.n_heads, args.n_kv_heads, attn_type=args.attn_type
                ),
                feed_forward=FeedForward(args.dim, hidden),
            )
            for i in range(args.n_layers)
        ]
        super().__init__(
            vocab_size=args.vocab_size,
            dim=args.dim,
            norm_eps=args.norm_eps,
            max_seq_len=args.max_seq_len,
            attn_type=args.attn_type,
            blocks=blocks,
            rope_freqs_fn=partial(rope_frequencies, args.dim // args.n_heads, args.rope_theta),
        )
        self.model_args = args


def build(args: Llama3Args) -> Transformer:
    return Transformer(args)
