"""Token-choice top-k MoE, laid out like torchtitan v0.2.2's ``models/moe``.

The attribute names (``router.gate``, ``reorderer``, ``experts.w1/w2/w3``, ``shared_experts``, the
``expert_bias``/``tokens_per_expert`` buffers) are what the parallelism code (EP, FSDP, SAC's
``moe.router.gate`` rule, the load-balancing optimizer hook) addresses, so they are kept exactly.

Choices made to stay compile-clean on torch 2.13 (probe notes, section 4):
- Token counts come from ``torch.histc`` (static output shape), never ``bincount`` (data-dependent
  shape: a graph break).
- ``torch._grouped_mm`` runs in bf16: its meta kernel rejects fp32, which under compile is a hard
  error rather than a break.
- The for-loop expert path needs ``.tolist()`` (a data-dependent break unless
  ``capture_scalar_outputs`` is on); it exists for devices without grouped mm and for comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .common import INIT_STD, FeedForward, trunc_normal_

try:  # DTensor needs torch.distributed, which some builds lack
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - distributed-less builds
    DTensor = None  # type: ignore[assignment,misc]

SCORE_FUNCS = ("sigmoid", "softmax")


@dataclass(frozen=True, kw_only=True, slots=True)
class MoEArgs:
    """torchtitan v0.2.2 ``MoEArgs`` defaults."""

    num_experts: int = 8
    num_shared_experts: int = 1
    score_func: str = "sigmoid"
    route_norm: bool = False
    route_scale: float = 1.0
    score_before_experts: bool = True
    top_k: int = 1
    num_expert_groups: int | None = None
    """Node-limited routing groups (deepseek 671B). Recorded but not applied: group masking changes
    which experts are chosen, not the graph around the ``topk``."""
    num_limited_groups: int | None = None
    use_grouped_mm: bool | None = None
    """None: decided at build time by ``grouped_mm_supported`` for the build device."""
    load_balance_coeff: float | None = 1e-3
    """Aux-loss-free balancing step size; None removes the ``expert_bias``/``tokens_per_expert`` buffers."""


def grouped_mm_supported(device: torch.device | str | None = None) -> bool:
    """Whether ``torch._grouped_mm`` can run on ``device`` (default: the current default device).

    CPU (and meta, which only needs the meta kernel) have it whenever torch exports it; CUDA needs
    SM90+ as torchtitan's ``update_from_config`` assumes.
    """
    if not hasattr(torch, "_grouped_mm"):
        return False
    device = torch.device(device) if device is not None else torch.get_default_device()
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (9, 0)
    return device.type in ("cpu", "meta")


def _local(t: torch.Tensor) -> torch.Tensor:
    """Under expert parallelism the weights are DTensors sharded on the expert dim; the experts
    module only ever sees its local tokens, so it computes with the local shard."""
    if DTensor is not None and isinstance(t, DTensor):
        return t.to_local()
    return t


def _run_experts_grouped_mm(
    w1, w2, w3, x: torch.Tensor, num_tokens_per_expert: torch.Tensor
) -> torch.Tensor:
    offs = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
    xb = x.bfloat16()
    h = F.silu(torch._grouped_mm(xb, w1.bfloat16().transpose(-2, -1), offs=offs))
    h = h * torch._grouped_mm(xb, w3.bfloat16().transpose(-2, -1), offs=offs)
    return torch._grouped_mm(h, w2.bfloat16().transpose(-2, -1), offs=offs).type_as(x)


def _run_experts_for_loop(
    w1, w2, w3, x: torch.Tensor, num_tokens_per_expert: torch.Tensor
) -> torch.Tensor:
    counts = (
        num_tokens_per_expert.int().tolist()
    )  # device sync; a data-dependent break under compile
    num_routed = sum(counts)
    outs = []
    for i, xe in enumerate(torch.split(x[:num_routed], counts, dim=0)):
        h = F.silu(xe @ w1[i].transpose(-2, -1)) * (xe @ w3[i].transpose(-2, -1))
        outs.append(h @ w2[i].transpose(-2, -1))
    # Rows past the routed ones (EP padding) produce zeros. Unconditional: an ``if`` on the count
    # would be a data-dependent guard (a break even with capture_scalar_outputs).
    out = torch.cat(outs, dim=0)
    return torch.cat((out, out.new_zeros(x.shape[0] - num_routed, out.shape[-1])), dim=0)


class GroupedExperts(nn.Module):
    """All experts' SwiGLU weights stacked: ``w1, w3: (E, H, D)``, ``w2: (E, D, H)``.

    ``forward(x[T, D], num_tokens_per_expert[E_local])`` expects ``x`` sorted by expert. The expert
    count is that of the *local* weights, so the same code runs unsharded and under EP.
    """

    def __init__(
        self, dim: int, hidden_dim: int, num_experts: int, *, use_grouped_mm: bool
    ) -> None:
        super().__init__()
        self.num_experts = num_experts  # global count; forward goes by the (local) weights' shape
        self.use_grouped_mm = use_grouped_mm
        # The kernel as an attribute, named in ``compiled_kernels``, so that a compile strategy
        # can compile it on its own the way torchtitan v0.2.2 compiles its module-level
        # ``_run_experts_grouped_mm`` (setup/compile.py, ``compile_kernels``).
        self.run_grouped_mm = _run_experts_grouped_mm
        self.compiled_kernels = ("run_grouped_mm",) if use_grouped_mm else ()
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = _local(self.w1), _local(self.w2), _local(self.w3)
        if self.use_grouped_mm:
            return self.run_grouped_mm(w1, w2, w3, x, num_tokens_per_expert)
        return _run_experts_for_loop(w1, w2, w3, x, num_tokens_per_expert)

    def init_weights(self, init_std: float) -> None:
        trunc_normal_(self.w1, INIT_STD)
        trunc_normal_(self.w2, init_std)
        trunc_normal_(self.w3, init_std)


class TokenChoiceTopKRouter(nn.Module):
    """Scores every token against every expert (fp32), picks ``top_k`` by the *biased* scores and
    gates with the *unbiased* ones (aux-loss-free load balancing)."""

    def __init__(
        self,
        dim: int,
        num_experts: int,
        *,
        top_k: int,
        score_func: str,
        route_norm: bool,
        route_scale: float,
    ) -> None:
        super().__init__()
        if score_func not in SCORE_FUNCS:
            raise ValueError(f"score_func must be one of {SCORE_FUNCS}, got {score_func!r}")
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.num_experts = num_experts
        self.top_k = top_k
        self.score_func = score_func
        self.route_norm = route_norm
        self.route_scale = route_scale

    def forward(
        self, x: torch.Tensor, expert_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x[T, D] -> (top_scores[T, k] fp32, selected_experts_indices[T, k])``."""
        scores = self.gate(x).float()
        scores = torch.sigmoid(scores) if self.score_func == "sigmoid" else F.softmax(scores, dim=1)
        scores_for_choice = scores if expert_bias is None else scores + expert_bias
        _, selected = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)
        top_scores = scores.gather(dim=1, index=selected)
        if self.route_norm:
            top_scores = top_scores / (top_scores.sum(dim=-1, keepdim=True) + 1e-20)
        return top_scores * self.route_scale, selected

    def init_weights(self, init_std: float) -> None:
        trunc_normal_(self.gate.weight, init_std)


