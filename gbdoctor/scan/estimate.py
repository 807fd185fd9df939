"""Decide before materializing: real local ranks, or a simulation, for every command that builds a model.

One rule (``decide``), used by ``scan``, ``inspect``, ``plan`` and ``gate``; ``run`` trains for real
and calls ``require_real`` instead, which refuses (exit 2) where ``decide`` would simulate:

1. ``--simulate`` / ``[gbdoctor] simulate = true``: simulated, as asked.
2. A world larger than the ranks this machine runs locally (``local_world_limit``): simulated.
3. The memory a real scan needs on this machine does not fit in the memory available: simulated.
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

4. FlexAttention flavors cannot be simulated: FlexAttention has no CPU backward, and simulation
   runs fake CPU tensors. A spec that would be simulated with one is refused with exit 2 naming
   the flavor and the ways around it.

5. A real scan on CPU at the training shape whose compute would take minutes (bf16 matmuls on a
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

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.records import Decision, MemoryEstimate, Spec

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


# ------------------------------------------------------------------------------ local limits


def local_world_limit() -> int:
    """Most ranks a real scan spawns on this machine: two per CPU core.

    Every local rank holds a full copy of the model and runs its own Dynamo; past about two per
    core a CPU machine thrashes, and a production world (64, 256 ranks) could not run at all.
    """
    from gbdoctor.setup import launched

    session = launched.current()
    if session is not None:
        return session.world_size  # a launcher's ranks are real, wherever they run
    return max(2, 2 * (os.cpu_count() or 1))


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


# ------------------------------------------------------------------------------ estimate


def _heads(spec: Spec) -> int:
    """Attention heads of a built-in flavor; 0 when the spec does not say (custom models)."""
    from gbdoctor.models import flavor_args

    try:
        return int(getattr(flavor_args(spec.model.name, spec.model.flavor), "n_heads", 0) or 0)
    except Exception:  # noqa: BLE001 - custom models: not known from the spec
        return 0


def _top_k(spec: Spec) -> int:
    """Experts each token is routed to (built-in MoE flavors); 1 when the spec does not say."""
    from gbdoctor.models import flavor_args

    try:
        return max(1, int(flavor_args(spec.model.name, spec.model.flavor).moe.top_k))
    except Exception:  # noqa: BLE001 - dense and custom models: not known from the spec
        return 1


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
            top_k=_top_k(spec),
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


# ------------------------------------------------------------------------------ the rule


def flex_flavor(spec: Spec) -> bool:
    """Whether a built-in flavor uses FlexAttention (custom models: not known before running)."""
    from gbdoctor.models import flavor_args

    try:
        return (
            getattr(flavor_args(spec.model.name, spec.model.flavor), "attn_type", "sdpa") == "flex"
        )
    except Exception:  # noqa: BLE001 - custom models
        return False


def _refuse_flex(spec: Spec, reason: str) -> None:
    why = "simulation was requested" if reason == "requested" else reason
    raise SpecError(
        f"{spec.model.name} flavor '{spec.model.flavor}' uses FlexAttention, which has no CPU "
        f"backward, so it cannot be simulated on fake CPU tensors ({why})",
        hint=f"scan it for real on a CUDA machine, or at a size that fits (e.g. --set model.flavor="
        f"{_sdpa_twin(spec)} for the same setup with SDPA attention)",
    )


def _sdpa_twin(spec: Spec) -> str:
    from gbdoctor.models import family_flavors

    for suffix in ("_flex_attn", "_irope"):
        base = spec.model.flavor.removesuffix(suffix)
        if base != spec.model.flavor and base in family_flavors(spec.model.name):
            return base
    return "debugmodel"


def decide(spec: Spec, *, model: Any = None, available: int | None = None) -> Decision:
    """Real local ranks or a simulation for ``spec`` (the module docstring's rule).

    ``model``: the spec's model built on meta (built here when not given). ``available``: bytes
    available (read from the machine when not given; tests inject it)."""
    if spec.gbdoctor.simulate:
        decision = Decision(simulate=True, reason="requested")
    else:
        world, limit = spec.parallelism.world_size, local_world_limit()
        if world > limit:
            decision = Decision(
                simulate=True,
                reason=(
                    f"world size {world} exceeds the {limit} ranks this machine runs locally "
                    f"(2 per CPU core), so the scan was simulated automatically"
                ),
            )
        else:
            if model is None:
                model = _meta_model(spec)
            # Memory is estimated at the shape a real scan would capture (rule 5); a simulation
            # computes nothing and keeps the training shape.
            shaped = capture_shape(spec, model)
            shape, notice = shaped if shaped else (None, None)
            decision = _memory_decision(
                pin(spec, Decision(simulate=False, capture_shape=shape)), model, available
            )
            if not decision.simulate:
                decision = replace(decision, capture_shape=shape, notice=notice)
            elif shape is not None:
                # Too large even at the smaller shape: the notice gives the estimate at the
                # training shape, which the simulation keeps.
                decision = _memory_decision(spec, model, available)
    if decision.simulate and flex_flavor(spec):
        _refuse_flex(spec, decision.reason or "")
    return decision


def _meta_model(spec: Spec) -> Any:
    from gbdoctor.frameworks.registry import framework_for
    from gbdoctor.models import build_model

    # A framework that builds its own models (the installed torchtitan) builds them on meta too.
    own = getattr(framework_for(spec), "meta_model", None)
    if own is not None:
        return own(spec)
    return build_model(spec.model, device="meta", max_seq_len=spec.training.seq_len)


def _memory_decision(spec: Spec, model: Any, available: int | None) -> Decision:
    from gbdoctor.setup.dist import resolve_device

    device = resolve_device(spec.gbdoctor.device)
    if available is None:
        available = available_memory(device)
    if model is None:
        model = _meta_model(spec)
    estimate = estimate_memory(spec, model, available=available)
    if device == "cuda":
        # Each rank has a GPU of its own: compare one rank with one device.
        estimate = replace(estimate, local_ranks=1)
    if estimate.fits:
        return Decision(simulate=False, estimate=estimate)
    return Decision(
        simulate=True,
        estimate=estimate,
        reason=(f"a real scan {describe(estimate)}, so the scan was simulated automatically"),
    )


def pin(spec: Spec, decision: Decision) -> Spec:
    """``spec`` with the decision fixed (``[gbdoctor] simulate``, and the capture shape when it
    was reduced), so re-scans (plan rounds) do not decide again."""
    tool = replace(spec.gbdoctor, simulate=decision.simulate)
    if decision.capture_shape is not None:
        tool = replace(
            tool, batch_size=decision.capture_shape[0], seq_len=decision.capture_shape[1]
        )
    return spec if tool == spec.gbdoctor else replace(spec, gbdoctor=tool)


# ------------------------------------------------------------------------- capture shape

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

    top_k = _top_k(spec)
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


def require_real(
    spec: Spec, *, available: int | None = None, command: str = "run"
) -> MemoryEstimate | None:
    """For ``run`` (it trains for real and cannot simulate): the estimate, or exit 2 with how to
    shrink the spec when ``decide`` would simulate."""
    if spec.gbdoctor.simulate:
        raise SpecError(
            f"`gbdoctor {command}` trains for real and cannot simulate "
            "([gbdoctor] simulate = true)",
            hint="drop --set gbdoctor.simulate=true; use `gbdoctor scan --simulate` to see "
            "the breaks of a production-size spec",
        )
    world, limit = spec.parallelism.world_size, local_world_limit()
    if world > limit:
        raise SpecError(
            f"`gbdoctor {command}` trains for real on local ranks, and world size {world} "
            f"exceeds the {limit} this machine runs (2 per CPU core)",
            hint="shrink the world, e.g. --world-size 2 or --set parallelism."
            "data_parallel_shard_degree=2 (EP must divide it)",
        )
    decision = _memory_decision(spec, None, available)
    if decision.simulate:
        assert decision.estimate is not None
        raise SpecError(
            f"`gbdoctor {command}` trains for real and cannot simulate: a real run "
            f"{describe(decision.estimate)}",
            hint=shrink_hint(spec, decision.estimate),
        )
    return decision.estimate


def shrink_hint(spec: Spec, estimate: MemoryEstimate) -> str:
    """How to make ``spec`` fit: a smaller flavor when the weights alone do not, else smaller shapes."""
    state = estimate.params + estimate.grads + estimate.optimizer + estimate.overhead
    if state * estimate.local_ranks > estimate.budget and spec.model.name != "custom":
        return (
            f"run a smaller flavor with the same setup, e.g. --set model.flavor={_smallest(spec)} "
            "(and --set gbdoctor.batch_size=2 --set gbdoctor.seq_len=64), or run on a machine "
            "with more memory"
        )
    return (
        "shrink the step, e.g. --set gbdoctor.batch_size=2 --set gbdoctor.seq_len=64, or run on "
        "a machine with more memory"
    )


def _smallest(spec: Spec) -> str:
    from gbdoctor.models import family_flavors

    flavors = family_flavors(spec.model.name)
    return (
        "debugmodel" if "debugmodel" in flavors else (flavors[0] if flavors else spec.model.flavor)
    )
