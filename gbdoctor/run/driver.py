"""``run``: train for real under several compile configurations and compare them.

``gbdoctor run SPEC`` first makes the plan (``plan.propose_plan``: the same planner and
verification as ``gbdoctor plan``) unless ``--plan FILE`` gives one or ``--no-plan`` skips it, then
trains every mode (eager, the torchtitan baselines, whole-block fullgraph, the plan) in FRESH
spawned rank processes (``run_ranks``, even for world size 1): clean Dynamo state, a process whose
peak memory belongs to that mode alone. Every mode builds the model from the same seed and trains
on the same synthetic batches, so losses are comparable step by step.

Noise is measured, not assumed away: the whole set of modes runs ``rounds`` times, in alternating
order (ABC, CBA, ABC, ...), so slow drifts of the machine hit every mode alike. Each round gives
each mode's median step time; a ratio between two modes is reported with the (min, max) of its
per-round values, and only a range entirely above 1 is called faster.

Per rank, mode and round: build -> ``apply_setup`` with the mode's strategy -> ``warmup``
training steps (compilation happens here) -> ``steps`` measured training steps, each timed on its
own (after a barrier on multi-rank jobs, with CUDA synchronizes on GPU) and split into forward,
backward and optimizer. Recompiles are recorded with ``capture.recompiles.watch_recompiles``.

Definitions (also in docs/run.md):

* step time: wall time of one training step (forward, backward, optimizer step, loss
  all-reduce); with N ranks, the slowest rank's time for that step.
* tokens/s: global tokens per step (local batch x seq len x ranks) / median measured step time
  over every round. Compilation is in the warm-up steps and never counted.
* compile time: wall time of the warm-up steps minus ``warmup`` x the median measured step time
  (clamped at 0), in the first round (the mode's compile cache is empty); later rounds reuse the
  mode's own cache (as a restarted training job would) and are reported as the warm compile time.
  Modes never share a cache. Eager's value is the first-step overhead floor, not compilation.
* peak memory: CUDA ``max_memory_allocated`` over the measured steps (reset after warm-up) on GPU;
  on CPU the rank process's peak RSS over its whole life (``ru_maxrss``), which includes torch
  itself and compilation. Max over ranks and rounds.
* graphs: Dynamo's ``unique_graphs`` counter (graphs compiled) in the first round, in total and
  during the measured steps.
* recompiles: records of Dynamo's ``recompiles`` log stream. Those during the measured steps are
  findings.
* ratios: eager's (or the best baseline's) median step time over the mode's, computed round by
  round; the ratio is the median of the per-round ratios and the range their min and max.
* MFU (GPU): tokens/s x FLOPs per token (``run.flops``, from the model config) over ranks x the
  device's dense bf16 peak.
* divergence: a mode's first-step loss differs from eager's by more than ``LOSS_RTOL``
  (relative), or any of its losses is not finite.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gbdoctor.capture import torch_version
from gbdoctor.causes import KnownIssue
from gbdoctor.errors import GbdoctorError, SpecError
from gbdoctor.frameworks.registry import default_framework, framework_for
from gbdoctor.records import (
    LOSS_RTOL,
    READABLE_RUN_SCHEMA_VERSIONS,
    RUN_SCHEMA_VERSION,
    CompileMode,
    ModeResult,
    ModeStatus,
    RunReport,
    Spec,
    Verdict,
)
from gbdoctor.records.io import check_schema_version, load_record, parse_json_object
from gbdoctor.run.measure import (
    device_peak,
    known_bug_workaround,
    load_average,
    per_step_max,
    strip_rank,
    workaround_note,
)
from gbdoctor.run.worker import ModeFailure, ModeJob, RankRun, run_mode_rank
from gbdoctor.scan.job import Progress
from gbdoctor.setup.compile import STRATEGIES, Strategy
from gbdoctor.spec import with_overrides

_DEFAULT_MODES = default_framework().run_modes
MODE_STRATEGIES: dict[str, str] = dict(_DEFAULT_MODES.strategies)
"""Mode name -> compile strategy of the default framework. ``plan`` comes from the planner."""
MODES: tuple[str, ...] = _DEFAULT_MODES.modes
MODES_NEEDING_PLAN = ("plan", "cudagraphs")
"""Modes that need --plan: ``cudagraphs`` is the plan with mode="reduce-overhead" on the kinds
the plan found CUDA-graph ready (CUDA only; reported ``unavailable`` elsewhere, never faked)."""
BASELINES: tuple[str, ...] = _DEFAULT_MODES.baselines
"""Modes that compete for "best baseline"."""


def framework_modes(spec: Spec) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """(mode -> strategy name, every mode, the baselines) of the spec's training framework."""
    modes = framework_for(spec).run_modes
    return dict(modes.strategies), modes.modes, modes.baselines


