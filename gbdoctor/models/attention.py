"""Attention modules: llama-style GQA attention and DeepSeek-V3 multi-head latent attention (MLA).

Both run SDPA with ``is_causal=True`` or FlexAttention (``attn_type="flex"``). A plain row's Flex
mask is causal (one cached BlockMask per length). A packed row (a shape stream's ``docs``) is
what torchtitan feeds: ``positions`` that restart at 0 at each document (RoPE reads them) and,
for Flex, a document-masked causal BlockMask built from them per batch, outside the compiled
blocks, and passed to every block as an argument (torchtitan's ``get_attention_masks``:
``and_masks(causal, same document)`` with ``B`` = the batch). SDPA stays causal across the
documents of a row, as torchtitan's maskless SDPA does (it "relies on is_causal"); only RoPE
restarts. llama4's chunked attention is approximated by the causal mask.

Torch 2.13 CPU facts this file is shaped by (see the probe notes, section 6):
- FlexAttention refuses CPU inputs that require grad (``NotImplementedError``), though its math
  implementation differentiates on CPU under ``eager``/``aot_eager``: ``flex_cpu_backward``
  lifts the check where a timeline trains (forward and backward of a compiled block).
- Inductor's CPU flex template rejects q/k/v that are ``view().transpose()`` results of a linear;
  hence the ``.contiguous()`` calls before ``flex_attention``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention

from .common import INIT_STD, RMSNorm, apply_rope, trunc_normal_

ATTN_TYPES = ("sdpa", "flex")

_BLOCK_MASKS: dict[tuple[int, str], object] = {}
"""Causal BlockMasks by (seq_len, device). Built once, outside any compiled region when the model's
forward runs first (``Transformer.forward`` calls ``causal_block_mask`` before its layers), so that
a compiled block only reads a cached object instead of tracing ``create_block_mask``."""


def causal_block_mask(seq_len: int, device: torch.device | str):
    key = (int(seq_len), str(device))
    mask = _BLOCK_MASKS.get(key)
    if mask is None:

        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

        mask = create_block_mask(
            causal, B=None, H=None, Q_LEN=seq_len, KV_LEN=seq_len, device=device
        )
        _BLOCK_MASKS[key] = mask
    return mask


def document_positions(
    docs: tuple[tuple[int, ...], ...], device: torch.device | str
) -> torch.Tensor:
    """``[B, S]`` int64 positions of packed rows: 0, 1, ... restarting at each document
    (torchtitan's ``positions``, Hugging Face's ``position_ids``); ``docs`` holds per row the
    lengths of its documents."""
    rows = [torch.cat([torch.arange(n) for n in row]) for row in docs]
    return torch.stack(rows).to(device)


def document_block_mask(positions: torch.Tensor):
    """The BlockMask of packed rows: causal within each document, nothing across documents.

    torchtitan's Flex path (``Decoder.get_attention_masks``): document ids are the running count
    of position resets, read by the mask function per (batch row, query, key). A new BlockMask
    (and a new mask function closing over new tensors) each batch, as in training."""
    doc_ids = torch.cumsum((positions == 0).int(), dim=1) - 1

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def same_document(b, h, q_idx, kv_idx):
        return doc_ids[b, q_idx] == doc_ids[b, kv_idx]

    batch, seq_len = positions.shape
    return create_block_mask(
        and_masks(causal, same_document),
        B=batch,
        H=None,
        Q_LEN=seq_len,
        KV_LEN=seq_len,
        device=positions.device,
    )


@contextlib.contextmanager
def flex_cpu_backward(device: str) -> Iterator[None]:
    """On CPU, FlexAttention with inputs that require grad, for the block.

    torch 2.13's ``flex_attention`` refuses such inputs up front (``_validate_device``), yet
    the math implementation underneath runs forward and backward on CPU: inside a block
    compiled with ``eager``/``aot_eager`` it is traced into the block's graph and differentiated
    there (inductor's CPU flex lowering has no backward: training still fails there, at the
    step, saying so). The check passes silently on CUDA, so lifting it for CPU traces the code
    a GPU run traces. A no-op off CPU."""
    import torch.nn.attention.flex_attention as flex

    if device != "cpu":
        yield
        return
    original = flex._validate_device

    def validate(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type != "cpu":
            original(query, key, value)

    flex._validate_device = validate
    try:
        yield
    finally:
        flex._validate_device = original


def _attend(q, k, v, *, attn_type: str, scale: float | None, block_mask=None) -> torch.Tensor:
    """q/k/v are ``[B, H, S, D]``; returns ``[B, H, S, Dv]``. ``block_mask``: a packed batch's
    document mask (Flex only; None: causal)."""
    if attn_type == "flex":
        mask = causal_block_mask(q.shape[2], q.device) if block_mask is None else block_mask
        return flex_attention(
            q.contiguous(), k.contiguous(), v.contiguous(), block_mask=mask, scale=scale
        )
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[B, S, Hkv, D] -> [B, S, Hkv * n_rep, D]`` (GQA), as an expand + reshape."""
    if n_rep == 1:
        return x
    b, s, h, d = x.shape
    return x[:, :, :, None, :].expand(b, s, h, n_rep, d).reshape(b, s, h * n_rep, d)


