"""The DeepSpeed planner: propose a compile call for a DeepSpeed setup and prove it by re-scanning.

DeepSpeed's compile choices are coarser than torchtitan's per-block recipes: the whole model
(``engine.compile()``), every block, or - the fix for ZeRO-3's hooks - every block as a ZeRO-3
leaf module with its ``forward`` compiled, so the compiled region sits *between* the block's
parameter-gather and release hooks and contains none (``zero-hook`` fixes). The planner:

1. scans the spec's setup with ``engine.compile()`` (every break visible);
2. proposes ``engine.compile(fullgraph=True)`` when that is clean (ZeRO-0/1/2), else, when any
   break is a ``zero-hook``, blocks as leaf modules with compiled forwards;
3. verifies with a strict scan (fullgraph, Dynamo's error_on_graph_break); when that fails, a
   non-strict scan of the same candidate says which breaks remain, and each is reported with
   its cause (a break in the model's own code is for the model's author to remove).
"""

from __future__ import annotations

from collections.abc import Callable

from gbdoctor.frameworks.common.plan import clean, fullgraph_share, representatives
from gbdoctor.frameworks.deepspeed.setup import (
    DS_STRATEGIES,
    ROOT_REGION,
    DeepSpeedStrategy,
    forward_strategy,
    qualified_class,
)
from gbdoctor.records import BlockReport, DeepSpeedPlan, KindPlan, Plan, ScanReport, Spec

BASELINE = "engine"
NAME = "deepspeed"
"""``Plan.framework`` of a DeepSpeed plan (``frameworks.deepspeed.NAME``)."""


def deepspeed_plan_strategy(plan: Plan) -> DeepSpeedStrategy:
    ds = plan.deepspeed
    assert ds is not None
    flags = tuple((k, v) for k, v in plan.flags)
    if ds.mode == "engine":
        return DeepSpeedStrategy(
            name="plan",
            mode="engine",
            fullgraph=ds.fullgraph,
            flags=flags,
            summary="gbdoctor plan: engine.compile()",
        )
    return forward_strategy(leaf_blocks=bool(ds.leaf_modules), fullgraph=ds.fullgraph, flags=flags)


def _candidate(before: ScanReport, stage: int, fullgraph: bool) -> DeepSpeedStrategy:
    zero = any(b.cause == "zero-hook" for blk in before.blocks for b in blk.breaks)
    all_clean = all(clean(b) and not b.recompiles for b in before.blocks)
    if all_clean or not zero:
        return DeepSpeedStrategy(
            name="plan",
            mode="engine",
            fullgraph=fullgraph,
            summary="gbdoctor plan: engine.compile()",
        )
    return forward_strategy(leaf_blocks=stage == 3, fullgraph=fullgraph)


def propose_deepspeed_plan(
    spec: Spec,
    *,
    scan_fn: Callable[..., ScanReport],
    progress: Callable[[str, int, int], None] | None = None,
) -> Plan:
    say = progress or (lambda *_: None)
    stage = spec.deepspeed.zero_stage if spec.deepspeed else 0
    say("baseline scan (engine.compile())", 0, 4)
    before = scan_fn(spec, strategy=DS_STRATEGIES[BASELINE])
    say("strict verification", 1, 4)
    candidate = _candidate(before, stage, fullgraph=True)
    final = scan_fn(spec, strategy=candidate, strict=True)
    rounds = 1
    if not all(_verified_row(b, candidate) for b in final.blocks):
        # Something still breaks: the same candidate without fullgraph says what and where.
        rounds = 2
        say("what remains (non-strict scan)", 2, 4)
        candidate = _candidate(before, stage, fullgraph=False)
        final = scan_fn(spec, strategy=candidate)
    say("done", 4, 4)
    return _assemble(spec, before, final, candidate, stage, rounds)


def _verified_row(block: BlockReport, strategy: DeepSpeedStrategy) -> bool:
    return clean(block) and not any(r.limit_hit for r in block.recompiles)


def _leaf_classes(spec: Spec) -> tuple[str, ...]:
    """Qualified class names of the model's blocks (built on meta: no memory, no weights)."""
    from gbdoctor.models import build_model
    from gbdoctor.setup.apply import block_slots

    model = build_model(spec.model, device="meta", max_seq_len=spec.training.seq_len)
    return tuple(sorted({qualified_class(b) for _, _, b in block_slots(model)}))


