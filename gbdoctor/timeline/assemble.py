"""From the ranks' raw steps to a :class:`TimelineReport` (``gbdoctor timeline``): the slowest
rank per step, each compile paired with its failed guard, eager fallbacks, frames; the report
with its findings (``timeline.pattern``), and the comparison of a run with its fixes.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from gbdoctor.records import Recompile, Spec
from gbdoctor.records.timeline import (
    TIMELINE_SCHEMA_VERSION,
    FrameTimeline,
    StepCompile,
    TimelineGraph,
    TimelineReport,
    TimelineStep,
    TimelineVerification,
)
from gbdoctor.timeline.pattern import classify_guard, findings, verdict, warmup_steps

SOURCES = (
    "torch._dynamo.utils.get_compilation_metrics(): compile id, frame, attempt, compile time",
    "recompiles log (torch._dynamo.guards.__recompiles): the failed guard and Dynamo's hint",
    "torch._dynamo.convert_frame warning: recompile_limit hits",
    "counting backend: compiled-graph runs per frame and step (eager fallback)",
    "torch._C._dynamo.eval_frame._debug_get_cache_entry_list: cache entries per frame",
)


# --------------------------------------------------------------------------- steps


def _slowest(runs: list[Any]) -> list[dict[str, Any]]:
    """Per step, the slowest rank's times (collectives and compile time too); events from rank 0."""
    out = []
    for i, base in enumerate(runs[0].steps):
        per_rank = [r.steps[i] for r in runs]
        slow = max(per_rank, key=lambda s: s.time_s)
        out.append(
            {
                "time_s": slow.time_s,
                "phases": slow.phases,
                "collective_s": max(s.collective_s for s in per_rank),
                "collective_calls": base.collective_calls,
                "tokens": base.tokens,
                "boundary": base.boundary,
                "compiles": base.compiles,
                "graph_runs": base.graph_runs,
                "cache_sizes": base.cache_sizes,
            }
        )
    return out


def _step_compiles(
    raw: dict[str, Any], recompiles: list[Recompile], frames: dict[int, str]
) -> tuple[StepCompile, ...]:
    """The step's compiles, each forward recompile paired with its ``recompiles`` log record
    (same function, in order); limit hits from the warning's records."""
    pending: dict[str, list[Recompile]] = defaultdict(list)
    limit_hits: list[Recompile] = []
    for rec in recompiles:
        (limit_hits if rec.limit_hit else pending[rec.function]).append(rec)
    out = []
    for event in raw["compiles"]:
        if not event.forward:
            continue
        frame = frames.get(event.frame_id, event.function or f"frame {event.frame_id}")
        if event.failure and not event.function and limit_hits:
            rec = limit_hits.pop(0)
            kind, plain = classify_guard(rec.reason, rec.hint)
            out.append(
                StepCompile(
                    frame=frame,
                    attempt=event.attempt,
                    compile_s=event.compile_s,
                    guard=rec.reason,
                    guard_kind=kind,
                    plain=plain,
                    limit_hit=True,
                )
            )
            continue
        if event.attempt == 0 or event.failure:
            out.append(StepCompile(frame=frame, attempt=event.attempt, compile_s=event.compile_s))
            continue
        queue = pending.get(frame) or []
        found: Recompile | None = queue.pop(0) if queue else None
        reason = found.reason if found else event.recompile_reason
        kind, plain = classify_guard(reason, found.hint if found else "")
        out.append(
            StepCompile(
                frame=frame,
                attempt=event.attempt,
                compile_s=event.compile_s,
                guard=reason,
                guard_kind=kind,
                plain=plain,
            )
        )
    return tuple(out)