class Attention(nn.Module):
    """Llama-style attention with grouped-query heads (``n_kv_heads``) and optional RoPE
    (llama4 iRoPE "NoPE" layers pass ``use_rope=False``)."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        attn_type: str = "sdpa",
        use_rope: bool = True,
    ) -> None:
        super().__init__()
        if attn_type not in ATTN_TYPES:
            raise ValueError(f"attn_type must be one of {ATTN_TYPES}, got {attn_type!r}")
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.n_rep = n_heads // self.n_kv_heads
        self.head_dim = dim // n_heads
        self.attn_type = attn_type
        self.use_rope = use_rope
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, attention_masks=None) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        # -1, not n_heads: under tensor parallelism each rank holds its share of the heads.
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        if self.use_rope:
            xq, xk = apply_rope(xq, rope), apply_rope(xk, rope)
        xk, xv = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
        out = _attend(
            xq.transpose(1, 2),
            xk.transpose(1, 2),
            xv.transpose(1, 2),
            attn_type=self.attn_type,
            scale=None,
            block_mask=attention_masks,
        )
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))

    def init_weights(self, init_std: float) -> None:
        for lin in (self.wq, self.wk, self.wv):
            trunc_normal_(lin.weight, INIT_STD)
        trunc_normal_(self.wo.weight, init_std)


class InnerAttention(nn.Module):
    """The attention kernel as a module of its own (torchtitan's ``inner_attention``): tensor
    parallelism turns its head-sharded DTensor inputs back into plain tensors at this boundary."""

    def __init__(self, attn_type: str, scale: float | None) -> None:
        super().__init__()
        self.attn_type = attn_type
        self.scale = scale

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask=None
    ) -> torch.Tensor:
        return _attend(q, k, v, attn_type=self.attn_type, scale=self.scale, block_mask=block_mask)


class MLAttention(nn.Module):
    """DeepSeek-V3 multi-head latent attention, faithful in parameter shapes.

    Queries come from ``wq`` (or the low-rank ``wq_a -> q_norm -> wq_b`` path when
    ``q_lora_rank > 0``); keys/values from the compressed ``wkv_a -> kv_norm -> wkv_b`` path plus
    a single shared rotary key head. The inference-time absorbed form is not implemented
    (training never uses it).
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        *,
        q_lora_rank: int,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        softmax_scale: float,
        norm_eps: float = 1e-5,
        attn_type: str = "sdpa",
    ) -> None:
        super().__init__()
        if attn_type not in ATTN_TYPES:
            raise ValueError(f"attn_type must be one of {ATTN_TYPES}, got {attn_type!r}")
        self.n_heads = n_heads
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.softmax_scale = softmax_scale
        self.attn_type = attn_type
        if q_lora_rank == 0:
            self.wq = nn.Linear(dim, n_heads * self.qk_head_dim, bias=False)
        else:
            self.wq_a = nn.Linear(dim, q_lora_rank, bias=False)
            self.q_norm = RMSNorm(q_lora_rank, eps=norm_eps)
            self.wq_b = nn.Linear(q_lora_rank, n_heads * self.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(dim, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(kv_lora_rank, eps=norm_eps)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_head_dim, dim, bias=False)
        self.inner_attention = InnerAttention(attn_type, softmax_scale)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, attention_masks=None) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        q = self.wq(x) if self.q_lora_rank == 0 else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(bs, seqlen, self.n_heads, self.qk_head_dim)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_pe, rope)], dim=-1)

        kv = self.wkv_a(x)
        kv, k_pe = torch.split(kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = apply_rope(k_pe.unsqueeze(2), rope)  # one rotary key head shared by all heads
        kv = self.wkv_b(self.kv_norm(kv)).view(
            bs, seqlen, self.n_heads, self.qk_nope_head_dim + self.v_head_dim
        )
        k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, self.n_heads, -1)], dim=-1)

        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        # Called as before when unpacked: tensor parallelism's input hooks see q, k, v only.
        out = (
            self.inner_attention(q, k, v)
            if attention_masks is None
            else self.inner_attention(q, k, v, attention_masks)
        )
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))

    def init_weights(self, init_std: float) -> None:
        linears = [self.wkv_a, self.wkv_b]
        linears += [self.wq] if self.q_lora_rank == 0 else [self.wq_a, self.wq_b]
        for lin in linears:
            trunc_normal_(lin.weight, INIT_STD)
        trunc_normal_(self.wo.weight, init_std)
        self.kv_norm.init_weights()
        if self.q_lora_rank > 0:
            self.q_norm.init_weights()


def mla_softmax_scale(
    qk_head_dim: int, *, max_seq_len: int, original_seq_len: int, rope_factor: float, mscale: float
) -> float:
    """``1/sqrt(d)``, times ``mscale**2`` when YaRN is active (run past the original context)."""
    scale = qk_head_dim**-0.5
    if max_seq_len > original_seq_len:
        m = 0.1 * mscale * math.log(rope_factor) + 1.0
        scale = scale * m * m
    return scale