NOISY_SPREAD = 2.0
"""A mode whose slowest measured step took more than this many times its fastest gets a note."""


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

_NOT_MADE = Strategy(
    name="plan (not made)",
    dense=STRATEGIES["none"].dense,
    moe=STRATEGIES["none"].moe,
    summary="no plan was made: the mode that needed it could not run on this device",
)

Raw = tuple[str, Strategy, list[list[RankRun]] | None, tuple[str, str] | None, str]
"""(mode, strategy, per round the per-rank runs or None when it failed, (error, kind) when it
failed, the note of the known-bug workaround it ran under or "")."""


# --------------------------------------------------------------------------- driver


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
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
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


def run_modes(
    spec: Spec,
    *,
    modes: list[str] | None = None,
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    rounds: int = DEFAULT_ROUNDS,
    backend: str | None = None,
    plan_path: str | None = None,
    make_plan: bool = True,
    batch_size: int | None = None,
    seq_len: int | None = None,
    nproc: int | None = None,
    progress: Progress | None = None,
    on_plan: Callable[[Any], None] | None = None,
    extra_modes: Mapping[str, Strategy] | None = None,
) -> RunReport:
    """Make the plan, then train ``spec`` under each mode in fresh processes and compare.

    ``modes``: None runs every mode (``plan`` unless ``make_plan`` is False and no ``plan_path``).
    ``plan_path``: a saved plan JSON (``gbdoctor plan --emit-config json``) instead of making one.
    ``rounds``: how many times the whole set of modes runs (alternating order); 2 or more gives
    every ratio a spread.
    ``backend``: None means the spec's ``[compile] backend`` when the config names one, else
    ``inductor``. ``batch_size``/``seq_len``: None picks
    :func:`benchmark_shape`. ``nproc``: must equal the spec's world size when given.
    ``on_plan``: called with the :class:`~gbdoctor.plan.Plan` once it is made or loaded.
    ``extra_modes``: more modes by name, run after the chosen ones (``run --price`` adds the
    strategy the prices were measured against).
    A mode that fails (compile error, crash, timeout) is a failed record; the others still run.
    Bad input (unknown mode or backend, --nproc mismatch, bad plan, a model factory that fails)
    raises SpecError (BaselineError for an unreadable plan file).
    """
    from gbdoctor.scan.estimate import require_real
    from gbdoctor.setup.dist import resolve_device

    if steps < 1:
        raise SpecError(f"--steps must be at least 1 (got {steps})")
    if warmup < 1:
        raise SpecError(
            f"--warmup must be at least 1 (got {warmup})",
            hint="compilation happens in the warm-up steps; they are excluded from the measurement",
        )
    if rounds < 1:
        raise SpecError(f"--rounds must be at least 1 (got {rounds})")
    if plan_path and not make_plan:
        raise SpecError("--plan FILE conflicts with --no-plan", hint="drop one of them")
    world = spec.parallelism.world_size
    if nproc is not None and nproc != world:
        raise SpecError(
            f"--nproc {nproc} does not match the spec's world size {world}",
            hint="the world size follows from [parallelism] degrees; change them (or --set) "
            "instead, or drop --nproc",
        )
    mode_strategies, all_modes, _ = framework_modes(spec)
    chosen = resolve_modes(modes, plan=make_plan or bool(plan_path), all_modes=all_modes)
    device = resolve_device(spec.gbdoctor.device)
    backend = backend or (spec.compile.backend if spec.compile.backend_set else DEFAULT_BACKEND)
    check_backend(backend)
    b, s, shape_note = benchmark_shape(spec, device, batch_size, seq_len)
    if b < 1 or s < 1:
        raise SpecError(f"--batch-size and --seq-len must be positive (got {b} x {s})")
    run_spec = replace(spec, gbdoctor=replace(spec.gbdoctor, batch_size=b, seq_len=s))
    run_spec, dtype_note = cpu_param_dtype(run_spec, device)
    if dtype_note:
        shape_note = f"{shape_note}; {dtype_note}"
    # Where a scan would simulate, exit 2 with the estimate and a --set that shrinks the spec
    # (after the cheap option checks: this builds the model on meta).
    require_real(run_spec)
    table = framework_for(spec).strategies
    strategies: dict[str, Any] = {
        m: table[mode_strategies[m]] for m in chosen if m not in MODES_NEEDING_PLAN
    }
    strategies.update(extra_modes or {})
    chosen += [m for m in extra_modes or {} if m not in chosen]
    plan_info: dict[str, Any] = {}
    cudagraph_layers: tuple[str, ...] = ()
    # cudagraphs alone off CUDA does not run, so no plan is made for it (a --plan file is read).
    if "plan" in chosen or ("cudagraphs" in chosen and (device == "cuda" or plan_path)):
        plan, identity = _get_plan(spec, plan_path, progress)
        if on_plan is not None:
            on_plan(plan)
        from gbdoctor.plan import plan_strategy

        # A plan file is applied strictly (its identity is checked against the model); a plan
        # made here is this model's by construction.
        for m in MODES_NEEDING_PLAN:
            if m in chosen:
                strategies[m] = plan_strategy(plan, spec, identity=identity)
        cudagraph_layers = tuple(fqn for k in plan.kinds if k.cudagraph_ready for fqn in k.layers)
        plan_info = {
            "plan_source": plan_path or "made by this run (gbdoctor plan, verified by re-scanning)",
            "plan_verified": plan.verified,
            "plan_kinds": _plan_lines(plan),
        }
    elif "cudagraphs" in chosen:
        strategies["cudagraphs"] = _NOT_MADE

    framework_for(spec).prepare_ranks(device)
    raw = _run_rounds(
        run_spec,
        chosen,
        strategies,
        device=device,
        backend=backend,
        warmup=warmup,
        steps=steps,
        rounds=rounds,
        progress=progress,
        cudagraph_layers=cudagraph_layers,
    )
    loads = raw.pop()
    flops = _flops(spec, s)
    device_name, peak = device_peak(device)
    from gbdoctor.setup.optim import adamw_implementation

    return build_report(
        run_spec,
        raw,
        device=device,
        backend=backend,
        warmup=warmup,
        steps=steps,
        torch_version=torch_version(),
        load=(max(loads, default=load_average()), os.cpu_count() or 1),
        rounds=rounds,
        shape_note=shape_note,
        optimizer=f"AdamW ({adamw_implementation(device)})",
        device_name=device_name,
        flops_per_token=flops,
        peak_tflops=peak,
        **plan_info,
    )


