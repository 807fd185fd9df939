"""Rule 5 of ``scan.estimate``: the shape a real CPU scan captures at.

A real scan on CPU at the training shape whose compute would take minutes (bf16 matmuls on a
CPU without bf16 instructions run about 100x slower than fp32; measured on this project's
2-core machine: 0.4 vs 34 GFLOP/s) captures at a smaller shape instead, when the spec does
not set ``[gbdoctor] batch_size`` / ``seq_len``: ``capture_shape`` estimates the FLOPs of one
training step from the parameter shapes and the CPU's assumed rate in the compute dtype,
and halves the batch (to 1), then the sequence (down to ``MIN_CAPTURE_SEQ``, keeping it
divisible by the TP degree) until the scan's compute fits ``CAPTURE_TIME_BUDGET_S``. Graph
breaks do not depend on these sizes; the report's notice says what was captured and how to
capture at the training shape. Simulated scans (fake tensors) keep the training shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gbdoctor.records import Spec
from gbdoctor.scan.memory_estimate import experts_per_token

CAPTURE_TIME_BUDGET_S = 30.0
"""Compute a real CPU scan may spend (all ranks share the machine's cores); beyond it the
capture shape shrinks (rule 5)."""

SCAN_STEP_EQUIVALENTS = 3
"""A scan's compute in training steps of the whole model: the eager warm-up step, and per block
kind a traced forward and a compiled forward + backward (about two more steps for a model whose
kinds are a fraction of its depth; conservative when every layer is its own kind)."""

MIN_CAPTURE_SEQ = 64
"""The shortest sequence rule 5 shrinks to (the repository's debug specs capture at 2 x 64)."""


def step_flops(spec: Spec, model: Any, batch: int, seq: int) -> float:
    """FLOPs of one training step (forward + backward, 3x the forward) at ``batch x seq`` tokens
    per rank, from parameter shapes: 2 per weight element and token for matmul-like weights
    (stacked expert weights see ``top_k / experts`` of the tokens each), plus attention's two
    ``seq x seq`` products per layer at the embedding width. Embeddings are lookups (free)."""
    return _flops_model(spec, model)(batch, seq)


def _flops_model(spec: Spec, model: Any) -> Callable[[int, int], float]:
    """:func:`step_flops` as a function of ``(batch, seq)``, the walk over the model done once."""
    import torch.nn as nn

    from gbdoctor.models import block_container
    from gbdoctor.models.structure import hidden_size

    top_k = experts_per_token(spec)
    per_token = 0.0
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            continue
        for param in module.parameters(recurse=False):
            if param.dim() == 2:
                per_token += 2 * param.numel()
            elif param.dim() == 3:  # (experts, in, out): each token visits top_k experts
                per_token += 2 * param.numel() * top_k / param.shape[0]
    try:
        layers = len(block_container(model))
    except Exception:  # noqa: BLE001 - no repeated-block container found: no attention term
        layers = 0
    width = hidden_size(model) or 0

    def flops(batch: int, seq: int) -> float:
        attention = 4 * batch * seq * seq * width * layers
        return 3 * (batch * seq * per_token + attention)

    return flops


CPU_FLOPS = {"float32": 20e9, "bfloat16": 0.5e9}
"""FLOP/s of CPU matmuls assumed by rule 5, per compute dtype. Fixed, not probed, so the same
spec captures at the same shape on every machine (the same scan gives the same JSON). Measured
on this project's 2-core AMD EPYC machine (no AVX512-BF16/AMX; torch 2.13): a 4096x1024x1024
matmul runs at 34 GFLOP/s in fp32 and 0.4 GFLOP/s in bf16. A CPU with native bf16 is faster:
it then captures at a smaller shape than it needed to, never a slower one."""


def capture_shape(spec: Spec, model: Any) -> tuple[tuple[int, int], str] | None:
    """Rule 5: a smaller CPU capture shape and the notice saying so, when the training shape
    would be too slow to capture; None keeps the training shape."""
    from gbdoctor.setup.dist import resolve_device

    g = spec.gbdoctor
    if g.batch_size or g.seq_len or resolve_device(g.device) != "cpu":
        return None  # the user chose the shape, or accelerators: the training shape
    dtype = "bfloat16" if spec.training.mixed_precision_param == "bfloat16" else "float32"
    # Local ranks share the cores: the machine does world x the per-rank work.
    seconds_per_flop = spec.parallelism.world_size * SCAN_STEP_EQUIVALENTS / CPU_FLOPS[dtype]
    batch, seq = spec.capture_batch_size, spec.capture_seq_len
    tp = spec.parallelism.tensor_parallel_degree
    flops = _flops_model(spec, model)

    def too_slow(b: int, s: int) -> bool:
        return flops(b, s) * seconds_per_flop > CAPTURE_TIME_BUDGET_S

    if not too_slow(batch, seq):
        return None
    while too_slow(batch, seq) and (
        batch > 1 or (seq // 2 >= MIN_CAPTURE_SEQ and (seq // 2) % tp == 0 and seq % 2 == 0)
    ):
        if batch > 1:
            batch //= 2
        else:
            seq //= 2
    training = f"{spec.capture_batch_size} x {spec.capture_seq_len}"
    notice = (
        f"notice: captured at batch {batch} x seq {seq} instead of the training shape {training}: "
        f"the {dtype} compute of a scan at that shape would exceed the "
        f"{CAPTURE_TIME_BUDGET_S:.0f} s budget for a CPU scan, and graph breaks do "
        "not depend on these sizes; pass --set gbdoctor.batch_size="
        f"{spec.capture_batch_size} --set gbdoctor.seq_len={spec.capture_seq_len} to capture at "
        "the training shape"
    )
    return (batch, seq), notice
