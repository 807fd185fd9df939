"""``run``: train for real under several compile configurations and compare them.

Each mode (eager, the torchtitan baselines, whole-block fullgraph, a plan) runs in a FRESH set
of spawned rank processes (``run_ranks``, even for world size 1): clean Dynamo state, a fresh
inductor cache directory, and a process whose peak memory belongs to that mode alone. Every
mode builds the model from the same seed and trains on the same synthetic batches, so losses are
comparable step by step.

Per rank and mode: build -> ``apply_setup`` with the mode's strategy -> ``warmup`` training
steps (compilation happens here) -> ``steps`` measured training steps. Each step is timed on
its own (after a barrier on multi-rank jobs, with a CUDA synchronize on GPU); recompiles are
captured from Dynamo's ``recompiles`` log stream with the step they happened in.

Definitions (also in the README):

* step time: wall time of one ``train_step`` (forward, backward, optimizer step, loss
  all-reduce); with N ranks, the slowest rank's time for that step.
* tokens/s: global tokens per step (local batch x seq len x ranks) / median measured step time.
* compile time: wall time of the warm-up steps minus ``warmup`` x the median measured step time
  (clamped at 0): what the warm-up cost beyond steady-state training. Eager's value is the
  first-step overhead floor (lazy initialisation, allocator), not compilation.
* peak memory: CUDA ``max_memory_allocated`` over the measured steps (reset after warm-up) on GPU;
  on CPU the rank process's peak RSS over its whole life (``ru_maxrss``), which includes torch
  itself and compilation. Max over ranks.
* graphs: Dynamo's ``unique_graphs`` counter (graphs compiled), in total and during the measured
  steps.
* recompiles: records of the ``torch._dynamo.guards.__recompiles`` log stream. Those during
  the measured steps are findings.
* speedups: ratios of median step times from the same invocation, vs eager and vs the best
  baseline (the fastest successful titan-v0.2.0 / titan-v0.2.2 / block-fullgraph mode).
* divergence: a mode's first-step loss differs from eager's by more than ``LOSS_RTOL``
  (relative), or any of its losses is not finite.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import statistics
import tempfile
from collections.abc import Callable
from typing import Any

from gbdoctor.capture import torch_version
from gbdoctor.errors import GbdoctorError, SpecError
from gbdoctor.records import (
    LOSS_RTOL,
    READABLE_RUN_SCHEMA_VERSIONS,
    RUN_SCHEMA_VERSION,
    ModeResult,
    RunReport,
    Spec,
)
from gbdoctor.records.io import check_schema_version, load_record, parse_json_object
from gbdoctor.run.worker import ModeFailure, ModeJob, RankRun, run_mode_rank
from gbdoctor.setup.compile import STRATEGIES, Strategy

Progress = Callable[[str, int, int], None]
"""(message, done, total) callback for progress bars."""

MODE_STRATEGIES: dict[str, str] = {
    "eager": "none",
    "titan-v0.2.0": "titan-v0.2.0",
    "titan-v0.2.2": "titan-v0.2.2",
    "block-fullgraph": "block",
}
"""Mode name -> compile strategy (``setup.compile.STRATEGIES``). ``plan`` comes from --plan."""

MODES: tuple[str, ...] = (*MODE_STRATEGIES, "plan", "cudagraphs")
MODES_NEEDING_PLAN = ("plan", "cudagraphs")
"""Modes that need --plan: ``cudagraphs`` is the plan with mode="reduce-overhead" on the kinds
the plan found CUDA-graph ready (CUDA only; reported ``unavailable`` elsewhere, never faked)."""
BASELINES: tuple[str, ...] = ("titan-v0.2.0", "titan-v0.2.2", "block-fullgraph")
"""Modes that compete for "best baseline"."""

DEEPSPEED_MODE_STRATEGIES: dict[str, str] = {"eager": "none", "engine": "engine", "block": "block"}
"""``framework = "deepspeed"``: mode -> ``setup.deepspeed.DS_STRATEGIES``, under the spec's ZeRO
stage (``engine``: ``engine.compile()``; ``block``: ``block.compile()`` on every block)."""
DEEPSPEED_MODES: tuple[str, ...] = (*DEEPSPEED_MODE_STRATEGIES, "plan")
DEEPSPEED_BASELINES: tuple[str, ...] = ("engine", "block")


def framework_modes(spec: Spec) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    """(mode -> strategy name, every mode, the baselines) of the spec's training framework."""
    if spec.gbdoctor.framework == "deepspeed":
        return DEEPSPEED_MODE_STRATEGIES, DEEPSPEED_MODES, DEEPSPEED_BASELINES
    return MODE_STRATEGIES, MODES, BASELINES