def _assemble(
    spec: Spec,
    before: ScanReport,
    final: ScanReport,
    strategy: DeepSpeedStrategy,
    stage: int,
    rounds: int,
) -> Plan:
    before_by_fqn = {b.fqn: b for b in before.blocks}
    final_by_fqn = {b.fqn: b for b in final.blocks}
    kinds: dict[str, list[str]] = {}
    for block in before.blocks:
        kinds.setdefault(block.kind, []).append(block.fqn)
    plans = []
    remaining: list[str] = []
    for kind, layers in sorted(kinds.items()):
        old = [before_by_fqn[f] for f in layers]
        new = [final_by_fqn[f] for f in layers if f in final_by_fqn]
        verified = len(new) == len(old) and all(_verified_row(b, strategy) for b in new)
        is_root = layers == [ROOT_REGION]
        if strategy.mode == "engine":
            mode = "engine"
            reasons = (
                ("clean: engine.compile() captures the whole model in one graph per step",)
                if verified
                else ()
            )
        elif is_root:
            mode = "none"
            reasons = (
                "zero-hook: embeddings, final norm, output and the model's own forward run eagerly; their "
                "ZeRO-3 hooks would break any region around them",
            )
        else:
            mode = "forward"
            reasons = (
                "zero-hook: each block is a ZeRO-3 leaf module (its parameters gathered at once by the "
                "block's own hooks, none on its children) and its forward is compiled between those hooks",
            )
        detail = ""
        for block in new:
            for brk in block.breaks:
                why = {
                    "zero-hook": "a ZeRO hook inside the compiled region",
                    "model": "in the model's own code",
                }.get(brk.cause, f"cause {brk.cause}")
                remaining.append(
                    f"{brk.module}: {brk.cause} ({brk.gb_type}) at {brk.location}: {why}"
                )
            for event in block.events:
                remaining.append(f"{event.module}: {event.kind}: {event.detail}")
            if block.error:
                remaining.append(f"{block.fqn}: error: {block.error[:200]}")
        if not verified:
            detail = (
                "; ".join(r for r in remaining if r.startswith(tuple(layers)))
                or "not clean in the verification scan"
            )
        total = max((b.op_count for b in old + new), default=0)
        plans.append(
            KindPlan(
                kind=kind,
                layers=tuple(layers),
                mode=mode,
                fullgraph=strategy.fullgraph and mode != "none",
                actions=(
                    ("compile-between-hooks",)
                    if mode == "forward"
                    else ("fullgraph-model",)
                    if mode == "engine"
                    else ("move-out-of-region",)
                ),
                reasons=reasons,
                breaks_before=sum(b.count for blk in old for b in blk.breaks),
                breaks_after=sum(b.count for blk in new for b in blk.breaks),
                events_before=sum(len(b.events) for b in old),
                events_after=sum(len(b.events) for b in new),
                fullgraph_share_before=fullgraph_share(old[0], total) if old else 0.0,
                fullgraph_share_after=fullgraph_share(new[0], total) if new else 0.0,
                verified=verified,
                detail=detail,
            )
        )
    leaf = _leaf_classes(spec) if strategy.leaf_blocks else ()
    suggestions = []
    if any(b.cause == "zero-hook" for blk in representatives(before) for b in blk.breaks):
        suggestions.append(
            "zero-hook: ZeRO-1/2 (no parameter partitioning) compiles the whole model in one graph "
            "when the parameters fit on every rank"
        )
        suggestions.append(
            'zero-hook: on CUDA, DeepCompile ("compile": {"deepcompile": true} with '
            "engine.compile()) puts ZeRO-3's gather/release into the graph (not measured: CPU only)"
        )
    ds = DeepSpeedPlan(
        mode=strategy.mode,
        fullgraph=strategy.fullgraph,
        zero_stage=stage,
        leaf_modules=leaf,
        remaining=tuple(dict.fromkeys(remaining)),
    )
    return Plan(
        spec=spec.path,
        model=f"{spec.model.name}/{spec.model.flavor}",
        torch_version=final.torch_version,
        baseline_strategy=BASELINE,
        flags=(),
        flag_costs=(),
        kinds=tuple(plans),
        verified=all(k.verified for k in plans),
        rounds=rounds,
        suggestions=tuple(suggestions),
        framework=NAME,
        deepspeed=ds,
    )
