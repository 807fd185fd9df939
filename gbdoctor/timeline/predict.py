"""A shape stream's timeline predicted, not trained (``gbdoctor timeline --shapes S --predict``).

What Dynamo does at a step depends on the shapes it has seen before, not on the step: a call
whose input shapes match a cached graph runs it, a call that matches none compiles (the first
new size makes the size dynamic: automatic dynamic shapes), and past ``recompile_limit`` a call
that matches none runs eagerly. So each rank's steps are grouped into shape classes (the
``(batch, seq)`` its model gets), and the real setup (the same spawned ranks, framework,
strategy, backend and Dynamo settings as the timeline) makes ONE forward per class, in the
order the classes first appear in the stream: that drives Dynamo through the same decisions as
the training run, once each. A packed stream's classes also say whether a row holds several
documents (``calls.docs_kind``), and each class's call packs the documents of its first step. Every step then gets the outcome of its class: its first
appearance gets the compiles, guards and limit hits of the class's call; a later appearance
compiles nothing and runs eagerly exactly where the class's call did (a class that found no
graph past the limit finds none later either).

The forward is a training step's forward with autograd recording (Dynamo guards on grad
mode), without its backward and optimizer step: frames are converted in the forward, so the
decisions are the same; what the steps' values change (a step counter, a schedule) is not a
shape and is not predicted. Ranks with fewer classes repeat their last one so that every rank
makes the same number of calls (FSDP's collectives pair up); a repeat hits the cache.
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


def shape_classes(job: TimelineJob) -> list[list[ClassKey]]:
    """Per rank, its distinct shape classes in the order they first appear. A packed batch's
    documents are values (positions, a mask's contents), not shapes; whether a row holds one
    document or several is not: Hugging Face builds a document mask only for the latter."""
    return [list(dict.fromkeys(rank)) for rank in step_keys(job)]


def prediction_job(job: TimelineJob) -> TimelineJob:
    """One forward per shape class per rank (with the documents of its first step), every rank
    the same number of calls."""
    keys = step_keys(job)
    shapes, packing = [], []
    for r, rank in enumerate(keys):
        first: dict[ClassKey, int] = {}
        for i, key in enumerate(rank):
            first.setdefault(key, i)
        firsts = list(first.values())  # in order of first appearance
        shapes.append([job.shapes[r][i] for i in firsts])
        packing.append([job.packing[r][i] if job.packing else () for i in firsts])
    calls = max(len(c) for c in shapes)
    pad = [c + [c[-1]] * (calls - len(c)) for c in shapes]
    pad_docs = [c + [c[-1]] * (calls - len(c)) for c in packing]
    return replace(
        job,
        shapes=tuple(tuple(c) for c in pad),
        packing=tuple(tuple(c) for c in pad_docs) if job.packing else (),
        forward_only=True,
        settings=replace(job.settings, steps=calls),
    )


def _rank_steps(stream_keys: list[ClassKey], run: RankTimeline) -> RankTimeline:
    """The class calls of one rank mapped onto the stream's steps (module docstring)."""
    order = list(dict.fromkeys(stream_keys))
    call_of = {key: i for i, key in enumerate(order)}
    first_step: dict[int, int] = {}
    for step, key in enumerate(stream_keys):
        first_step.setdefault(call_of[key], step)
    steps: list[RawStep] = []
    cache: dict[str, int] = {}
    for step, (shape, kind) in enumerate(stream_keys):
        call = call_of[(shape, kind)]
        raw = run.steps[call]
        first = first_step[call] == step
        if first:
            cache = raw.cache_sizes
        steps.append(
            RawStep(
                time_s=0.0,
                phases=(0.0, 0.0, 0.0),
                collective_s=0.0,
                collective_calls=0,
                tokens=shape[0] * shape[1],
                boundary=None,
                compiles=raw.compiles if first else [],
                graph_runs=raw.graph_runs,
                cache_sizes=cache,
                shape=shape,
            )
        )
    recompiles = [
        replace(rec, step=first_step[rec.step]) for rec in run.recompiles if rec.step in first_step
    ]
    graphs = [
        replace(
            g,
            compiled_at=first_step.get(g.compiled_at, g.compiled_at),
            new_shape_calls=tuple(
                sorted(first_step[c] for c in g.new_shape_calls if c in first_step)
            ),
        )
        for g in run.graphs
        if g.compiled_at in first_step
    ]
    return replace(run, steps=steps, recompiles=recompiles, graphs=graphs)


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
    from one forward per distinct shape class (step times 0; ``predicted`` is set).
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
        f"predicted: {calls.settings.steps} forward(s), one per distinct shape class, for "
        f"{job.settings.steps} steps, compiled with {calls.settings.backend}; step times are not "
        "predicted"
    )
    return replace(report, predicted=True, notes=(*report.notes, note))


def _at_step(exc: GbdoctorError, job: TimelineJob) -> GbdoctorError:
    """A failed call said as the training run would fail: at the step where its shape class
    first appears (rank 0's stream)."""
    order = shape_classes(job)[0]
    found = re.search(r"step (\d+): ", exc.message)
    if found is None or int(found.group(1)) >= len(order):
        return exc
    key = order[int(found.group(1))]
    step = step_keys(job)[0].index(key)
    rest = exc.message[found.end() :]
    return type(exc)(
        f"predicted: training fails at step {step} (shape {key[0]}): {rest}",
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