NOISY_SPREAD = 2.0
"""A mode whose slowest measured step took more than this many times its fastest gets a note."""

DEFAULT_STEPS = 5
DEFAULT_WARMUP = 3


# --------------------------------------------------------------------------- driver


def resolve_modes(
    modes: list[str] | None, plan_path: str | None, all_modes: tuple[str, ...] = MODES
) -> list[str]:
    """The modes to run, in canonical order (``all_modes``: the framework's); SpecError for
    unknown names or ``plan`` without a plan."""
    if not modes:
        # cudagraphs only on request: it needs CUDA and says nothing new about breaks
        return [m for m in all_modes if m != "cudagraphs" and (m != "plan" or plan_path)]
    unknown = [m for m in modes if m not in all_modes]
    if unknown:
        raise SpecError(
            f"unknown run mode(s) {', '.join(map(repr, unknown))}",
            hint=f"valid modes: {', '.join(all_modes)}",
        )
    for needs_plan in MODES_NEEDING_PLAN:
        if needs_plan in modes and not plan_path:
            raise SpecError(
                f"mode '{needs_plan}' needs a plan file",
                hint="pass --plan plan.json (from `gbdoctor plan`)",
            )
    if plan_path and not any(m in modes for m in MODES_NEEDING_PLAN):
        modes = [*modes, "plan"]
    return [m for m in all_modes if m in modes]


def default_backend(device: str) -> str:
    return "inductor" if device == "cuda" else "aot_eager"


def _check_backend(backend: str) -> None:
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        raise SpecError(
            f"unknown compile backend {backend!r}",
            hint=f"valid backends: {', '.join(sorted(known))}",
        )