def _get_plan(
    spec: Spec, plan_path: str | None, progress: Progress | None
) -> tuple[Any, str | None]:
    """(plan, identity): the ``--plan`` file (read and checked), or a plan made and verified now."""
    from gbdoctor.plan import propose_plan, read_plan

    if plan_path:
        return read_plan(plan_path)
    say = (lambda msg, done, total: progress(f"plan: {msg}", done, total)) if progress else None
    return propose_plan(spec, progress=say), None


def _plan_lines(plan: Any) -> tuple[str, ...]:
    lines = []
    for k in plan.kinds:
        what = "block fullgraph" if k.mode == CompileMode.BLOCK else "children fullgraph"
        if k.eager:
            what += f", eager {k.eager_summary()}"
        if k.split_ac:
            what += ", AC per child"
        lines.append(f"{k.kind}: {what}" + ("" if k.verified else f" (NOT verified: {k.detail})"))
    if plan.flags:
        lines.append("Dynamo flags: " + ", ".join(f"{name}={value}" for name, value in plan.flags))
    return tuple(lines)


def _run_rounds(
    spec: Spec,
    chosen: list[str],
    strategies: dict[str, Strategy],
    *,
    device: str,
    backend: str,
    warmup: int,
    steps: int,
    rounds: int,
    progress: Progress | None,
    cudagraph_layers: tuple[str, ...] = (),
) -> list[Any]:
    """Every mode, ``rounds`` times in alternating order; returns the raw records plus, as the
    last item, the load averages seen before each job. ``cudagraphs`` off CUDA is recorded as
    unavailable without running."""
    from gbdoctor.setup.dist import run_ranks

    world = spec.parallelism.world_size
    caches = {m: tempfile.mkdtemp(prefix=f"gbdoctor-run-{m}-") for m in chosen}
    runs: dict[str, list[list[RankRun]]] = {m: [] for m in chosen}
    failures: dict[str, tuple[str, str]] = {}
    if "cudagraphs" in chosen and device != "cuda":
        failures["cudagraphs"] = (
            f"CUDA graphs need a CUDA device; this run is on {device}, so the mode did not run "
            "(the static prediction is in the plan and in `gbdoctor scan`)",
            ModeStatus.UNAVAILABLE,
        )
    mode_specs: dict[str, Spec] = {}
    workarounds: dict[str, KnownIssue] = {}
    loads: list[float] = []
    total = rounds * len(chosen)
    done = 0
    try:
        for r in range(rounds):
            order = chosen if r % 2 == 0 else list(reversed(chosen))
            for mode in order:
                if mode in failures:  # a mode that failed once is not retried
                    total -= 1
                    continue
                loads.append(load_average())
                if progress:
                    progress(
                        f"round {r + 1}/{rounds}: {mode}: {warmup} warm-up + {steps} steps on {world} rank(s)",
                        done,
                        total,
                    )
                while True:
                    job = ModeJob(
                        spec=mode_specs.get(mode, spec),
                        mode=mode,
                        strategy=strategies[mode],
                        device=device,
                        backend=backend,
                        warmup=warmup,
                        steps=steps,
                        cache_dir=caches[mode],
                        # reduce-overhead is inductor's: this mode compiles with it whatever --backend
                        cudagraph_layers=cudagraph_layers if mode == "cudagraphs" else (),
                    )
                    try:
                        runs[mode].append(
                            run_ranks(
                                run_mode_rank,
                                job,
                                world_size=world,
                                device_type=device,
                                timeout_s=spec.gbdoctor.timeout_s,
                            )
                        )
                    except ModeFailure as exc:
                        issue = known_bug_workaround(exc.message, strategies[mode])
                        if issue is not None and mode not in workarounds:
                            # The spec's own setting hits a known upstream bug: what a user runs
                            # today is the workaround, so the baseline is measured under it.
                            workarounds[mode] = issue
                            mode_specs[mode] = with_overrides(spec, issue.overrides)
                            if progress:
                                progress(
                                    f"round {r + 1}/{rounds}: {mode}: known upstream bug "
                                    f"({issue.link.split()[0]}); retrying with "
                                    + " ".join(f"--set {o}" for o in issue.overrides),
                                    done,
                                    total,
                                )
                            continue
                        failures[mode] = (strip_rank(exc.message, world), exc.hint or "runtime")
                    except SpecError:
                        raise  # bad input (e.g. a broken model factory) fails every mode alike: exit 2
                    except GbdoctorError as exc:
                        kind = "timeout" if "did not finish" in exc.message else "crash"
                        failures[mode] = (strip_rank(exc.message, world), kind)
                    break
                done += 1
    finally:
        for cache in caches.values():
            shutil.rmtree(cache, ignore_errors=True)
    if progress:
        progress("done", total, total)
    raw: list[Any] = [
        (
            m,
            strategies[m],
            None if m in failures else runs[m],
            failures.get(m),
            workaround_note(workarounds[m]) if m in workarounds else "",
        )
        for m in chosen
    ]
    raw.append(loads)
    return raw


