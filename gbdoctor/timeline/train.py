"""``gbdoctor timeline``: train N steps in one mode and record every step (the library API).

Per rank (fresh spawned processes, as ``run`` does): build the spec's model, set it up with the
spec's framework and the mode's strategy, compiled through a counting backend
(``capture.timeline_hooks.GraphRunCounter``), then train ``steps`` steps on synthetic batches
whose sequence length cycles through ``seq_lens``. After each step it reads: the framework's
phase times, the time spent inside Python-level ``torch.distributed`` collectives, Dynamo's new
``CompilationMetrics`` (compile time, frame, attempt), the ``recompiles`` log (the failed guard,
``capture.recompiles``), graph runs per frame and cache sizes. ``timeline.assemble`` and ``timeline.pattern`` turn the
steps into a warm-up, periods, findings and fixes; ``run_timeline`` can run again with the
fixes applied and compare (``--fix``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from gbdoctor.errors import GbdoctorError, SpecError, exception_line
from gbdoctor.frameworks.interface import Framework
from gbdoctor.records import Recompile, RunSettings, Spec
from gbdoctor.records.shapes import ShapeStream
from gbdoctor.records.timeline import TimelineReport
from gbdoctor.run.worker import ModeFailure
from gbdoctor.timeline.dynamo_settings import dynamo_settings, typed_dynamo_settings

TIMELINE_MODES = ("as-is", "eager", "plan")
"""``as-is``: the spec's own compile strategy ([gbdoctor] strategy, the framework's default);
``eager``: nothing compiled; ``plan``: a plan file's strategy (``--plan``)."""
DEFAULT_TIMELINE_STEPS = 24
"""Enough to see a period of up to 12 twice, and a frame reach the default recompile limit (8)
when it recompiles every step or every other step."""

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all_single",
)
"""``torch.distributed`` functions timed per step (looked up by attribute at call time by
DeepSpeed's and FSDP's Python code, so wrapping the module attribute sees them)."""


@dataclass(frozen=True)
class TimelineJob:
    """What a rank needs (picklable)."""

    spec: Spec
    """As trained (``run.settings.prepare_training``)."""
    framework: Framework
    """The spec's framework, resolved once where the job is built (it travels to the ranks
    with the job, as the strategy does)."""
    strategy: Any
    settings: RunSettings
    """Device, backend, steps, batch and the sequence lengths the steps cycle through."""
    dynamo_config: tuple[tuple[str, str], ...] = ()
    """``torch._dynamo.config`` settings applied for the whole run (the fixes under test)."""
    shapes: tuple[tuple[tuple[int, int], ...], ...] = ()
    """Per data-parallel rank (one entry: every rank), per call of the model: (batch, seq), from
    a ``--shapes`` stream or the prediction's shape classes (``timeline.predict``); empty:
    ``settings.batch_size`` x ``settings.seq_lens``, one call per step."""
    packing: tuple[tuple[tuple[tuple[int, ...], ...], ...], ...] = ()
    """Per data-parallel rank (one entry: every rank), per call: the documents packed into each
    row (``()``: plain rows), parallel to ``shapes``; empty: no call is packed."""
    shapes_source: str = ""
    """The stream's preset or file ("" without one)."""
    shapes_spec: tuple[tuple[str, int], ...] = ()
    """(argument, dim) the compiled blocks get as ``torch.compile(shapes_spec=...)`` dims
    (``timeline.shapes_spec``: the ``--fix-with shapes-spec`` run); empty: none."""
    forward_only: bool = False
    """Each call is a forward and the loss, no backward or optimizer step: the prediction's
    calls, which only need the decisions Dynamo makes when it converts a frame."""
    predict_calls: bool = False
    """Call the model only where Dynamo's outcome may be new (``timeline.calls.CallPlan``): a
    step whose shape class was called since the last compile repeats that call's outcome."""


@dataclass
class RawStep:
    time_s: float
    phases: tuple[float, float, float]
    collective_s: float
    collective_calls: int
    tokens: int
    boundary: bool | None
    compiles: list[Any]
    """``capture.timeline_hooks.CompileEvent`` of this step."""
    graph_runs: dict[int, int]
    cache_sizes: dict[str, int]
    shape: tuple[int, int] = (0, 0)
    """(batch, seq) of this rank's batch."""


