"""What a ``run`` trains: its modes (the spec's framework's, plus the plan's), the defaults of
its options, the benchmark shape and parameter dtype on this device, and the backend check."""

from __future__ import annotations

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.interface import Framework
from gbdoctor.frameworks.registry import default_framework, run_modes_of
from gbdoctor.records import Spec
from gbdoctor.spec import with_overrides

_DEFAULT_MODES = run_modes_of(default_framework())

MODE_STRATEGIES: dict[str, str] = dict(_DEFAULT_MODES.strategies)
"""Mode name -> compile strategy of the default framework. ``plan`` comes from the planner."""

MODES: tuple[str, ...] = _DEFAULT_MODES.modes

MODES_NEEDING_PLAN = ("plan", "cudagraphs")
"""Modes that need --plan: ``cudagraphs`` is the plan with mode="reduce-overhead" on the kinds
the plan found CUDA-graph ready (CUDA only; reported ``unavailable`` elsewhere, never faked)."""

BASELINES: tuple[str, ...] = _DEFAULT_MODES.baselines
"""Modes that compete for "best baseline"."""


def framework_modes(
    framework: Framework,
) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """(mode -> strategy name, every mode, the baselines) of the spec's training framework."""
    modes = run_modes_of(framework)
    return dict(modes.strategies), modes.modes, modes.baselines


DEFAULT_STEPS = 5

DEFAULT_WARMUP = 2

DEFAULT_ROUNDS = 2

DEFAULT_BACKEND = "inductor"
"""What training uses, on every device; ``aot_eager`` (traces, does not optimize) for quick runs."""

CPU_BENCH_TOKENS = 1024
"""Tokens per rank per step on CPU (local batch 4 x seq 256 for the debug specs, 16x the scan
shapes): the blocks' forward and backward, not the optimizer, fill the step (the report's
forward/backward/optimizer split shows it per mode), while a step stays around a second on a
2-core machine. At the scan shapes (2 x 64) with the old unfused AdamW the optimizer was about
half of an eager debug step and every compiled mode measured as eager."""

CPU_BENCH_SEQ = 256


def resolve_modes(
    modes: list[str] | None, *, plan: bool, all_modes: tuple[str, ...] = MODES
) -> list[str]:
    """The modes to run, in canonical order (``all_modes``: the framework's); SpecError for
    unknown names, or for ``plan`` or ``cudagraphs`` (the plan with reduce-overhead) with
    --no-plan.

    ``plan``: a plan is available or will be made (not ``--no-plan``). ``cudagraphs`` runs only
    on request: it needs CUDA and says nothing new about breaks."""
    if not modes:
        return [m for m in all_modes if m != "cudagraphs" and (m != "plan" or plan)]
    unknown = [m for m in modes if m not in all_modes]
    if unknown:
        raise SpecError(
            f"unknown run mode(s) {', '.join(map(repr, unknown))}",
            hint=f"valid modes: {', '.join(all_modes)}",
        )
    for needs_plan in MODES_NEEDING_PLAN:
        if needs_plan in modes and not plan:
            raise SpecError(
                f"mode '{needs_plan}' conflicts with --no-plan", hint="drop one of them"
            )
    return [m for m in all_modes if m in modes]


def check_backend(backend: str) -> None:
    import torch

    known = torch.compiler.list_backends(exclude_tags=())
    if backend not in known:
        raise SpecError(
            f"unknown compile backend {backend!r}",
            hint=f"valid backends: {', '.join(sorted(known))}",
        )


def benchmark_shape(
    spec: Spec, device: str, batch_size: int | None, seq_len: int | None
) -> tuple[int, int, str]:
    """(local batch, seq len, where they come from) for a run.

    Explicit values win. On CUDA the default is the spec's ``[training]`` shape, as training runs
    it. On CPU it is ``CPU_BENCH_TOKENS`` tokens per rank at seq ``CPU_BENCH_SEQ`` (both capped at
    the spec's training shape): the scan shapes in ``[gbdoctor]`` are sized for capture speed and
    leave the step to the optimizer and per-op overhead, which no compile mode changes."""
    train_b, train_s = spec.training.local_batch_size, spec.training.seq_len
    if device == "cuda":
        b, s, why = train_b, train_s, "the spec's [training] shape"
    else:
        s = min(CPU_BENCH_SEQ, train_s)
        b = max(1, min(train_b, CPU_BENCH_TOKENS // s))
        why = (
            f"CPU benchmark shape ({CPU_BENCH_TOKENS} tokens per rank, capped at [training]): large enough "
            "that the compiled blocks, not the optimizer or per-op overhead, dominate a step"
        )
    if batch_size or seq_len:
        b, s, why = batch_size or b, seq_len or s, "given on the command line"
    return b, s, why


def cpu_param_dtype(
    spec: Spec, device: str, *, cpu_has_bf16: bool | None = None
) -> tuple[Spec, str]:
    """(spec to train, note): FSDP's bf16 parameters become float32 on a CPU without bf16 matmul
    instructions. There every bf16 GEMM takes a generic kernel (this 2-core AVX2 machine: 0.37 vs
    34 GFLOP/s fp32, and 87% of a llama4 debug step under titan-v0.2.0 in a py-spy profile),
    which no compile mode can change, so a comparison of compile modes would measure that
    kernel. GPUs and CPUs with bf16 instructions train in the spec's dtype."""
    if device != "cpu" or spec.training.mixed_precision_param != "bfloat16":
        return spec, ""
    if cpu_has_bf16 is None:
        import torch

        cpu_has_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if cpu_has_bf16:
        return spec, ""
    note = (
        "parameters in float32, not the spec's bfloat16: this CPU has no bf16 matmul "
        "instructions, and emulated bf16 GEMMs would dominate every mode's step alike"
    )
    return with_overrides(spec, ("training.mixed_precision_param=float32",)), note
