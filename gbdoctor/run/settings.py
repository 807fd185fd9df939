"""A training command's settings, resolved once (:func:`run_settings`), and the one set-up of
the spec its ranks train (:func:`prepare_training`), for ``run``, ``price`` and ``timeline``.

Before issue 41 each command took its settings as loose arguments and derived the device, the
backend default, the benchmark shape and the CPU parameter dtype itself, three times over, with
two backend defaults (``price`` always inductor). Now the CLI builds one
:class:`~gbdoctor.records.RunSettings` from the spec and its options, and the library passes it
down: the drivers, the round loop and the report read the same values.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from enum import Enum
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.interface import Framework
from gbdoctor.records import Clock, Spec
from gbdoctor.records.bounds import WARMUP
from gbdoctor.records.settings import RunSettings
from gbdoctor.run.modes import (
    DEFAULT_BACKEND,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    benchmark_shape,
    check_backend,
    cpu_param_dtype,
)


class Shape(Enum):
    """Which shape rule a command trains at."""

    BENCHMARK = "benchmark"
    """``run`` and ``price``: :func:`~gbdoctor.run.modes.benchmark_shape` (the spec's training
    shape on CUDA, a CPU benchmark shape on CPU), measured after warm-up steps."""
    CAPTURE = "capture"
    """``timeline``: the spec's capture shape, its steps cycling through the sequence lengths
    given, every step recorded from the first (no warm-up: the warm-up is what it explains)."""


def default_backend(spec: Spec) -> str:
    """The backend every training command uses when ``--backend`` is not given: the spec's
    ``[compile] backend`` when the config names one (what its training compiles with), else
    inductor. One default for ``run``, ``price`` and ``timeline`` (docs/run.md, Backend)."""
    return spec.compile.backend if spec.compile.backend_set else DEFAULT_BACKEND


def run_settings(
    spec: Spec,
    *,
    steps: int,
    warmup: int | None = None,
    rounds: int | None = None,
    backend: str | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    seq_lens: Iterable[int] = (),
    clock: Clock = Clock.WALL,
    nproc: int | None = None,
    shape: Shape = Shape.BENCHMARK,
) -> RunSettings:
    """The settings of one training command on ``spec``, from its command-line values (None:
    not given). SpecError (exit 2) for a value out of range, ``--nproc`` other than the spec's
    world size, an unknown backend, or ``--clock cpu`` off a CPU device.

    ``seq_len`` is the benchmark shape's (``Shape.BENCHMARK``); ``seq_lens`` the lengths a
    timeline cycles through (``Shape.CAPTURE``; none: the spec's capture length). ``warmup``
    and ``rounds``: None is ``run``'s defaults at the benchmark shape, none and one at the
    capture shape."""
    from gbdoctor.setup.dist import resolve_device

    benchmark = shape == Shape.BENCHMARK
    if warmup is None:
        warmup = DEFAULT_WARMUP if benchmark else 0
    if rounds is None:
        rounds = DEFAULT_ROUNDS if benchmark else 1
    world = spec.parallelism.world_size
    if nproc is not None and nproc != world:
        raise SpecError(
            f"--nproc {nproc} does not match the spec's world size {world}",
            hint="the world size follows from [parallelism] degrees; change them (or --set) "
            "instead, or drop --nproc",
        )
    if benchmark and warmup < WARMUP.low:
        raise SpecError(
            f"--warmup {WARMUP.problem(warmup)}",
            hint="compilation happens in the warm-up steps; they are excluded from the measurement",
        )
    if not benchmark and steps < 2:
        raise SpecError(f"--steps must be at least 2 (got {steps})")
    backend = backend or default_backend(spec)
    check_backend(backend)
    device = resolve_device(spec.gbdoctor.device)
    if clock == Clock.CPU and device != "cpu":
        raise SpecError(
            f"--clock cpu measures the host's work, not the {device} device's",
            hint="price on the device with --clock wall (the default)",
        )
    if benchmark:
        b, s, note = benchmark_shape(spec, device, batch_size, seq_len)
        lengths: tuple[int, ...] = (s,)
    else:
        lengths = tuple(seq_lens) or (spec.capture_seq_len,)
        b, s, note = batch_size or spec.capture_batch_size, max(lengths), ""
    return RunSettings(
        device=device,
        backend=backend,
        warmup=warmup,
        steps=steps,
        rounds=rounds,
        batch_size=b,
        seq_len=s,
        seq_lens=lengths,
        clock=clock,
        ranks=world,
        shape_note=note,
    )


def prepare_training(
    spec: Spec,
    settings: RunSettings,
    framework: Framework,
    *,
    real: bool = True,
    command: str = "run",
    model: Any = None,
) -> tuple[Spec, str]:
    """(the spec its ranks train, the CPU dtype note or ""): ``spec`` at the settings' shape,
    with FSDP's bf16 parameters in float32 on a CPU without bf16 matmuls (``cpu_param_dtype``),
    and the framework's rank preparation done (``Framework.prepare_ranks``: what would hang
    every rank, such as a stale DeepSpeed JIT lock, is exit 3 before any rank starts).

    ``real``: exit 2 with how to shrink the spec where a scan would simulate it
    (``scan.estimate.require_real``: a training command cannot simulate); ``model``: the
    spec's model on meta where the command built it (its memory check uses it), else built
    there. The model does not depend on the shape: one build serves every shape's estimate."""
    from gbdoctor.scan.estimate import require_real

    shaped = replace(
        spec,
        gbdoctor=replace(spec.gbdoctor, batch_size=settings.batch_size, seq_len=settings.seq_len),
    )
    trained, note = cpu_param_dtype(shaped, settings.device)
    if real:
        # After the cheap checks: this builds the model on meta.
        require_real(trained, command=command, model=model)
    framework.prepare_ranks(settings.device)
    return trained, note