@dataclass
class RankTimeline:
    rank: int
    steps: list[RawStep]
    recompiles: list[Recompile]
    frames: dict[int, str]
    """Frame id -> function (from the compiles that named it)."""
    recompile_limit: int
    accumulation_steps: int | None
    lost_metrics: int = 0
    notes: list[str] = field(default_factory=list)
    data_rank: int = 0
    graphs: list[Any] = field(default_factory=list)
    """``capture.timeline_hooks.GraphShapes`` of every compiled graph."""
    called_steps: list[int] = field(default_factory=list)
    """With ``predict_calls``: the steps that called the model (``steps`` holds theirs)."""


class CollectiveClock:
    """Wall time and calls inside ``torch.distributed`` collectives, reset by :meth:`take`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def take(self) -> tuple[float, int]:
        out = (self.seconds, self.calls)
        self.seconds, self.calls = 0.0, 0
        return out


@contextlib.contextmanager
def timed_collectives(enabled: bool) -> Iterator[CollectiveClock]:
    """Wrap the collectives of :data:`COLLECTIVES` with a clock for the block. While Dynamo
    traces, the wrapper calls the original directly (``is_compiling`` is constant under
    tracing), so a collective traced into a graph is traced exactly as without the wrapper."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    clock = CollectiveClock()
    saved: list[tuple[Any, str, Any]] = []
    if enabled:
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None:
                continue

            def wrapper(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                if torch.compiler.is_compiling():
                    return _original(*args, **kwargs)
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    clock.seconds += time.perf_counter() - start
                    clock.calls += 1

            for module in (dist, c10d):
                if getattr(module, name, None) is original:
                    saved.append((module, name, original))
                    setattr(module, name, wrapper)
    try:
        yield clock
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def timeline_rank(job: TimelineJob) -> RankTimeline:
    """One rank of a timeline (a ``run_ranks`` target; the process group is initialized)."""
    import torch
    import torch.distributed as dist

    from gbdoctor.capture.locate import portable_path
    from gbdoctor.capture.recompiles import watch_recompiles
    from gbdoctor.capture.timeline_hooks import (
        GraphRunCounter,
        cache_sizes,
        compile_log,
        recompile_limit,
    )
    from gbdoctor.frameworks.interface import GradientAccumulation
    from gbdoctor.models import vocab_size
    from gbdoctor.models.attention import flex_cpu_backward
    from gbdoctor.setup.train import data_share
    from gbdoctor.timeline.calls import (
        CallPlan,
        call_batch,
        call_docs,
        call_shape,
        forward_step,
        packed_inputs,
        packing_note,
    )
    from gbdoctor.timeline.shapes_spec import shapes_spec_fix

    spec, settings = job.spec, job.settings
    rank, world = dist.get_rank(), dist.get_world_size()

    def path_fn(path: str) -> str:
        return portable_path(path, spec.root or None)

    counter = GraphRunCounter(settings.backend)
    recipe = job.framework
    # Collectives are wrapped before the setup: frameworks bind them at initialization
    # (DeepSpeed's comm backend keeps torch.distributed's functions as attributes).
    with dynamo_settings(job.dynamo_config), timed_collectives(world > 1) as clock:
        try:
            model, meshes = recipe.build(spec, settings.device)
            # The counting backend stands where the backend's name would.
            setup = recipe.set_up(model, spec, meshes, strategy=job.strategy, backend=counter)  # type: ignore[arg-type]
            vocab = vocab_size(model)
        except GbdoctorError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as the run's failure
            raise ModeFailure(f"setup: {exception_line(exc)}", "setup") from exc
        accumulation = recipe.accumulation if isinstance(recipe, GradientAccumulation) else None
        sync = torch.cuda.synchronize if settings.device == "cuda" else None
        steps: list[RawStep] = []
        first_acc = accumulation(setup) if accumulation is not None else None
        notes = [n for n in [packing_note(setup.model, job)] if n is not None]
        with (
            watch_recompiles(path_fn) as watch,
            compile_log(path_fn) as clog,
            recipe.step_context(setup),
            flex_cpu_backward(settings.device),
            shapes_spec_fix(setup.model, job.shapes_spec),
        ):
            clog.take()  # compiles of the setup itself (none so far) are not a step's
            calls = len(job.shapes[0]) if job.shapes else settings.steps
            plan = CallPlan(world > 1) if job.predict_calls else None
            called: list[int] = []
            for step in range(calls):
                batch, seq = call_shape(job, step, meshes)
                docs = call_docs(job, step, meshes)
                if plan is not None and not plan.needed((batch, seq), docs):
                    continue
                called.append(step)
                watch.tag(step=step, measured=True)
                counter.call = step
                tokens, labels = call_batch(spec, meshes, vocab, step, batch, seq, job)
                boundary = accumulation(setup)[1] if accumulation is not None else None
                if world > 1:
                    dist.barrier()
                if sync is not None:
                    sync()
                clock.take()
                counter.take()
                start = time.perf_counter()
                try:
                    with packed_inputs(setup.model, docs, meshes.device):
                        if job.forward_only:
                            phases = forward_step(setup, tokens, labels)
                        else:
                            _, phases = recipe.timed_train_step(setup, tokens, labels, sync=sync)
                except Exception as exc:  # noqa: BLE001 - reported as the run's failure
                    from gbdoctor.capture.counters import failure_kind

                    raise ModeFailure(
                        f"step {step}: {exception_line(exc)}", failure_kind(exc)
                    ) from exc
                elapsed = time.perf_counter() - start
                coll_s, coll_n = clock.take()
                compiles = clog.take()
                if plan is not None:
                    plan.called((batch, seq), docs, len(compiles))
                steps.append(
                    RawStep(
                        time_s=elapsed,
                        phases=phases,
                        collective_s=coll_s,
                        collective_calls=coll_n,
                        tokens=batch * seq,
                        boundary=boundary,
                        compiles=compiles,
                        graph_runs=counter.take(),
                        cache_sizes=cache_sizes(path_fn),
                        shape=(batch, seq),
                    )
                )
            lost = clog.lost
            limit = recompile_limit()
    recipe.release_rank()
    frames: dict[int, str] = {}
    for raw in steps:
        for event in raw.compiles:
            if event.function and event.frame_id not in frames:
                frames[event.frame_id] = event.function
    return RankTimeline(
        rank=rank,
        steps=steps,
        recompiles=watch.records,
        frames=frames,
        recompile_limit=limit,
        accumulation_steps=first_acc[0] if first_acc is not None else None,
        lost_metrics=lost,
        data_rank=data_share(meshes)[0],
        graphs=counter.graph_shapes(),
        notes=notes,
        called_steps=called,
    )


def run_timeline(
    spec: Spec,
    settings: RunSettings,
    *,
    mode: str = "as-is",
    plan_path: str | None = None,
    dynamo_config: tuple[tuple[str, str], ...] = (),
    fix: bool = False,
    shapes: ShapeStream | None = None,
    fix_with: str = "config",
) -> TimelineReport:
    """Train ``spec`` ``settings.steps`` steps in ``mode`` and explain the step-time pattern.

    ``settings``: ``run.settings.run_settings`` at the capture shape (``Shape.CAPTURE``: the
    steps cycle through its sequence lengths). ``dynamo_config``: ``torch._dynamo.config``
    settings for the run. ``fix``: apply the proposed fixes, run again, and attach the
    comparison (``TimelineReport.verification``). ``shapes``: a shape stream
    (``records.shapes``) the steps follow instead of the settings' sequence lengths and batch,
    one step per stream step (``timeline.calls.with_stream``: the job's settings take the
    stream's length as steps). ``fix_with``: ``config`` (the findings' Dynamo settings) or
    ``shapes-spec`` (``torch.compile(shapes_spec=...)`` over the dims that changed size:
    ``timeline.shapes_spec``). Bad input raises SpecError (exit 2)."""
    from gbdoctor.timeline.assemble import build_report, verify

    check_fix_with(fix_with)
    job = _job(spec, settings, mode, plan_path, dynamo_config)
    if shapes is not None:
        from gbdoctor.timeline.calls import with_stream

        job = with_stream(job, shapes)
    before = build_report(spec, mode, job, _run_ranks(job))
    if not fix:
        return before
    fixed = fixed_job(job, before, fix_with)
    if fixed is None:
        return replace(before, notes=(*before.notes, "--fix: nothing to apply"))
    fixed_job_, applied = fixed
    after = build_report(spec, mode, fixed_job_, _run_ranks(fixed_job_))
    return replace(before, verification=verify(before, after, applied))


def check_fix_with(fix_with: str) -> None:
    """SpecError (exit 2) for an unknown ``--fix-with`` or a torch without ``shapes_spec``,
    before anything runs."""
    from gbdoctor.timeline.shapes_spec import FIX_WITH, unsupported_reason

    if fix_with not in FIX_WITH:
        raise SpecError(f"--fix-with {fix_with[:40]}: expected one of {', '.join(FIX_WITH)}")
    if fix_with == "shapes-spec" and (why := unsupported_reason()) is not None:
        raise SpecError(f"--fix-with shapes-spec: {why}", hint="use --fix-with config")


def fixed_job(
    job: TimelineJob, before: TimelineReport, fix_with: str
) -> tuple[TimelineJob, tuple[tuple[str, str], ...]] | None:
    """The job with the fixes applied and what was applied; None: nothing to apply."""
    fixes = _fix_settings(before)
    if not fixes:
        return None
    if fix_with == "shapes-spec":
        from gbdoctor.timeline.shapes_spec import describe, spec_dims

        dims = spec_dims(before)
        return replace(job, shapes_spec=dims), describe(dims)
    return replace(job, dynamo_config=tuple(dict((*job.dynamo_config, *fixes)).items())), fixes


def _fix_settings(report: TimelineReport) -> tuple[tuple[str, str], ...]:
    settings: dict[str, str] = {}
    for finding in report.findings:
        if finding.fix is not None:
            settings.update(dict(finding.fix.config))
    return tuple(sorted(settings.items()))


def _run_ranks(job: TimelineJob) -> list[RankTimeline]:
    from gbdoctor.setup.dist import run_ranks

    try:
        out: list[RankTimeline] = run_ranks(
            timeline_rank,
            job,
            world_size=job.settings.ranks,
            device_type=job.settings.device,
            timeout_s=job.spec.gbdoctor.timeout_s,
        )
    except ModeFailure as exc:
        raise GbdoctorError(f"timeline failed: {exc.message}", hint=exc.hint) from None
    return out


def _job(
    spec: Spec,
    settings: RunSettings,
    mode: str,
    plan_path: str | None,
    dynamo_config: tuple[tuple[str, str], ...],
) -> TimelineJob:
    from gbdoctor.frameworks.registry import framework_for
    from gbdoctor.run.settings import prepare_training

    if mode not in TIMELINE_MODES:
        raise SpecError(
            f"unknown timeline mode {mode!r}", hint=f"valid modes: {', '.join(TIMELINE_MODES)}"
        )
    typed = typed_dynamo_settings(dynamo_config)  # refused here, not in the ranks
    if typed.get("enable_compiler_collectives") and settings.device == "cpu":
        raise SpecError(
            "--dynamo-config enable_compiler_collectives=true needs an accelerator: torch "
            "2.13 places its compile-time all-gather on device `rank % "
            "torch.accelerator.device_count()` (0 on CPU: Dynamo fails at the first compile)",
            hint="run it on CUDA ranks, or fix the divergence with --fix (sizes dynamic from "
            "the first compile)",
        )
    if mode == "plan" and not plan_path:
        raise SpecError("mode 'plan' needs --plan FILE", hint="make one with `gbdoctor plan SPEC`")
    if plan_path and mode != "plan":
        raise SpecError("--plan FILE is for --mode plan", hint="add --mode plan or drop --plan")
    framework = framework_for(spec)
    table = framework.strategies
    if mode == "eager":
        strategy = table["none"]
    elif mode == "plan":
        from gbdoctor.plan import plan_strategy, read_plan

        plan, identity = read_plan(str(plan_path))
        strategy = plan_strategy(plan, spec, identity=identity)
    else:
        name = spec.gbdoctor.strategy
        if name not in table:
            raise SpecError(
                f"strategy {name!r} is not one of the {framework.title} strategies",
                hint=f"valid: {', '.join(sorted(table))}",
            )
        strategy = table[name]
    run_spec, _ = prepare_training(spec, settings, framework, command="timeline")
    return TimelineJob(
        spec=run_spec,
        framework=framework,
        strategy=strategy,
        settings=settings,
        dynamo_config=dynamo_config,
    )