def _flops(spec: Spec, seq_len: int) -> int | None:
    from gbdoctor.run.flops import model_flops_per_token

    try:
        return model_flops_per_token(spec.model, seq_len).flops_per_token
    except Exception:  # noqa: BLE001 - a custom model that cannot build on meta: no FLOPs, no MFU
        return None


def _flags(strategy: Strategy) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in strategy.flags))


def _mode_from_rounds(
    mode: str, strategy: Strategy, rounds: list[list[RankRun]], tokens_per_step: int, warmup: int
) -> ModeResult:
    per_round = [per_step_max(ranks, "step_times") for ranks in rounds]
    steps = [t for times in per_round for t in times]
    median = statistics.median(steps)
    phases = [
        tuple(max(r.phase_times[i][k] for r in ranks) for k in range(3))
        for ranks in rounds
        for i in range(len(ranks[0].phase_times))
    ]
    phase_medians = [statistics.median(p[k] for p in phases) if phases else None for k in range(3)]
    warm = [per_step_max(ranks, "warmup_times") for ranks in rounds]
    compile_s = [max(0.0, sum(w) - warmup * statistics.median(t)) for w, t in zip(warm, per_round)]
    first = rounds[0]
    worst = max(
        (r for ranks in rounds for r in ranks),
        key=lambda r: (sum(e.measured and not e.limit_hit for e in r.recompiles), -r.rank),
    )
    rank0 = first[0]
    layout = rank0.layout
    return ModeResult(
        mode=mode,
        strategy=strategy.name,
        status=ModeStatus.OK,
        step_times_s=tuple(steps),
        warmup_times_s=tuple(warm[0]),
        round_medians_s=tuple(statistics.median(t) for t in per_round),
        step_time_median_s=median,
        step_time_min_s=min(steps),
        step_time_max_s=max(steps),
        tokens_per_s=tokens_per_step / median if median > 0 else None,
        forward_s=phase_medians[0],
        backward_s=phase_medians[1],
        optimizer_s=phase_medians[2],
        compile_time_s=compile_s[0],
        compile_time_warm_s=statistics.median(compile_s[1:]) if len(compile_s) > 1 else None,
        dynamo_compile_s=rank0.dynamo_compile_s,
        peak_memory_mib=max(r.peak_memory_mib for ranks in rounds for r in ranks),
        memory_metric=rank0.memory_metric,
        graphs=rank0.graphs,
        graphs_measured=rank0.graphs_measured,
        graph_breaks=rank0.graph_breaks,
        regions=sum(len(regions) for _, regions, _ in layout),
        fullgraph_regions=sum(len(fg) for _, _, fg in layout),
        recompiles=sum(e.measured and not e.limit_hit for e in worst.recompiles),
        recompile_events=tuple(worst.recompiles),
        recompile_limit_hit=any(r.recompile_limit_hit for ranks in rounds for r in ranks),
        cudagraph_skips=tuple(rank0.cudagraph_skips),
        losses=tuple(rank0.losses),
        dynamo_config=_flags(strategy),
    )


