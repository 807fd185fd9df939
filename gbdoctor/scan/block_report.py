"""The records of one block's capture: Dynamo's raw breaks, frame skips and graphs
(``capture.RawCapture``) become classified breaks, ``region_eager`` / ``frame_skipped`` events
and the block's CUDA-graph readiness, located relative to the spec's root."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from gbdoctor import causes
from gbdoctor.capture import RawCapture, innermost_user_location
from gbdoctor.capture.cudagraph_verdict import readiness
from gbdoctor.capture.locate import library_via, portable_path, portable_text, within
from gbdoctor.records import BlockReport, Break, Event, EventKind, RawBreak


def _in_ac(slot: Any, module: str) -> bool:
    """Whether ``module`` sits in one of the block's AC-wrapped regions."""
    for sub in slot.ac_wrapped:
        region = slot.fqn if sub == "" else f"{slot.fqn}.{sub}"
        if within(module, region):
            return True
    return False


def _ac_region(slot: Any, module: str) -> str:
    """FQN of the AC region a module sits in (the block, or the wrapped child)."""
    for sub in slot.ac_wrapped:
        region = slot.fqn if sub == "" else f"{slot.fqn}.{sub}"
        if module == region or module.startswith(region + ".") or sub == "":
            return region
    return module or slot.fqn


def _rerooted(finding: Any, root: str | None) -> Any:
    loc = finding.location
    if loc is None or not os.path.exists(loc.file):
        return finding
    return replace(
        finding, location=replace(loc, file=portable_path(os.path.abspath(loc.file), root))
    )


def block_report(
    slot: Any,
    raw: RawCapture,
    *,
    root: str | None = None,
    hooks: causes.FrameworkHooks = causes.NO_FRAMEWORK_HOOKS,
) -> BlockReport:
    """Records of one capture; locations relative to ``root`` (the spec's ``Spec.root``);
    ``hooks``: the spec's framework's own hook library (``registry.hooks_of``)."""
    merged: dict[tuple[Any, ...], Break] = {}
    events: dict[tuple[Any, ...], Event] = {}
    for rb, region in raw.breaks:
        location = innermost_user_location(rb.frames, root, component=rb.component)
        brk = Break(
            cause=causes.classify(rb, hooks),
            gb_type=rb.gb_type,
            gb_id=causes.gb_id_for(rb.gb_type),
            location=location,
            module=rb.module or region or slot.fqn,
            in_checkpoint=rb.in_checkpoint,
            component=rb.component,
            region=region,
            explanation=portable_text(rb.explanation, root),
            hints=tuple(portable_text(h, root) for h in rb.hints),
            context=portable_text(rb.context, root),
            via=library_via(rb.frames, root, component=rb.component),
        )
        key = (brk.cause, brk.gb_type, str(brk.location), brk.module, brk.in_checkpoint)
        merged[key] = replace(merged[key], count=merged[key].count + 1) if key in merged else brk
        if rb.in_checkpoint:
            ac_region = _ac_region(slot, brk.module)
            events[("region_eager", ac_region)] = Event(
                kind="region_eager",
                module=ac_region,
                gb_type=rb.gb_type,
                location=location,
                detail="a break inside the activation-checkpoint region sent the whole region to eager",
            )
    for rb, region in raw.frame_skips:
        location = innermost_user_location(rb.frames, root)
        module = rb.module or region or slot.fqn
        events[("frame_skipped", module, str(location))] = Event(
            kind="frame_skipped",
            module=module,
            gb_type=rb.gb_type,
            location=location,
            detail=portable_text(rb.context, root)
            or "Dynamo skipped the whole frame and ran it eagerly",
        )
    seen_types = {b.gb_type for b in merged.values()}
    for gb_type, n in sorted(raw.counter_types.items()):
        if gb_type not in seen_types:
            # Only counters saw it (no stack): keep it, never drop a break.
            rb = RawBreak(gb_type=gb_type, message=gb_type, component="torch")
            merged[(gb_type,)] = Break(
                cause=causes.classify(rb, hooks),
                gb_type=gb_type,
                gb_id=causes.gb_id_for(gb_type),
                location=None,
                module=slot.fqn,
                in_checkpoint=False,
                component="torch",
                region=slot.fqn,
                count=n,
            )
    for region in sorted(raw.entered):
        # With the checkpoint side-effect flag (the default strategy's) or scalar capture, a
        # break inside a checkpoint region need not carry the HOP in its record; the region
        # still produced no graph and ran eagerly, which is what region_eager reports.
        inside = sorted((b for b in merged.values() if b.region == region), key=break_order)
        checkpointed = [b for b in inside if _in_ac(slot, b.module)]
        ran = raw.graphs.get(region) or region in raw.ran_compiled
        if ran or raw.error is not None or not checkpointed:
            continue
        ac_region = _ac_region(slot, checkpointed[0].module)
        if ("region_eager", ac_region) not in events:
            events[("region_eager", ac_region)] = Event(
                kind="region_eager",
                module=ac_region,
                gb_type=checkpointed[0].gb_type,
                location=checkpointed[0].location,
                detail="a break inside the activation-checkpoint region left it with no graph: "
                "the whole region ran eagerly",
            )
    for region in sorted(raw.entered):
        if (
            not raw.graphs.get(region)
            and region not in raw.ran_compiled
            and not any(e.module.startswith(region) for e in events.values())
            and not any(b.region == region for b in merged.values())
            and raw.error is None
        ):
            events[("frame_skipped", region, "")] = Event(
                kind="frame_skipped",
                module=region,
                detail="the compiled region ran without producing a graph",
            )
    graphs = [n for ops in raw.graphs.values() for n in ops]
    breaks = tuple(sorted(merged.values(), key=break_order))
    # Readiness findings are located while the backend runs, relative to the working directory;
    # re-root them at the spec's root like every other location (CWD-independent reports).
    findings = [_rerooted(f, root) for f in raw.cudagraph_findings]
    ordered = tuple(sorted(events.values(), key=event_order))
    eager = [e for e in ordered if e.kind in (EventKind.REGION_EAGER, EventKind.FRAME_SKIPPED)]
    ready = readiness(findings, raw.aten_graphs, eager) if slot.regions else None
    return BlockReport(
        fqn=slot.fqn,
        kind=slot.kind,
        graph_count=len(graphs),
        op_count=sum(graphs),
        breaks=breaks,
        events=ordered,
        error=raw.error,
        regions=slot.regions,
        fullgraph_regions=slot.fullgraph_regions,
        region_ops=tuple(sorted((r, sum(ops)) for r, ops in raw.graphs.items())),
        cudagraphs=ready,
        stage=getattr(slot, "stage", None),
    )


def break_order(b: Break) -> tuple[Any, ...]:
    loc = b.location
    return (b.module, loc.file if loc else "", loc.line if loc else 0, b.gb_type, b.cause)


def layer_order(fqn: str) -> tuple[int, str]:
    """Sort key of block FQNs: by the layer index they end with (``layers.10`` after
    ``layers.9``), other names last."""
    tail = fqn.rsplit(".", 1)[-1]
    return (int(tail), fqn) if tail.isdigit() else (1 << 30, fqn)


def event_order(e: Event) -> tuple[Any, ...]:
    loc = e.location
    return (e.kind, e.module, loc.file if loc else "", loc.line if loc else 0, e.gb_type)