class TokenReorderer(nn.Module):
    """Sorts the ``T * top_k`` (token, expert) pairs by expert and counts tokens per expert."""

    def __init__(self, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k

    def forward(self, top_scores: torch.Tensor, selected_experts_indices: torch.Tensor):
        """Returns ``(top_scores_sorted[T*k], pair_indices_sorted[T*k], num_tokens_per_expert[E] fp32)``;
        ``pair_indices_sorted // top_k`` is the source token of each sorted pair."""
        flat = selected_experts_indices.view(-1)
        num_tokens_per_expert = torch.histc(
            flat.float(), bins=self.num_experts, min=0, max=self.num_experts
        )
        order = torch.argsort(flat, stable=True)
        return top_scores.view(-1)[order], order, num_tokens_per_expert


class MoE(nn.Module):
    """Router -> reorder -> grouped experts (+ shared experts) -> combine."""

    # Buffers (register_buffer), declared so that mypy does not read them as submodules.
    expert_bias: torch.Tensor | None
    tokens_per_expert: torch.Tensor | None

    def __init__(self, args: MoEArgs, *, dim: int, hidden_dim: int) -> None:
        super().__init__()
        use_grouped_mm = (
            args.use_grouped_mm if args.use_grouped_mm is not None else grouped_mm_supported()
        )
        self.num_experts = args.num_experts
        self.top_k = args.top_k
        self.score_before_experts = args.score_before_experts
        self.load_balance_coeff = args.load_balance_coeff
        self.router = TokenChoiceTopKRouter(
            dim,
            args.num_experts,
            top_k=args.top_k,
            score_func=args.score_func,
            route_norm=args.route_norm,
            route_scale=args.route_scale,
        )
        self.reorderer = TokenReorderer(args.num_experts, args.top_k)
        self.experts = GroupedExperts(
            dim, hidden_dim, args.num_experts, use_grouped_mm=use_grouped_mm
        )
        self.shared_experts = (
            FeedForward(dim, hidden_dim * args.num_shared_experts)
            if args.num_shared_experts > 0
            else None
        )
        # tokens_per_expert is accumulated here, in forward; expert_bias is updated outside the model
        # (an optimizer step pre-hook) so that gradient accumulation sees one update per step.
        if self.load_balance_coeff is not None:
            self.register_buffer(
                "expert_bias", torch.zeros(args.num_experts, dtype=torch.float32), persistent=True
            )
            self.register_buffer(
                "tokens_per_expert",
                torch.zeros(args.num_experts, dtype=torch.float32),
                persistent=False,
            )
        else:
            self.register_buffer("expert_bias", None)
            self.register_buffer("tokens_per_expert", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, slen, dim = x.shape
        x = x.reshape(-1, dim)
        top_scores, selected = self.router(x, self.expert_bias)
        top_scores_sorted, pair_indices_sorted, num_tokens_per_expert = self.reorderer(
            top_scores, selected
        )
        if self.tokens_per_expert is not None:
            # In-place, in forward, as torchtitan does: under eager AC the recompute counts twice.
            with torch.no_grad():
                self.tokens_per_expert.add_(num_tokens_per_expert)

        routed_input = x[pair_indices_sorted // self.top_k]
        if self.score_before_experts:
            routed_input = (routed_input.float() * top_scores_sorted.reshape(-1, 1)).to(x.dtype)
        routed_output = self.experts(routed_input, num_tokens_per_expert)

        # Shared experts before the combine (torchtitan overlaps them with the EP combine a2a).
        shared = self.shared_experts(x) if self.shared_experts is not None else None

        unsorted = torch.zeros(
            (bs * slen * self.top_k, dim), dtype=routed_output.dtype, device=routed_output.device
        )
        unsorted[pair_indices_sorted] = routed_output
        unsorted = unsorted.reshape(-1, self.top_k, dim)
        if self.score_before_experts:
            out = unsorted.sum(dim=1)
        else:
            out = (
                torch.bmm(top_scores.reshape(-1, 1, self.top_k), unsorted.float())
                .to(x.dtype)
                .squeeze(1)
            )
        if shared is not None:
            out = out + shared
        return out.reshape(bs, slen, dim)

    def init_weights(self, init_std: float) -> None:
        self.router.init_weights(init_std)
        self.experts.init_weights(init_std)
        if self.shared_experts is not None:
            self.shared_experts.init_weights(init_std)
        with torch.no_grad():
            if self.expert_bias is not None:
                self.expert_bias.zero_()
            if self.tokens_per_expert is not None:
                self.tokens_per_expert.zero_()