def ratio_with_spread(
    reference: ModeResult, res: ModeResult
) -> tuple[float, tuple[float, float] | None, str]:
    """(ratio, (min, max) of the per-round ratios, verdict), ratios as reference step time / res's.

    With 2+ rounds the ratio is the median of the per-round ratios (each round's median step
    times), so it always lies inside its own spread; a ratio of step medians pooled over rounds
    can fall outside it when the machine's speed drifts between rounds. With one round it is the
    ratio of the step medians. The verdict calls ``res`` ``faster`` only when every round's ratio
    is above 1 (``slower`` when every one is below), ``within noise`` otherwise, and ``no
    spread`` with a single round."""
    pairs = list(zip(reference.round_medians_s, res.round_medians_s))
    if res is reference:
        return 1.0, ((1.0, 1.0) if len(pairs) > 1 else None), ""
    if len(pairs) < 2:
        return reference.step_time_median_s / res.step_time_median_s, None, Verdict.NO_SPREAD
    per_round = [a / b for a, b in pairs]
    ratio = statistics.median(per_round)
    lo, hi = min(per_round), max(per_round)
    verdict = Verdict.FASTER if lo > 1 else Verdict.SLOWER if hi < 1 else Verdict.WITHIN_NOISE
    return ratio, (lo, hi), verdict


