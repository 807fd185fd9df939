"""A shape stream's timeline predicted, not trained (``gbdoctor timeline --shapes S --predict``).

What Dynamo does at a step depends on the shapes it has seen before, not on the step: a call
whose input shapes match a cached graph runs it, a call that matches none compiles (the first
new size makes the size dynamic: automatic dynamic shapes), and past ``recompile_limit`` a call
that matches none runs eagerly. So each rank's steps are grouped into shape classes (the
``(batch, seq)`` its model gets; for a packed stream also whether a row holds several
documents, ``calls.docs_kind``), and the real setup (the same spawned ranks, framework,
strategy, backend and Dynamo settings as the timeline) walks the stream, forward only, and
calls the model at a step only where the outcome may be new (``calls.CallPlan``): the first
step of a class, or a later one when something compiled since the class's last call (a graph
compiled in between, a dynamic one that Dynamo tries first, may take that shape too: a new
input shape for that graph, a CUDA-graph recording). That drives Dynamo through the same
decisions as the training run, in the same order. Every other step gets the outcome of its
class's last call: no compile, and eager exactly where that call ran eagerly.

The forward is a training step's forward with autograd recording (Dynamo guards on grad
mode), without its backward and optimizer step: frames are converted in the forward, so the
decisions are the same; what the steps' values change (a step counter, a schedule) is not a
shape and is not predicted. Ranks decide together (a step calls on every rank when it does on
one) so that FSDP's collectives pair up; the extra calls hit the cache.
``tests/timeline/test_shapes.py`` checks a prediction against the real timeline of the same stream.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from gbdoctor.errors import GbdoctorError
from gbdoctor.records import RunSettings, Spec
from gbdoctor.records.shapes import ShapeStream
from gbdoctor.records.timeline import TimelineReport
from gbdoctor.run.worker import ModeFailure
from gbdoctor.timeline.calls import docs_kind, with_stream
from gbdoctor.timeline.train import (
    RankTimeline,
    RawStep,
    TimelineJob,
    _job,
    _run_ranks,
)

PREDICT_BACKEND = "eager"
"""What the prediction's calls compile with: Dynamo's ``eager`` backend runs the graphs Dynamo
captured as they are. Recompiles, dynamic dims and limit hits are Dynamo's decisions, made
before a backend sees the graph, so they need no backend compile (most of a compile's time with
``aot_eager`` or inductor). A backend can add shape guards of its own while it compiles a
dynamic graph (inductor's lowering can); ``compile_with="same"`` (``--predict-backend same``)
predicts with the timeline's backend, at its compile cost."""


ClassKey = tuple[tuple[int, int], str]
"""A shape class: (batch, seq) and what packing feeds beside it (``calls.docs_kind``)."""


def step_keys(job: TimelineJob) -> list[list[ClassKey]]:
    """Per rank (one entry: every rank), each step's shape class."""
    out = []
    for r, rank in enumerate(job.shapes):
        docs = job.packing[r] if job.packing else ((),) * len(rank)
        out.append([(shape, docs_kind(d)) for shape, d in zip(rank, docs, strict=True)])
    return out


def prediction_job(job: TimelineJob) -> TimelineJob:
    """The stream's steps, forward only, calling the model only where its outcome may be new
    (``calls.CallPlan``)."""
    return replace(job, forward_only=True, predict_calls=True)


def _rank_steps(stream_keys: list[ClassKey], run: RankTimeline) -> RankTimeline:
    """The calls of one rank mapped onto the stream's steps (module docstring): a step without a
    call repeats its class's last call, compiling nothing."""
    call_at = {step: call for call, step in enumerate(run.called_steps)}
    latest: dict[ClassKey, int] = {}
    steps: list[RawStep] = []
    cache: dict[str, int] = {}
    for step, key in enumerate(stream_keys):
        own = step in call_at
        if own:
            latest[key] = call_at[step]
        raw = run.steps[latest[key]]
        if own:
            cache = raw.cache_sizes
        shape = key[0]
        steps.append(
            RawStep(
                time_s=0.0,
                phases=(0.0, 0.0, 0.0),
                collective_s=0.0,
                collective_calls=0,
                tokens=shape[0] * shape[1],
                boundary=None,
                compiles=raw.compiles if own else [],
                graph_runs=raw.graph_runs,
                cache_sizes=cache,
                shape=shape,
            )
        )
    return replace(run, steps=steps)


def _prediction_ranks(spec: Spec, job: TimelineJob) -> list[RankTimeline]:
    """The prediction's ranks: spawned as the timeline's, except at world size 1, which runs in
    this process (no process start and imports: most of a short prediction's cost) from a
    fresh compile state, which it leaves as it found it."""
    from gbdoctor.capture.job_state import job_start_state, restore_job_start_state
    from gbdoctor.setup import launched
    from gbdoctor.setup.dist import single_process_group
    from gbdoctor.timeline.train import timeline_rank

    if spec.parallelism.world_size != 1 or launched.current() is not None:
        # The framework's rank preparation was done once, where the job was built
        # (``run.settings.prepare_training``).
        return _run_ranks(job)
    start = job_start_state()
    restore_job_start_state(start)
    try:
        with single_process_group(job.settings.device, spec.gbdoctor.timeout_s):
            return [timeline_rank(job)]
    except ModeFailure as exc:
        raise GbdoctorError(f"prediction failed: {exc.message}", hint=exc.hint) from None
    finally:
        restore_job_start_state(start)


def predict_timeline(
    spec: Spec,
    shapes: ShapeStream,
    settings: RunSettings,
    *,
    mode: str = "as-is",
    plan_path: str | None = None,
    dynamo_config: tuple[tuple[str, str], ...] = (),
    fix: bool = False,
    compile_with: str = PREDICT_BACKEND,
    fix_with: str = "config",
) -> TimelineReport:
    """The timeline ``run_timeline(spec, settings, shapes=shapes, ...)`` would record, predicted
    from forwards at its distinct shape classes (step times 0; ``predicted`` is set).
    ``settings``: ``run.settings.run_settings`` at the capture shape, as ``run_timeline`` takes
    them (the stream replaces their steps, batch and lengths). ``fix``: predict
    again with the proposed fixes and attach the comparison, as ``run_timeline`` does.
    ``compile_with``: the backend the prediction's calls compile with (:data:`PREDICT_BACKEND`;
    ``"same"``: the timeline's own). ``fix_with``: as ``run_timeline``'s."""
    from gbdoctor.timeline.assemble import verify
    from gbdoctor.timeline.train import check_fix_with, fixed_job

    check_fix_with(fix_with)
    job = with_stream(_job(spec, settings, mode, plan_path, dynamo_config), shapes)
    before = _predict(spec, mode, job, compile_with)
    if not fix:
        return before
    fixed = fixed_job(job, before, fix_with)
    if fixed is None:
        return replace(before, notes=(*before.notes, "--fix: nothing to apply"))
    after = _predict(spec, mode, fixed[0], compile_with)
    return replace(before, verification=verify(before, after, fixed[1]))


def _predict(spec: Spec, mode: str, job: TimelineJob, compile_with: str) -> TimelineReport:
    from gbdoctor.timeline.assemble import build_report

    calls = prediction_job(job)
    if compile_with != "same":
        calls = replace(calls, settings=replace(calls.settings, backend=compile_with))
    try:
        runs = _prediction_ranks(spec, calls)
    except GbdoctorError as exc:
        raise _at_step(exc, job) from None
    shares = step_keys(job)
    # A rank follows its data-parallel rank's shapes (TP ranks share one).
    mapped = [_rank_steps(shares[run.data_rank if len(shares) > 1 else 0], run) for run in runs]
    report = build_report(spec, mode, job, mapped)
    note = (
        f"predicted: {len(runs[0].called_steps)} forward(s) for {job.settings.steps} steps (each "
        "distinct shape class, again after a compile), compiled with "
        f"{calls.settings.backend}; step times are not predicted"
    )
    return replace(report, predicted=True, notes=(*report.notes, note))


def _at_step(exc: GbdoctorError, job: TimelineJob) -> GbdoctorError:
    """A failed call said as the training run would fail: the call's step is the stream's."""
    found = re.search(r"step (\d+): ", exc.message)
    if found is None or int(found.group(1)) >= len(job.shapes[0]):
        return exc
    step = int(found.group(1))
    rest = exc.message[found.end() :]
    return type(exc)(
        f"predicted: training fails at step {step} (shape {job.shapes[0][step]}): {rest}",
        hint=exc.hint,
    )


def events(report: TimelineReport) -> dict[str, Any]:
    """What a prediction promises about a timeline, timings left out: per step its compiles
    (frame, attempt, guard kind, limit hit) and eager frames; per frame its recompile steps,
    limit hit and eager steps; per graph its dynamic dims and the steps it met new shapes."""
    return {
        "steps": [
            (
                [(c.frame, c.attempt, c.guard_kind, c.limit_hit) for c in s.compiles],
                list(s.eager_frames),
            )
            for s in report.steps
        ],
        "frames": [
            (f.frame, f.compiles, f.recompile_steps, f.limit_hit_step, f.eager_steps)
            for f in report.frames
        ],
        "graphs": [
            (g.frame, g.graph, g.compiled_step, g.dynamic, g.shape_steps) for g in report.graphs
        ],
        "ranks": report.rank_compile_steps,
    }