def run_modes(
    spec: Spec,
    *,
    modes: list[str] | None = None,
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    backend: str | None = None,
    plan_path: str | None = None,
    nproc: int | None = None,
    progress: Progress | None = None,
) -> RunReport:
    """Train ``spec`` under each mode in fresh processes and compare (see the module docstring).

    ``modes``: None runs every mode that applies (``plan`` only with ``plan_path``).
    ``backend``: None means the spec's ``[compile] backend`` when the config names one, else
    ``aot_eager`` on CPU and ``inductor`` on CUDA.
    ``nproc``: must equal the spec's world size when given.
    A mode that fails (compile error, crash, timeout) is a failed record; the others still run.
    Bad input (unknown mode or backend, --nproc mismatch, bad plan, a model factory that fails)
    raises SpecError (BaselineError for an unreadable plan file).
    """
    from gbdoctor.scan.estimate import require_real
    from gbdoctor.setup.dist import resolve_device, run_ranks

    if steps < 1:
        raise SpecError(f"--steps must be at least 1 (got {steps})")
    if warmup < 1:
        raise SpecError(
            f"--warmup must be at least 1 (got {warmup})",
            hint="compilation happens in the warm-up steps; they are excluded from the measurement",
        )
    world = spec.parallelism.world_size
    if nproc is not None and nproc != world:
        raise SpecError(
            f"--nproc {nproc} does not match the spec's world size {world}",
            hint="the world size follows from [parallelism] degrees; change them (or --set) "
            "instead, or drop --nproc",
        )
    mode_strategies, all_modes, _ = framework_modes(spec)
    chosen = resolve_modes(modes, plan_path, all_modes)
    device = resolve_device(spec.gbdoctor.device)
    backend = backend or (
        spec.compile.backend if spec.compile.backend_set else default_backend(device)
    )
    _check_backend(backend)
    # Where a scan would simulate, exit 2 with the estimate and a --set that shrinks the spec
    # (after the cheap option checks: this builds the model on meta).
    require_real(spec)
    table: dict[str, Any] = STRATEGIES
    if spec.gbdoctor.framework == "deepspeed":
        from gbdoctor.setup.deepspeed import DS_STRATEGIES

        table = DS_STRATEGIES
    strategies: dict[str, Any] = {
        m: table[mode_strategies[m]] for m in chosen if m not in MODES_NEEDING_PLAN
    }
    cudagraph_layers: tuple[str, ...] = ()
    if any(m in MODES_NEEDING_PLAN for m in chosen):
        from gbdoctor.plan import plan_strategy, read_plan  # only with --plan

        loaded_plan, identity = read_plan(plan_path)
        for m in MODES_NEEDING_PLAN:
            if m in chosen:
                strategies[m] = plan_strategy(loaded_plan, spec, identity=identity)
        cudagraph_layers = tuple(
            fqn for k in loaded_plan.kinds if k.cudagraph_ready for fqn in k.layers
        )

    if spec.gbdoctor.framework == "deepspeed":
        from gbdoctor.setup.deepspeed import check_jit_lock

        check_jit_lock(device)

    raw: list[tuple[str, Strategy, list[RankRun] | None, tuple[str, str] | None]] = []
    loads: list[float] = []
    for i, mode in enumerate(chosen):
        if mode == "cudagraphs" and device != "cuda":
            why = (
                f"CUDA graphs need a CUDA device; this run is on {device}, so the mode did not run "
                "(the static prediction is in the plan and in `gbdoctor scan`)"
            )
            raw.append((mode, strategies[mode], None, (why, "unavailable")))
            continue
        loads.append(_load_average())
        if progress:
            progress(f"{mode}: {warmup} warm-up + {steps} steps on {world} rank(s)", i, len(chosen))
        cache = tempfile.mkdtemp(prefix="gbdoctor-run-cache-")
        job = ModeJob(
            spec=spec,
            mode=mode,
            strategy=strategies[mode],
            device=device,
            backend=backend,
            warmup=warmup,
            steps=steps,
            cache_dir=cache,
            # reduce-overhead is inductor's: the cudagraphs mode compiles with it whatever --backend
            cudagraph_layers=cudagraph_layers if mode == "cudagraphs" else (),
        )
        try:
            ranks = run_ranks(
                run_mode_rank,
                job,
                world_size=world,
                device_type=device,
                timeout_s=spec.gbdoctor.timeout_s,
            )
            raw.append((mode, job.strategy, ranks, None))
        except ModeFailure as exc:
            raw.append(
                (mode, job.strategy, None, (_strip_rank(exc.message, world), exc.hint or "runtime"))
            )
        except SpecError:
            raise  # bad input (e.g. a broken model factory) fails every mode alike: exit 2
        except GbdoctorError as exc:
            kind = "timeout" if "did not finish" in exc.message else "crash"
            raw.append((mode, job.strategy, None, (_strip_rank(exc.message, world), kind)))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    if progress:
        progress("done", len(chosen), len(chosen))
    return build_report(
        spec,
        raw,
        device=device,
        backend=backend,
        warmup=warmup,
        steps=steps,
        torch_version=torch_version(),
        load=(max(loads, default=_load_average()), os.cpu_count() or 1),
    )


