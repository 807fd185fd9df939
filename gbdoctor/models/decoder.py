"""The decoder skeleton every built-in family shares: embeddings, a ``ModuleDict`` of blocks, final
norm, output projection, and a real-valued RoPE table.

Names follow torchtitan v0.2.2 (``tok_embeddings``, ``layers["0"]``, ``norm``, ``output``;
blocks with ``attention_norm``/``attention``/``ffn_norm`` and ``feed_forward`` or ``moe``) because
the parallelism and AC code address modules by these names and FQNs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

import torch
from torch import nn

from .attention import Attention, MLAttention, causal_block_mask, document_block_mask
from .common import FeedForward, RMSNorm, depth_init_std, rope_table, trunc_normal_
from .moe import MoE


class TransformerBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))`` then ``h + ffn_or_moe(norm(h))``."""

    def __init__(
        self,
        *,
        layer_id: int,
        dim: int,
        norm_eps: float,
        attention: Attention | MLAttention,
        feed_forward: FeedForward | None = None,
        moe: MoE | None = None,
    ) -> None:
        super().__init__()
        if (feed_forward is None) == (moe is None):
            raise ValueError("a TransformerBlock takes exactly one of feed_forward or moe")
        self.layer_id = layer_id
        self.moe_enabled = moe is not None
        self.attention_norm = RMSNorm(dim, eps=norm_eps)
        self.attention = attention
        self.ffn_norm = RMSNorm(dim, eps=norm_eps)
        if moe is not None:
            self.moe = moe
        elif feed_forward is not None:  # always, by the check above
            self.feed_forward = feed_forward
        self.weight_init_std = depth_init_std(layer_id)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, attention_masks=None) -> torch.Tensor:
        """``attention_masks``: a packed batch's document BlockMask (Flex), else None."""
        if attention_masks is None:
            h = x + self.attention(self.attention_norm(x), rope)
        else:
            h = x + self.attention(self.attention_norm(x), rope, attention_masks)
        if self.moe_enabled:
            return h + self.moe(self.ffn_norm(h))
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self) -> None:
        self.attention_norm.init_weights()
        self.ffn_norm.init_weights()
        self.attention.init_weights(self.weight_init_std)
        (self.moe if self.moe_enabled else self.feed_forward).init_weights(self.weight_init_std)


class _InitWeights(Protocol):
    def init_weights(self) -> None: ...


class Decoder(nn.Module):
    """Base for each family's ``Transformer``; a family supplies its blocks and a zero-argument
    ``rope_freqs_fn`` returning its RoPE inverse frequencies (fp32, ``rot_dim // 2``).

    ``rope_cache`` is a non-persistent ``(max_seq_len, rot_dim // 2, 2)`` cos/sin buffer. It is a
    buffer (not recomputed in forward) so that compiled blocks only see a tensor input, and it is
    rebuilt by ``init_weights`` so that ``to_empty()`` after a meta build restores it.
    """

    rope_cache: torch.Tensor  # a buffer (register_buffer), declared for mypy

    def __init__(
        self,
        *,
        vocab_size: int,
        dim: int,
        norm_eps: float,
        max_seq_len: int,
        attn_type: str,
        blocks: list[TransformerBlock],
        rope_freqs_fn: Callable[[], torch.Tensor],
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.dim = dim
        self.max_seq_len = max_seq_len
        self.attn_type = attn_type
        self.rope_freqs_fn = rope_freqs_fn
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleDict({str(i): block for i, block in enumerate(blocks)})
        self.norm = RMSNorm(dim, eps=norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        self.register_buffer("rope_cache", self._build_rope_cache(), persistent=False)
        self.init_weights()

    def _build_rope_cache(self) -> torch.Tensor:
        return rope_table(self.rope_freqs_fn(), self.max_seq_len)

    def init_weights(self, buffer_device: torch.device | str | None = None) -> None:
        """Deterministic given the caller's seed; a no-op on meta tensors (nothing is allocated)."""
        device = buffer_device if buffer_device is not None else self.rope_cache.device
        with torch.device(device):
            self.rope_cache = self._build_rope_cache()
        if any(p.is_meta for p in self.parameters()):
            return  # nothing to fill; meta kernels of the init ops are slow Python decompositions
        with torch.no_grad():
            if self.tok_embeddings is not None:
                nn.init.normal_(self.tok_embeddings.weight)
            for block in self.layers.values():
                # A TransformerBlock, or a wrapper of one (AC, compile) that forwards attributes.
                cast(_InitWeights, block).init_weights()
            if self.norm is not None:
                self.norm.init_weights()
            if self.output is not None:
                trunc_normal_(self.output.weight, self.dim**-0.5)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens[B, S]`` (or hidden states when a pipeline stage dropped ``tok_embeddings``) -> logits.

        ``positions[B, S]``: a packed batch's per-token positions, restarting at 0 at each document
        (torchtitan's ``positions``): RoPE reads them, and under Flex the blocks get the
        document-masked BlockMask built from them here (``attention.document_block_mask``)."""
        seqlen = tokens.shape[1]
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        longest = seqlen if positions is None else int(positions.max()) + 1
        if longest <= self.rope_cache.shape[0]:
            table = self.rope_cache[:longest]
        else:
            # Longer than the table (built for max_seq_len): extend on the fly rather than fail; the
            # buffer is left alone so that forward never mutates module state. No ``with
            # torch.device(...)`` here: Dynamo 2.13 cannot enter it (GB0142, whole frame skipped).
            table = rope_table(self.rope_freqs_fn().to(h.device), longest)
        masks = None
        if positions is None:
            rope = table
            if self.attn_type == "flex":
                # Build the BlockMask here, outside the (per-block) compiled regions; blocks read
                # the cache.
                causal_block_mask(seqlen, h.device)
        else:
            rope = table[positions]  # [B, S, D/2, 2]: each row's documents from position 0
            if self.attn_type == "flex":
                masks = document_block_mask(positions)
        for block in self.layers.values():
            h = block(h, rope) if masks is None else block(h, rope, masks)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h