def build_report(
    spec: Spec,
    raw: list[Raw],
    *,
    device: str,
    backend: str,
    warmup: int,
    steps: int,
    torch_version: str,
    load: tuple[float, int] | None = None,
    rounds: int = 1,
    shape_note: str = "",
    optimizer: str = "",
    device_name: str = "",
    flops_per_token: int | None = None,
    peak_tflops: float | None = None,
    plan_source: str | None = None,
    plan_verified: bool | None = None,
    plan_kinds: tuple[str, ...] = (),
) -> RunReport:
    """Per-rank measurements -> records, with ratios and their spreads, loss checks, duplicates
    and findings."""
    world = spec.parallelism.world_size
    tokens_per_step = spec.capture_batch_size * spec.capture_seq_len * world
    results: dict[str, ModeResult] = {}
    layouts: dict[str, Any] = {}
    for mode, strategy, runs, failure, workaround in raw:
        if runs is None:
            error, kind = failure or ("unknown failure", "crash")
            results[mode] = ModeResult(
                mode=mode,
                strategy=strategy.name,
                status=ModeStatus.UNAVAILABLE
                if kind == ModeStatus.UNAVAILABLE
                else ModeStatus.FAILED,
                error=error,
                error_kind=kind,
                dynamo_config=_flags(strategy),
            )
        else:
            results[mode] = _mode_from_rounds(mode, strategy, runs, tokens_per_step, warmup)
            layouts[mode] = _relative_layout(runs[0][0].layout)
        if mode == "plan":
            results[mode] = replace(results[mode], plan_verified=plan_verified)
        if workaround:
            results[mode] = replace(results[mode], workaround=workaround)

    ok = {m: r for m, r in results.items() if r.status == ModeStatus.OK and r.step_time_median_s}
    eager = ok.get("eager")
    order = framework_modes(spec)[2]
    baselines = {m: r for m, r in ok.items() if m in order}
    best = (
        min(baselines, key=lambda m: (baselines[m].step_time_median_s, order.index(m)))
        if baselines
        else None
    )
    report_notes: list[str] = []
    findings: list[str] = []
    final: list[ModeResult] = []
    for mode, res in results.items():
        notes = list(res.notes)
        updates: dict[str, Any] = {}
        if res.status == ModeStatus.OK:
            median = res.step_time_median_s
            if eager is not None and median:
                ratio, spread, verdict = ratio_with_spread(eager, res)
                updates.update(
                    speedup_vs_eager=ratio, speedup_vs_eager_range=spread, verdict_vs_eager=verdict
                )
            if best is not None and median:
                ratio, spread, verdict = ratio_with_spread(ok[best], res)
                updates.update(
                    speedup_vs_best_baseline=ratio,
                    speedup_vs_best_baseline_range=spread,
                    verdict_vs_best_baseline=verdict,
                )
            if flops_per_token and res.tokens_per_s:
                from gbdoctor.run.flops import mfu

                updates["tflops_per_s"] = res.tokens_per_s * flops_per_token / 1e12
                updates["mfu"] = mfu(res.tokens_per_s, flops_per_token, peak_tflops, world)
            diverged, rel = _divergence(res, eager)
            updates.update(diverged=diverged, loss_rel_diff=rel)
            same = _earlier_same_layout(mode, layouts)
            if same is not None:
                updates["same_regions_as"] = same
                notes.append(_same_layout_note(res, results[same]))
            if res.step_time_min_s and res.step_time_max_s / res.step_time_min_s > NOISY_SPREAD:
                notes.append(
                    f"measured step times vary {res.step_time_max_s / res.step_time_min_s:.1f}x "
                    f"({res.step_time_min_s:.3g}-{res.step_time_max_s:.3g} s) with no recompile in "
                    "between: the machine is probably busy; compare modes with care"
                    if not res.graphs_measured
                    else f"measured step times vary {res.step_time_max_s / res.step_time_min_s:.1f}x "
                    "(recompiles in the measured steps)"
                )
            if res.recompiles:
                first = next(e for e in res.recompile_events if e.measured and not e.limit_hit)
                findings.append(
                    f"{mode}: {res.recompiles} recompile(s) during the measured steps "
                    f"(first: {first.reason}"
                    + (f" at {first.location}" if first.location else "")
                    + ")"
                )
            if res.recompile_limit_hit:
                findings.append(
                    f"{mode}: Dynamo hit recompile_limit; some frames ran eagerly afterwards"
                )
            if res.cudagraph_skips:
                findings.append(
                    f"{mode}: inductor skipped cudagraphs {len(res.cudagraph_skips)} time(s) "
                    f"(first: {res.cudagraph_skips[0]})"
                )
            if diverged:
                findings.append(
                    f"{mode}: losses diverge from eager ({_divergence_text(res, eager, rel)})"
                )
        elif res.status == ModeStatus.UNAVAILABLE:
            pass  # not a finding: nothing failed (the reason is the mode's ``error``)
        else:
            findings.append(f"{mode} failed ({res.error_kind}): {res.error}")
        if mode == "plan" and plan_verified is False:
            notes.append(
                "the plan did NOT verify (some block kind still breaks under the strict scan); "
                "it ran anyway, as the planner emitted it"
            )
        final.append(replace(res, notes=tuple(notes), **updates))
    by_mode = {m.mode: m for m in final}
    plan_verdict = _plan_verdict(by_mode.get("plan"), best, by_mode)
    if eager is None:
        report_notes.append(
            "no successful eager run: speedups vs eager and loss checks are unavailable"
        )
    if best is None:
        report_notes.append(
            "no successful baseline mode: speedups vs the best baseline are unavailable"
        )
    if rounds < 2 and len(results) > 1:
        report_notes.append(
            "a single round: ratios have no spread, so no difference is called a speedup "
            "(use --rounds 2 or more)"
        )
    if device == "cpu":
        report_notes.append(
            "peak memory on CPU is the rank process's peak RSS (torch and compilation included)"
        )
        report_notes.append(
            "MFU needs a device peak; CPU peaks are not tabulated, so only achieved TFLOP/s is shown"
        )
    elif flops_per_token and peak_tflops is None:
        report_notes.append(f"no dense bf16 peak known for {device_name!r}: MFU not computed")
    if load is not None and load[0] > load[1] + world:
        report_notes.append(
            f"the machine was busy: 1-minute load average up to {load[0]:.1f} on {load[1]} cores "
            f"(this run's own ranks add at most {world}); timings include contention from other "
            "processes"
        )
    if world > 1:
        report_notes.append(
            f"step times are the slowest of {world} ranks per step; losses are global (all-reduced)"
        )
    ac = spec.activation_checkpoint
    return RunReport(
        spec=spec.key,
        model=f"{spec.model.name}/{spec.model.flavor}",
        torch_version=torch_version,
        device=device,
        backend=backend,
        world_size=world,
        batch_size=spec.capture_batch_size,
        seq_len=spec.capture_seq_len,
        warmup=warmup,
        steps=steps,
        seed=spec.training.seed,
        tokens_per_step=tokens_per_step,
        ac_mode=ac.mode,
        ac_option=ac.selective_ac_option,
        modes=tuple(final),
        rounds=rounds,
        shape_note=shape_note,
        optimizer=optimizer,
        device_name=device_name,
        flops_per_token=flops_per_token,
        peak_tflops=peak_tflops,
        plan_source=plan_source,
        plan_verified=plan_verified,
        plan_kinds=plan_kinds,
        plan_verdict=plan_verdict,
        best_baseline=best,
        findings=tuple(findings),
        notes=tuple(report_notes),
    )


