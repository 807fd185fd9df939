"""The CUDA-graph readiness verdict of one block kind, from the findings ``capture.cudagraphs``
read in its captured graphs and the events that sent a region to eager."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from gbdoctor.records import (
    BlockerEffect,
    CudaGraphFinding,
    CudaGraphReadiness,
    Event,
    EventKind,
    Readiness,
)


def readiness(
    findings: Sequence[CudaGraphFinding], graphs: int, eager: Sequence[Event] = ()
) -> CudaGraphReadiness:
    """The verdict for one block kind: ``ready``, ``ready with N static copies``, or ``blocked by``;
    ``eager`` when nothing was compiled because a break sent the region to eager (``eager``: the
    block's ``region_eager`` and ``frame_skipped`` events), naming the break to fix first. A
    region that runs eagerly next to compiled code is named in the summary as well."""
    ordered = tuple(sorted(findings, key=_order))
    blocking = Counter(f.kind for f in ordered if f.effect == BlockerEffect.BLOCKS)
    copies = sum(1 for f in ordered if f.effect == BlockerEffect.COPY)
    rerecord = Counter(f.kind for f in ordered if f.effect == BlockerEffect.RERECORD)
    allowed = Counter(f.kind for f in ordered if f.effect == BlockerEffect.ALLOWED)
    ran_eagerly = "; ".join(_eager_note(e) for e in eager)
    if graphs == 0 and ran_eagerly:
        status, summary = Readiness.EAGER, ran_eagerly
    elif graphs == 0:
        status, summary = Readiness.UNKNOWN, "no compiled graph captured"
    elif blocking:
        status = Readiness.BLOCKED
        summary = "blocked by " + ", ".join(f"{k} ({n})" for k, n in sorted(blocking.items()))
    elif copies:
        status, summary = (
            Readiness.READY,
            f"ready with {copies} static cop{'y' if copies == 1 else 'ies'}",
        )
    else:
        status, summary = Readiness.READY, "ready"
    notes = [f"re-recorded per distinct {k} ({n})" for k, n in sorted(rerecord.items())]
    notes += [f"{k} ({n}) allowed" for k, n in sorted(allowed.items())]
    if ran_eagerly and status != Readiness.EAGER:
        notes.append(ran_eagerly)
    if notes and status not in (Readiness.UNKNOWN, Readiness.EAGER):
        summary += "; " + "; ".join(notes)
    return CudaGraphReadiness(
        status=status, summary=summary, static_copies=copies, graphs=graphs, findings=ordered
    )


def _eager_note(event: Event) -> str:
    """``layers.1 runs eagerly (a break inside its activation-checkpoint region): fix
    "Failed to trace builtin operator" at model.py:42 first``."""
    why = (
        "a break inside its activation-checkpoint region"
        if event.kind == EventKind.REGION_EAGER
        else "Dynamo abandoned a frame of it"
    )
    at = f" at {event.location}" if event.location else ""
    fix = f': fix "{event.gb_type}"{at} first' if event.gb_type else ""
    return f"{event.module} runs eagerly, nothing to graph ({why}){fix}"


def _order(f: CudaGraphFinding) -> tuple[Any, ...]:
    phase = {"dynamo": 0, "forward": 1, "backward": 2}
    kind, _, idx = f.graph.partition(" ")
    return (f.region, int(idx or 0), phase.get(kind, 3), f.kind, f.node)