def _eager_frames(
    raws: list[dict[str, Any]], compiles: list[tuple[StepCompile, ...]], frames: dict[int, str]
) -> list[tuple[str, ...]]:
    """Per step, the frames past their limit whose graphs ran fewer times than in their busiest
    step (``RUN_ONLY``: a call matching no cache entry runs eagerly, logging nothing)."""
    hit_at: dict[str, int] = {}
    for i, step in enumerate(compiles):
        for c in step:
            if c.limit_hit:
                hit_at.setdefault(c.frame, i)
    ids = {name: fid for fid, name in frames.items()}
    out: list[tuple[str, ...]] = []
    busiest = {
        name: max(r["graph_runs"].get(ids.get(name, -2), 0) for r in raws) for name in hit_at
    }
    for i, raw in enumerate(raws):
        eager = [
            name
            for name, h in hit_at.items()
            if i >= h and raw["graph_runs"].get(ids.get(name, -2), 0) < busiest[name]
        ]
        out.append(tuple(sorted(eager)))
    return out


def build_steps(
    runs: list[Any],
) -> tuple[list[TimelineStep], dict[int, str], list[dict[str, Any]]]:
    raws = _slowest(runs)
    frames = dict(runs[0].frames)
    by_step: dict[int, list[Recompile]] = defaultdict(list)
    for rec in runs[0].recompiles:
        by_step[rec.step].append(rec)
    compiles = [_step_compiles(r, by_step[i], frames) for i, r in enumerate(raws)]
    eager = _eager_frames(raws, compiles, frames)
    steps = []
    for i, r in enumerate(raws):
        f, b, o = r["phases"]
        steps.append(
            TimelineStep(
                step=i,
                time_s=r["time_s"],
                forward_s=f,
                backward_s=b,
                optimizer_s=o,
                collective_s=r["collective_s"],
                collective_calls=r["collective_calls"],
                compile_s=sum(e.compile_s for e in r["compiles"]),
                tokens=r["tokens"],
                boundary=r["boundary"],
                compiles=compiles[i],
                graph_runs=sum(r["graph_runs"].values()),
                eager_frames=eager[i],
                cache_entries=sum(r["cache_sizes"].values()),
            )
        )
    return steps, frames, raws


def _frames(steps: list[TimelineStep], raws: list[dict[str, Any]]) -> tuple[FrameTimeline, ...]:
    final = raws[-1]["cache_sizes"] if raws else {}
    recompiled = {c.frame for s in steps for c in s.compiles if c.attempt > 0 or c.limit_hit}
    names = sorted(set(final) | recompiled)
    out = []
    for name in names:
        comp = [(s.step, c) for s in steps for c in s.compiles if c.frame == name]
        hit = next((i for i, c in comp if c.limit_hit), None)
        out.append(
            FrameTimeline(
                frame=name,
                cache_size=final.get(name, 0),
                compiles=sum(1 for _, c in comp if not c.limit_hit),
                recompile_steps=tuple(
                    sorted({i for i, c in comp if c.attempt > 0 and not c.limit_hit})
                ),
                limit_hit_step=hit,
                eager_steps=tuple(s.step for s in steps if name in s.eager_frames),
            )
        )
    return tuple(out)


def _graphs(runs: list[Any], frames: dict[int, str]) -> tuple[TimelineGraph, ...]:
    """Rank 0's compiled graphs (``capture.timeline_hooks.GraphShapes``)."""
    return tuple(
        TimelineGraph(
            frame=frames.get(g.frame_id, f"frame {g.frame_id}"),
            graph=g.index,
            compiled_step=g.compiled_at,
            dynamic=g.dynamic,
            shape_steps=g.new_shape_calls,
        )
        for g in runs[0].graphs
    )


def _rank_compile_steps(runs: list[Any]) -> tuple[tuple[int, ...], ...]:
    if len(runs) < 2:
        return ()
    return tuple(
        tuple(i for i, raw in enumerate(run.steps) if any(e.forward for e in raw.compiles))
        for run in runs
    )


COLLECTIVES_NOTE = (
    "; on accelerator ranks torch._dynamo.config.enable_compiler_collectives=True makes a size "
    "that differs across ranks at a compile dynamic on every rank at once (it needs the ranks "
    "to compile together: sizes equal at the first compile still diverge later)"
)
"""What compiler collectives change for diverging ranks (torch 2.13: only automatic dynamic
shapes, by an all-gather of the ranks' input sizes inside each compile); not runnable on CPU
(``timeline.train._job`` refuses it there)."""


