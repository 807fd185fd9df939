"""Building blocks shared by every built-in family: RMSNorm, the SwiGLU FeedForward, real-valued RoPE.

RoPE is kept real-valued (a ``(seq, rot_dim // 2, 2)`` cos/sin table) on purpose: complex buffers
combined with bf16 mixed precision and torch.compile are a source of breaks and dtype errors that
have nothing to do with what gbdoctor diagnoses. The pairing convention (adjacent pairs) matches
torchtitan's complex ``view_as_complex(x.reshape(..., -1, 2))`` formulation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02
"""Base std of the truncated-normal init (torchtitan's value)."""


def depth_init_std(layer_id: int) -> float:
    """Std for output projections: shrinks with depth so the residual stream stays bounded."""
    return INIT_STD / (2 * (layer_id + 1)) ** 0.5


_LO = 0.5 * (1 + math.erf(-3 / math.sqrt(2)))  # standard normal CDF at -3


@torch.no_grad()
def trunc_normal_(t: torch.Tensor, std: float) -> torch.Tensor:
    """Normal(0, std) truncated to +-3 std, by inverse CDF.

    Same distribution as ``nn.init.trunc_normal_(t, 0, std, -3std, 3std)``, but torch 2.13 implements
    that one by rejection resampling, about 5x slower on CPU: it dominated debug-model build time.
    """
    t.uniform_(2 * _LO - 1, 1 - 2 * _LO).erfinv_().mul_(std * math.sqrt(2)).clamp_(
        -3 * std, 3 * std
    )
    return t


def ffn_hidden_dim(
    dim: int, *, multiple_of: int, ffn_dim_multiplier: float | None, divisor: int = 1
) -> int:
    """The llama hidden-size rule: 2/3 of 4*dim, times the multiplier, divided (llama4 MoE
    auto-scaling), rounded up to ``multiple_of``. Kept separate from FeedForward because
    MoE shared experts and deepseek use explicit sizes."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    hidden = int(hidden / divisor)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 (as torchtitan's ``nn.RMSNorm`` use under bf16 autocast would)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).type_as(x)

    def init_weights(self) -> None:
        nn.init.ones_(self.weight)


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``. Takes the hidden size as given (see ``ffn_hidden_dim``)."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init_std: float) -> None:
        trunc_normal_(self.w1.weight, INIT_STD)
        for lin in (self.w2, self.w3):
            trunc_normal_(lin.weight, init_std)


# --------------------------------------------------------------------------- rope


def rope_frequencies(rot_dim: int, theta: float) -> torch.Tensor:
    """Plain RoPE inverse frequencies, ``rot_dim // 2`` of them."""
    return 1.0 / (
        theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float32)[: rot_dim // 2] / rot_dim)
    )


def llama_scaled_frequencies(
    freqs: torch.Tensor,
    *,
    scaling_factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> torch.Tensor:
    """Llama 3.1/4 frequency scaling: long wavelengths divided by the factor, short ones kept,
    a smooth blend in between. Elementwise on the table only, so it changes no graph."""
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / freqs
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / max(
        high_freq_factor - low_freq_factor, 1e-6
    )
    blended = (1 - smooth) * freqs / scaling_factor + smooth * freqs
    out = torch.where(wavelen > low_wavelen, freqs / scaling_factor, blended)
    return torch.where(wavelen < high_wavelen, freqs, out)


def yarn_frequencies(
    rot_dim: int,
    theta: float,
    *,
    max_seq_len: int,
    original_seq_len: int,
    rope_factor: float,
    beta_fast: int,
    beta_slow: int,
) -> torch.Tensor:
    """DeepSeek-V3's YaRN correction: applied only when the model is run past its original
    context length, as in the reference implementation."""
    freqs = rope_frequencies(rot_dim, theta)
    if max_seq_len <= original_seq_len:
        return freqs

    def correction_dim(num_rotations: float) -> float:
        return (
            rot_dim
            * math.log(original_seq_len / (num_rotations * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high: float = min(math.ceil(correction_dim(beta_slow)), rot_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rot_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    smooth = 1 - ramp
    return freqs / rope_factor * (1 - smooth) + freqs * smooth


def rope_table(freqs: torch.Tensor, max_seq_len: int) -> torch.Tensor:
    """``(max_seq_len, len(freqs), 2)`` fp32 table of (cos, sin)."""
    t = torch.arange(max_seq_len, dtype=torch.float32, device=freqs.device)
    angles = torch.outer(t, freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of ``x`` (``[B, S, H, D]``) by the ``[S, D // 2, 2]`` table, or by
    a per-row ``[B, S, D // 2, 2]`` one (packed rows: positions restart at each document)."""
    xf = x.float().reshape(*x.shape[:-1], -1, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    if rope.dim() == 4:
        cos, sin = rope[..., 0].unsqueeze(2), rope[..., 1].unsqueeze(2)
    else:
        cos = rope[..., 0].view(1, rope.shape[0], 1, rope.shape[1])
        sin = rope[..., 1].view(1, rope.shape[0], 1, rope.shape[1])
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)