def _fmt_ratio(ratio: float | None, spread: tuple[float, float] | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" + (f" [{spread[0]:.2f}-{spread[1]:.2f}]" if spread else "")


def _plan_verdict(plan: ModeResult | None, best: str | None, by_mode: dict[str, ModeResult]) -> str:
    """The plan against the best baseline, in one sentence that never calls noise a speedup."""
    if plan is None:
        return ""
    if plan.status != ModeStatus.OK:
        return f"the plan failed ({plan.error_kind}): {plan.error}"
    if best is None:
        return "no baseline ran successfully: nothing to compare the plan with"
    if plan.same_regions_as == best and plan.dynamo_config == by_mode[best].dynamo_config:
        return f"the plan compiles exactly what {best} compiles, with the same Dynamo settings: it is that baseline"
    ratio = _fmt_ratio(plan.speedup_vs_best_baseline, plan.speedup_vs_best_baseline_range)
    verdict = plan.verdict_vs_best_baseline
    if verdict == Verdict.FASTER:
        return f"the plan is faster than the best baseline ({best}): {ratio}, every round above 1"
    if verdict == Verdict.SLOWER:
        return f"the plan is slower than the best baseline ({best}): {ratio}, every round below 1"
    if verdict == Verdict.WITHIN_NOISE:
        return f"the plan and the best baseline ({best}) are within noise: {ratio}; the spread contains 1, no speedup"
    return f"the plan vs the best baseline ({best}): {ratio} from a single round, no spread: no speedup claimed"


def _relative_layout(layout: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    regions = tuple(sorted(r for _, regions, _ in layout for r in regions))
    fullgraph = tuple(sorted(r for _, _, fg in layout for r in fg))
    return (fullgraph, regions)


def _earlier_same_layout(mode: str, layouts: dict[str, Any]) -> str | None:
    """The first earlier mode that compiled exactly the regions ``mode`` compiled (None for eager)."""
    if not layouts[mode][1]:
        return None
    for other, layout in layouts.items():
        if other == mode:
            return None
        if layout == layouts[mode]:
            return other
    return None


def _same_layout_note(res: ModeResult, same: ModeResult) -> str:
    diff = _flag_diff(res.dynamo_config, same.dynamo_config)
    text = f"compiles the same regions as {same.mode}"
    text += (
        f"; only the Dynamo settings differ ({diff})" if diff else " with the same Dynamo settings"
    )
    if res.graphs == same.graphs and res.graph_breaks == same.graph_breaks:
        return (
            text
            + f", and both compiled {res.graphs} graph(s): the gap between the two is run-to-run noise"
        )
    return text + f", which changed the graphs ({same.graphs} vs {res.graphs})"


def _flag_diff(a: tuple[tuple[str, str], ...], b: tuple[tuple[str, str], ...]) -> str:
    da, db = dict(a), dict(b)
    keys = sorted(set(da) | set(db))
    return ", ".join(
        f"{k}: {db.get(k, 'default')} -> {da.get(k, 'default')}"
        for k in keys
        if da.get(k) != db.get(k)
    )


def _divergence(res: ModeResult, eager: ModeResult | None) -> tuple[bool, float | None]:
    if any(not math.isfinite(x) for x in res.losses):
        return True, None
    if eager is None or res.mode == "eager" or not res.losses or not eager.losses:
        return False, None
    ref, got = eager.losses[0], res.losses[0]
    rel = abs(got - ref) / max(abs(ref), 1e-12)
    return rel > LOSS_RTOL, rel


def _divergence_text(res: ModeResult, eager: ModeResult | None, rel: float | None) -> str:
    if rel is None:
        return "a loss is not finite"
    assert eager is not None
    return (
        f"step 0 loss {res.losses[0]:.5g} vs eager {eager.losses[0]:.5g}, "
        f"relative difference {rel:.2g} > {LOSS_RTOL:g}"
    )


def report_from_json(text: str) -> RunReport:
    """Rebuild a :class:`RunReport` from ``render_run(report, "json")`` output (BaselineError
    on malformed input)."""
    data = parse_json_object(text, "run report")
    check_schema_version(
        data,
        READABLE_RUN_SCHEMA_VERSIONS,
        "run report",
        "run",
        hint="re-run with this gbdoctor version",
    )
    # Version 1 lacks what version 2 added (with defaults): read as the current version.
    return load_record(RunReport, data | {"schema_version": RUN_SCHEMA_VERSION}, "run report")