def build_report(spec: Spec, mode: str, job: Any, runs: list[Any]) -> TimelineReport:
    from gbdoctor.capture import torch_version

    steps, frames, raws = build_steps(runs)
    warmup = warmup_steps(steps)
    limit = runs[0].recompile_limit
    found, periods = findings(steps, warmup, limit)
    notes = []
    if runs[0].lost_metrics:
        notes.append("Dynamo's compile metrics overflowed in some step: its compiles are partial")
    per_rank = _rank_compile_steps(runs)
    if len(set(per_rank)) > 1:
        notes.append(
            "ranks compile in different steps (they diverge): "
            + "; ".join(f"rank {r}: {list(steps)}" for r, steps in enumerate(per_rank))
            + COLLECTIVES_NOTE
        )
    notes.extend(dict.fromkeys(n for run in runs for n in run.notes))
    if job.dynamo_config:
        notes.append("torch._dynamo.config: " + ", ".join(f"{k}={v}" for k, v in job.dynamo_config))
    return TimelineReport(
        schema_version=TIMELINE_SCHEMA_VERSION,
        spec=spec.key,
        # The registry keys every framework by its name: the spec's [gbdoctor] framework.
        framework=spec.gbdoctor.framework,
        mode=mode,
        strategy=job.strategy.name,
        backend=job.settings.backend,
        device=job.settings.device,
        world_size=len(runs),
        torch_version=torch_version(),
        recompile_limit=limit,
        seq_lens=job.settings.seq_lens,
        batch_size=job.settings.batch_size,
        steps=tuple(steps),
        frames=_frames(steps, raws),
        warmup_steps=warmup,
        findings=tuple(found),
        periods=tuple(periods),
        accumulation_steps=runs[0].accumulation_steps,
        verdict=verdict(found, warmup),
        sources=SOURCES,
        notes=tuple(notes),
        graphs=_graphs(runs, frames),
        rank_compile_steps=_rank_compile_steps(runs),
        shapes=getattr(job, "shapes_source", ""),
    )


def _counts(report: TimelineReport) -> tuple[int, int, int, int]:
    recompiles = sum(
        1 for s in report.steps for c in s.compiles if c.attempt > 0 and not c.limit_hit
    )
    hits = sum(1 for s in report.steps for c in s.compiles if c.limit_hit)
    eager = sum(1 for s in report.steps if s.eager_frames)
    steady = sum(
        1
        for s in report.steps[report.warmup_steps :]
        for c in s.compiles
        if c.attempt > 0 or c.limit_hit
    )
    return recompiles, hits, eager, steady


def verify(
    before: TimelineReport, after: TimelineReport, applied: tuple[tuple[str, str], ...]
) -> TimelineVerification:
    b, a = _counts(before), _counts(after)
    # Gone: no limit hit, no eager step, and the recompiles stop: none in the second half of
    # the run (bounded variants still compile once each, early; a persisting pattern recurs).
    tail = after.steps[len(after.steps) // 2 :]
    late = [c for s in tail for c in s.compiles if c.attempt > 0 or c.limit_hit]
    gone = not late and a[1] == 0 and a[2] == 0

    def med(r: TimelineReport) -> float | None:
        steady = [s.time_s for s in r.steps[r.warmup_steps :]]
        return statistics.median(steady) if steady else None

    return TimelineVerification(
        applied=applied,
        before_recompiles=b[0],
        after_recompiles=a[0],
        before_limit_hits=b[1],
        after_limit_hits=a[1],
        before_eager_steps=b[2],
        after_eager_steps=a[2],
        before_steady_recompiles=b[3],
        after_steady_recompiles=a[3],
        gone=gone,
        before_median_s=med(before),
        after_median_s=med(after),
        after_steps=after.steps,
    )
