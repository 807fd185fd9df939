"""What a real scan holds at its peak, per rank, from a model built on the meta device (rule 3
of ``scan.estimate``), and the memory this machine has for it.

The model is built on the meta device (nothing allocated) and ``estimate_memory`` adds up, per
rank, what a real scan holds at its peak, times the local ranks:

- parameters: the whole model in its build dtype, because every rank materializes the full
  model before ``fully_shard`` shards it (as a real scan does);
- gradients and AdamW's two moments: one fp32 copy each of the rank's FSDP shard
  (``1 / dp_shard`` of the parameters);
- activations of one training step at the scan's shapes (``batch x seq`` tokens), every layer:
  for each linear-like weight the input and output it saves (``tokens x (in + out)``; stacked
  expert weights ``(E, in, out)`` see ``tokens x top_k``) and the embedding's output, times
  ``ACTIVATION_FACTOR`` for the elementwise intermediates a weight does not show, in the
  compute dtype (FSDP2's ``mixed_precision_param``, bf16 by default); plus the logits with
  their fp32 log-softmax and gradient, and one layer's attention scores and probabilities
  (``batch x heads x seq^2``, built-in flavors) for SDPA's math path;
- a fixed ``PROCESS_OVERHEAD`` per rank process (torch, Dynamo, the recorded captures).

Activation checkpointing is not credited (the eager warm-up and the captures recompute, and
the estimate must not under-count). The number is compared with ``SAFE_FRACTION`` of the
memory available (``MemAvailable`` of ``/proc/meminfo``, or the cgroup's limit when that is
lower; on CUDA each rank's free device memory). ``GBDOCTOR_AVAILABLE_MEMORY_GIB`` overrides
the available memory (tests, or to keep headroom on a shared machine).
"""

from __future__ import annotations

import os
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.records import MemoryEstimate, Spec

GiB = 1 << 30

PROCESS_OVERHEAD = int(0.75 * GiB)
"""Per rank process: torch and Dynamo imported, a scan's bookkeeping (measured peak RSS of a
debug-size scan at 2 x 64 tokens is about 0.6-0.7 GiB; see benchmarks/README.md)."""

ACTIVATION_FACTOR = 1.25
"""Elementwise intermediates (norms, activation functions, RoPE, residuals) on top of the saved
linear inputs and outputs. ``sum(in + out)`` over a block's linears is about the 5d + 5h
elements per token that a transformer block saves without recompute (Korthikanti et al. 2022);
calibrated in benchmarks/README.md against the peak RSS of real debug-size training steps."""

SAFE_FRACTION = 0.8
"""Share of the available memory a real scan may plan to use (the rest is headroom for the
allocator, the page cache and whatever else the machine runs)."""

AVAILABLE_ENV = "GBDOCTOR_AVAILABLE_MEMORY_GIB"

_FP32 = 4


def _cgroup_headroom() -> int | None:
    """Bytes the cgroup (v2) still lets this process tree use, when it has a limit."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
        return max(0, int(limit) - current)
    except (OSError, ValueError):
        return None


def available_memory(device: str = "cpu") -> int:
    """Bytes available to a real scan on ``device`` (per rank on CUDA; the host in total on CPU)."""
    override = os.environ.get(AVAILABLE_ENV)
    if override:
        try:
            value = float(override)
        except ValueError:
            raise SpecError(
                f"{AVAILABLE_ENV}={override!r} is not a number of GiB",
                hint=f"unset it, or write e.g. {AVAILABLE_ENV}=16",
            ) from None
        if not value > 0:
            raise SpecError(
                f"{AVAILABLE_ENV}={override!r} must be a positive number of GiB",
                hint=f"unset it, or write e.g. {AVAILABLE_ENV}=16",
            )
        return int(value * GiB)
    if device == "cuda":
        import torch

        return min(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:  # not Linux: total physical memory, if the OS tells
        try:
            available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            available = 0
    headroom = _cgroup_headroom()
    return min(available, headroom) if headroom is not None else available


def _heads(spec: Spec) -> int:
    """Attention heads of a built-in flavor; 0 when the spec does not say (custom models)."""
    from gbdoctor.models import model_facts

    return model_facts(spec.model).n_heads or 0


def experts_per_token(spec: Spec) -> int:
    """Experts each token is routed to (built-in MoE flavors); 1 when the spec does not say."""
    from gbdoctor.models import model_facts

    return max(1, model_facts(spec.model).top_k or 1)


def activation_bytes(model: Any, tokens: int, *, top_k: int = 1, compute_bytes: int = 2) -> int:
    """Bytes one training step saves at ``tokens`` tokens (see the module docstring).

    Works from parameter shapes alone, so a meta-built model (nothing allocated) is enough."""
    import torch.nn as nn

    total = 0
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            total += tokens * module.embedding_dim
            continue
        for param in module.parameters(recurse=False):
            if param.dim() == 2:
                total += tokens * sum(param.shape)
            elif param.dim() == 3:  # stacked expert weights: the routed tokens pass through
                total += tokens * top_k * (param.shape[1] + param.shape[2])
    total = int(total * ACTIVATION_FACTOR) * compute_bytes
    vocab = _vocab(model)
    if vocab:
        total += 3 * tokens * vocab * _FP32  # logits, their log-softmax, and its gradient
    return total


def _vocab(model: Any) -> int:
    import torch.nn as nn

    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return module.num_embeddings
    return 0


def estimate_memory(spec: Spec, model: Any, *, available: int) -> MemoryEstimate:
    """What a real scan of ``spec`` holds at its peak, from ``model`` built on meta."""
    p = spec.parallelism
    param_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    param_bytes += sum(t.numel() * t.element_size() for t in model.buffers())
    n_params = sum(t.numel() for t in model.parameters())
    shard = max(1, p.dp_shard)
    tokens = spec.capture_batch_size * spec.capture_seq_len
    compute_bytes = 2 if spec.training.mixed_precision_param == "bfloat16" else _FP32
    # One layer's attention scores and probabilities, where SDPA takes its math path (measured:
    # deepseek_v3 debug, whose q/k head dim differs from v's, peaks 6.15 GiB at 8 x 2048).
    scores = spec.capture_batch_size * _heads(spec) * spec.capture_seq_len**2 * 2 * compute_bytes
    return MemoryEstimate(
        params=param_bytes,
        grads=n_params * _FP32 // shard,
        optimizer=2 * n_params * _FP32 // shard,
        activations=activation_bytes(
            model,
            tokens,
            top_k=experts_per_token(spec),
            compute_bytes=compute_bytes,
        )
        + scores,
        overhead=PROCESS_OVERHEAD,
        local_ranks=p.world_size,
        available=available,
        safe_fraction=SAFE_FRACTION,
        tokens=tokens,
    )


def describe(estimate: MemoryEstimate) -> str:
    """``needs about 152.4 GiB (params 30.0, grads 30.0, AdamW 60.0, activations 32.1, ...)``."""
    g = lambda n: f"{n / GiB:.1f}"  # noqa: E731
    ranks = f" x {estimate.local_ranks} local ranks" if estimate.local_ranks > 1 else ""
    return (
        f"needs about {g(estimate.total)} GiB (per rank: params {g(estimate.params)}, grads "
        f"{g(estimate.grads)}, AdamW state {g(estimate.optimizer)}, activations "
        f"{g(estimate.activations)} at {estimate.tokens} tokens, process {g(estimate.overhead)}"
        f"{ranks}); {g(estimate.budget)} GiB of the {g(estimate.available)} GiB available may be used"
    )
