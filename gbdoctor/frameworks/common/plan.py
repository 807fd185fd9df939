"""How every framework's planner reads a scan report: which rows stand for their kind, whether
a row is clean, how much of a kind runs in clean fullgraph regions, and which Dynamo flags
remove a break."""

from __future__ import annotations

from collections.abc import Sequence

from gbdoctor.causes import flags_removing
from gbdoctor.records import BlockReport, Break, KindPlan, ScanReport, Spec, StagePlan


def representatives(report: ScanReport) -> list[BlockReport]:
    """One row per block kind: the rows that are not ``same_as`` another."""
    return [b for b in report.blocks if b.same_as is None]


def clean(block: BlockReport) -> bool:
    """No break, no event, no error."""
    return not block.breaks and not block.events and block.error is None


def fullgraph_share(block: BlockReport, total_ops: int) -> float:
    """Share of the kind's ``total_ops`` that runs in clean fullgraph regions (4 decimals)."""
    if total_ops <= 0:
        return 0.0
    dirty = {b.region for b in block.breaks} | {e.module for e in block.events}
    clean_ops = sum(
        n
        for region, n in block.region_ops
        if region in block.fullgraph_regions and region not in dirty and not block.error
    )
    return round(min(1.0, clean_ops / total_ops), 4)


def take_flags(
    brk: Break, flags: set[str], actions: list[str], reasons: list[str]
) -> tuple[str, ...]:
    """The Dynamo flags that remove ``brk`` and that its cause lets a planner set; those not in
    ``flags`` yet are added to it, the action and its reason appended. The gb_type says which
    flag removes the break; the cause's taxonomy entry which fixes a planner may apply
    (``Cause.plan_actions``)."""
    from gbdoctor.frameworks.registry import cause_taxonomy

    allowed = cause_taxonomy().plan_actions(brk.cause)
    wanted = tuple(
        flag
        for flag in flags_removing(brk.gb_type, in_checkpoint=brk.in_checkpoint)
        if f"flag:{flag}" in allowed
    )
    if wanted and not set(wanted) <= flags:
        flags.update(wanted)
        actions.append("flag:" + "+".join(wanted))
        reasons.append(
            f"{brk.cause}: {brk.gb_type} at {brk.location} is removed by {', '.join(wanted)}"
        )
    return wanted


def verification_failure(block: BlockReport | None, *, strict: bool = True) -> str:
    """Why a kind's strict re-scan did not verify: not captured, an error, or what still breaks.
    ``strict=False``: the last verification round's scan stands for it (no strict scan could
    verify a kind still dirty there)."""
    if block is None:
        return "the kind was not captured in the verification scan"
    if block.error:
        check = "strict check" if strict else "verification scan (no strict check could pass)"
        return f"{check} failed: {block.error[:200]}"
    parts = [f"{b.cause} ({b.gb_type}) at {b.location}" for b in block.breaks]
    parts += [f"{e.kind} at {e.module}" for e in block.events]
    return "still breaks: " + "; ".join(parts)


def stage_plans(
    spec: Spec, before: ScanReport, final: ScanReport, kinds: Sequence[KindPlan]
) -> tuple[StagePlan, ...]:
    """The plan per pipeline stage (empty without PP, or where the scan recorded no stages).

    Stages are read from the scans' blocks (``BlockReport.stage``, set as the setup split the
    model) and laid out again by ``setup.pipeline`` for what else each stage holds (embeddings,
    norm and output) and which PP rank runs it. A stage's breaks are its blocks' kinds' breaks
    per block, summed, before and after the plan (a block without a verification capture
    counts none after)."""
    if not spec.parallelism.pp_enabled or any(b.stage is None for b in before.blocks):
        return ()
    from gbdoctor.setup.pipeline import pipeline_layout

    layout = pipeline_layout(spec.parallelism, len(before.blocks), spec.training.local_batch_size)
    by_kind = {k.kind: k for k in kinds}
    per_block_after = {b.kind: sum(x.count for x in b.breaks) for b in representatives(final)}
    out = []
    for st in layout.stages:
        blocks = [b for b in before.blocks if b.stage == st.index]
        names = tuple(dict.fromkeys(b.kind for b in blocks if b.kind in by_kind))
        out.append(
            StagePlan(
                stage=st.index,
                pp_rank=st.pp_rank,
                layers=tuple(b.fqn for b in blocks),
                kinds=names,
                modules=tuple(m for m in st.modules if not m.startswith("layers.")),
                loss=st.index == len(layout.stages) - 1,
                breaks_before=sum(
                    by_kind[b.kind].breaks_before for b in blocks if b.kind in by_kind
                ),
                breaks_after=sum(per_block_after.get(b.kind, 0) for b in blocks),
                verified=all(by_kind[k].verified for k in names),
            )
        )
    return tuple(out)