def _load_average() -> float:
    """1-minute load average before a mode starts (0 where the OS has none). It still counts the
    previous mode's ranks for a while, hence the margin of ``world`` in ``build_report``."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def _strip_rank(message: str, world: int) -> str:
    """``rank 0: ...`` is noise on a single-rank job."""
    first = (message.strip().splitlines() or [""])[0]
    if world == 1:
        first = re.sub(r"^rank 0( failed)?: ", "", first)
    return first[:400]


def _flags(strategy: Strategy) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in strategy.flags))


def _mode_from_ranks(
    mode: str, strategy: Strategy, ranks: list[RankRun], tokens_per_step: int, warmup: int
) -> ModeResult:
    steps = [max(r.step_times[i] for r in ranks) for i in range(len(ranks[0].step_times))]
    warm = [max(r.warmup_times[i] for r in ranks) for i in range(len(ranks[0].warmup_times))]
    median = statistics.median(steps)
    worst = max(
        ranks, key=lambda r: (sum(e.measured and not e.limit_hit for e in r.recompiles), -r.rank)
    )
    rank0 = ranks[0]
    layout = rank0.layout
    return ModeResult(
        mode=mode,
        strategy=strategy.name,
        status="ok",
        step_times_s=tuple(steps),
        warmup_times_s=tuple(warm),
        step_time_median_s=median,
        step_time_min_s=min(steps),
        step_time_max_s=max(steps),
        tokens_per_s=tokens_per_step / median if median > 0 else None,
        compile_time_s=max(0.0, sum(warm) - warmup * median),
        dynamo_compile_s=rank0.dynamo_compile_s,
        peak_memory_mib=max(r.peak_memory_mib for r in ranks),
        memory_metric=rank0.memory_metric,
        graphs=rank0.graphs,
        graphs_measured=rank0.graphs_measured,
        graph_breaks=rank0.graph_breaks,
        regions=sum(len(regions) for _, regions, _ in layout),
        fullgraph_regions=sum(len(fg) for _, _, fg in layout),
        recompiles=sum(e.measured and not e.limit_hit for e in worst.recompiles),
        recompile_events=tuple(worst.recompiles),
        recompile_limit_hit=any(r.recompile_limit_hit for r in ranks),
        cudagraph_skips=tuple(rank0.cudagraph_skips),
        losses=tuple(rank0.losses),
        dynamo_config=_flags(strategy),
    )


def build_report(
    spec: Spec,
    raw: list[tuple[str, Strategy, list[RankRun] | None, tuple[str, str] | None]],
    *,
    device: str,
    backend: str,
    warmup: int,
    steps: int,
    torch_version: str,
    load: tuple[float, int] | None = None,
) -> RunReport:
    """Per-rank measurements -> records, with speedups, loss checks, duplicates and findings."""
    world = spec.parallelism.world_size
    tokens_per_step = spec.capture_batch_size * spec.capture_seq_len * world
    results: dict[str, ModeResult] = {}
    layouts: dict[str, Any] = {}
    for mode, strategy, ranks, failure in raw:
        if ranks is None:
            error, kind = failure or ("unknown failure", "crash")
            results[mode] = ModeResult(
                mode=mode,
                strategy=strategy.name,
                status="unavailable" if kind == "unavailable" else "failed",
                error=error,
                error_kind=kind,
                dynamo_config=_flags(strategy),
            )
        else:
            results[mode] = _mode_from_ranks(mode, strategy, ranks, tokens_per_step, warmup)
            layouts[mode] = _relative_layout(ranks[0].layout)

    ok = {m: r for m, r in results.items() if r.status == "ok" and r.step_time_median_s}
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
        if res.status == "ok":
            median = res.step_time_median_s
            if eager is not None and median:
                updates["speedup_vs_eager"] = eager.step_time_median_s / median
            if best is not None and median:
                updates["speedup_vs_best_baseline"] = ok[best].step_time_median_s / median
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
        elif res.status == "unavailable":
            pass  # not a finding: nothing failed (the reason is the mode's ``error``)
        else:
            findings.append(f"{mode} failed ({res.error_kind}): {res.error}")
        final.append(_replace(res, notes=tuple(notes), **updates))
    if eager is None:
        report_notes.append(
            "no successful eager run: speedups vs eager and loss checks are unavailable"
        )
    if best is None:
        report_notes.append(
            "no successful baseline mode: speedups vs the best baseline are unavailable"
        )
    if device == "cpu":
        report_notes.append(
            "peak memory on CPU is the rank process's peak RSS (torch and compilation included)"
        )
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
        best_baseline=best,
        findings=tuple(findings),
        notes=tuple(report_notes),
    )


def _replace(res: ModeResult, **changes: Any) -> ModeResult:
    from dataclasses import replace

    return replace(res, **changes)


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
    # Version 1 lacks what version 2 added (with defaults): it is read as the current version.
    return load_record(RunReport, data | {"schema_version": RUN_SCHEMA_VERSION}, "run report")
