"""The torchtitan v0.2 planner: a per-block-kind compile and wrapping plan, proven by re-scanning before it is offered.

The planner starts from a whole-block capture (torchtitan v0.2.0 style, no Dynamo flags: every
break in the block is visible) and, per block kind, combines the actions the causes allow:
- compile the block whole with ``fullgraph=True`` when it is clean;
- set a Dynamo flag that removes the break (``capture_scalar_outputs``,
  ``capture_dynamic_output_shape_ops``, ``skip_fwd_side_effects_in_bwd_under_checkpoint``);
- otherwise isolate: compile the clean children with ``fullgraph=True`` and leave the breaking
  module eager (FSDP/EP-hooked experts, a module with a backward hook, the block's own glue);
- when the block is AC-wrapped and anything stays eager, split the AC wrapping per child, so a
  break in one child no longer sends the others to eager.
Each round re-scans with the candidate; new breaks feed the next round. The final proof is a
scan under Dynamo's strict check: every region marked fullgraph must be clean, with no
``region_eager`` event and no error. A kind that cannot be proven clean is reported unverified.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gbdoctor.capture import within
from gbdoctor.frameworks.common.plan import (
    clean,
    fullgraph_share,
    representatives,
    stage_plans,
    take_flags,
    verification_failure,
)
from gbdoctor.frameworks.registry import cause_taxonomy
from gbdoctor.records import (
    ACMode,
    BlockKind,
    BlockReport,
    Break,
    CompileMode,
    KindPlan,
    Plan,
    Readiness,
    ScanReport,
    Spec,
)
from gbdoctor.setup.compile import BlockRecipe, Strategy

BASELINE_STRATEGY = "titan-v0.2.0"
MAX_ROUNDS = 3

# Flags a break's gb_type can be removed with, and what each costs. Only flags whose cost is a
# compile-time or specialization cost are applied automatically; compiled autograd changes how
# the whole backward runs (and how FSDP's backward hooks fire), so it is only suggested.
FLAG_COSTS = {
    "capture_scalar_outputs": "data-dependent scalars (.item(), .tolist()) become unbacked SymInts; "
    "shapes built from them may need torch._check hints and can recompile",
    "capture_dynamic_output_shape_ops": "ops with data-dependent output shapes (nonzero, bincount) are traced "
    "with unbacked sizes; kernels are generic in those sizes",
    "skip_fwd_side_effects_in_bwd_under_checkpoint": "Python side effects in an AC region are not replayed "
    "during recompute (torchtitan main sets it)",
}


# ------------------------------------------------------------------------------ strategy


def block_plan_strategy(plan: Plan) -> Strategy:
    """The per-kind strategy that applies a torchtitan ``plan``."""
    recipes = {
        k.kind: BlockRecipe(
            mode=k.mode,
            fullgraph=k.fullgraph,
            eager=k.eager,
            compiled_forward=k.compiled_forward,
            split_ac=k.split_ac,
        )
        for k in plan.kinds
    }
    return _plan_strategy(recipes, plan.flags, summary=f"gbdoctor plan for {plan.spec}")


def _plan_strategy(
    recipes: dict[str, BlockRecipe], flags: tuple[tuple[str, bool], ...], summary: str = ""
) -> Strategy:
    """Per-kind recipes keyed by the setup's kind label (a scan's ``#2`` suffix dropped)."""
    per_kind = tuple(
        (BlockKind.parse(kind).label, recipe) for kind, recipe in sorted(recipes.items())
    )
    return Strategy(
        name="plan",
        dense=BlockRecipe(),
        moe=BlockRecipe(mode=CompileMode.CHILDREN),
        flags=flags,
        per_kind=per_kind,
        summary=summary,
    )


# ------------------------------------------------------------------------------ planner


@dataclass
class _Candidate:
    """Mutable per-kind state while rounds refine it."""

    kind: str
    layers: tuple[str, ...]
    ac_wrapped: bool
    is_moe: bool
    mode: str = CompileMode.BLOCK
    eager: set[str] | None = None
    compiled_forward: set[str] | None = None
    """Eager modules isolated for their hooks only: their own forward is compiled."""
    reasons: list[str] | None = None
    actions: list[str] | None = None

    def recipe(self) -> BlockRecipe:
        return BlockRecipe(
            mode=self.mode,
            fullgraph=True,
            eager=tuple(sorted(self.eager or ())),
            compiled_forward=tuple(sorted(self.compiled_forward or ())),
            split_ac=self.ac_wrapped and self.mode == CompileMode.CHILDREN,
        )


def _relative(module: str, block_fqn: str) -> str:
    """``module`` relative to the block ("" for the block itself or a module outside it)."""
    return module[len(block_fqn) + 1 :] if module != block_fqn and within(module, block_fqn) else ""


def _hooked_module(brk: Break, block_fqn: str) -> str:
    """The module to leave eager for an FSDP/EP hook break: the setup installs those hooks on
    the MoE's ``experts`` (fully_shard(moe.experts), EP dispatch/combine), and Dynamo reports
    FSDP's at the call site in the MoE's forward."""
    target = _relative(brk.module, block_fqn)
    if target.rsplit(".", 1)[-1] == "experts":
        return target
    return f"{target}.experts" if target else "experts"


def _compiled_forward_hit(brk: Break, block_fqn: str, cand: _Candidate) -> str:
    """The module (relative to the block) whose compiled own forward ``brk`` happened in, or ""."""
    for sub in cand.compiled_forward or ():
        if brk.region == f"{block_fqn}.{sub}.forward":
            return sub
    return ""


def _absorb(cand: _Candidate, block: BlockReport, flags: set[str]) -> None:
    """Fold one capture of the kind into the candidate: flags for removable breaks, isolation for the rest."""
    cand.reasons = cand.reasons or []
    cand.actions = cand.actions or []
    for brk in block.breaks:
        if take_flags(brk, flags, cand.actions, cand.reasons):
            continue  # a flag removes it (one already set: verification will tell)
        inside = _compiled_forward_hit(brk, block.fqn, cand)
        if inside:
            # The module's own computation breaks too: it stays eager, hooks and all.
            cand.compiled_forward = (cand.compiled_forward or set()) - {inside}
            cand.actions.append("isolate-child")
            cand.reasons.append(
                f"{brk.cause}: {brk.gb_type} at {brk.location} is inside {inside}'s own forward; "
                f"{inside} runs eager"
            )
            continue
        if brk.component in ("fsdp", "ep") and cand.is_moe:
            isolated = {_hooked_module(brk, block.fqn)}
            # The break is in the hooks FSDP/EP install around the module, not in its forward:
            # the forward is compiled on its own, with the hooks running eagerly around it
            # (verification drops it again if the forward itself breaks).
            allowed = cause_taxonomy().plan_actions(brk.cause)
            if "compile-between-hooks" in allowed and not isolated <= (cand.eager or set()):
                cand.compiled_forward = (cand.compiled_forward or set()) | isolated
                cand.actions.append("compile-between-hooks")
        else:
            target = _relative(brk.module, block.fqn)
            isolated = {target} if target else set()
        cand.mode = CompileMode.CHILDREN
        cand.eager = (cand.eager or set()) | isolated
        where = ", ".join(sorted(isolated)) or "the block's own forward (its children are compiled)"
        stays = (
            "'s hooks stay eager, its own forward is compiled"
            if isolated and isolated <= (cand.compiled_forward or set())
            else " stays eager"
        )
        cand.actions.append("isolate-child")
        cand.reasons.append(
            f"{brk.cause}: {brk.gb_type} at {brk.location} cannot be compiled; {where}{stays}"
        )
    if block.error and not block.breaks:
        cand.mode = CompileMode.CHILDREN
        cand.actions.append("isolate-child")
        cand.reasons.append(
            f"error: the block does not trace ({block.error[:120]}); children compiled around it"
        )
    if cand.mode == CompileMode.CHILDREN and cand.ac_wrapped and "split-ac" not in cand.actions:
        cand.actions.append("split-ac")
        cand.reasons.append(
            "region_eager: AC is wrapped per child so a break (or an eager module) in one child "
            "no longer sends the others to eager; children holding eager modules get plain AC"
        )


def propose_block_plan(
    spec: Spec,
    *,
    scan_fn: Callable[..., ScanReport],
    progress: Callable[[str, int, int], None] | None = None,
) -> Plan:
    """Scan, propose, verify (rounds + a final strict scan; the strict scan alone where the
    baseline is clean), and return the plan. ``scan_fn``
    keeps real-or-simulated as first decided (``plan.planner.propose_plan``), so a simulated
    plan is verified by simulated re-scans."""
    from gbdoctor.frameworks.torchtitan_v02.strategies import STRATEGIES

    say = progress or (lambda *_: None)
    say("baseline scan (whole blocks, no flags)", 0, MAX_ROUNDS + 2)
    before = scan_fn(spec, strategy=STRATEGIES[BASELINE_STRATEGY], recompiles=False)
    reps = representatives(before)
    flags: set[str] = set()
    cands: dict[str, _Candidate] = {}
    for block in reps:
        layers = tuple(b.fqn for b in before.blocks if b.kind == block.kind)
        cands[block.kind] = _Candidate(
            kind=block.kind,
            layers=layers,
            ac_wrapped=BlockKind.parse(block.kind).ac_wrapped,
            is_moe=block.kind.startswith("moe"),
        )
        _absorb(cands[block.kind], block, flags)
    _unify_variants(cands)
    if not flags and all(clean(b) for b in reps):
        # Nothing to change but fullgraph=True: a strict scan passing implies the non-strict
        # round would pass too (strict only adds failures), so it is the one round (one ~25 s
        # CPU scan fewer at production size: 17bx128e). If it fails, the rounds run as usual.
        say("strict verification", MAX_ROUNDS + 1, MAX_ROUNDS + 2)
        final = scan_fn(spec, strategy=_strategy(cands, flags), strict=True, recompiles=False)
        if all(clean(b) for b in representatives(final) if b.kind in cands):
            totals = _op_totals(spec, before, final, scan_fn)
            say("done", MAX_ROUNDS + 2, MAX_ROUNDS + 2)
            return _assemble(spec, before, final, cands, flags, totals, 1, strict=True)
    after = before
    rounds = 0
    hopeless = False
    for rounds in range(1, MAX_ROUNDS + 1):
        say(f"verification round {rounds}", rounds, MAX_ROUNDS + 2)
        after = scan_fn(spec, strategy=_strategy(cands, flags), recompiles=False)
        dirty = [b for b in representatives(after) if not clean(b) and b.kind in cands]
        if not dirty:
            break
        changed = False
        for block in dirty:
            cand = cands[block.kind]
            state = (cand.mode, frozenset(cand.eager or ()), frozenset(flags))
            _absorb(cand, block, flags)
            changed |= state != (cand.mode, frozenset(cand.eager or ()), frozenset(flags))
        _unify_variants(cands)
        if not changed:
            # Every kind still dirty under the very strategy a strict scan would apply: strict
            # mode only adds failures, so it cannot verify any of them (a production-size
            # simulated scan costs ~20 s of CPU: 17bx128e was one before setup/ac.py's RNG
            # stand-in, every kind failing under TP + AC).
            hopeless = {b.kind for b in dirty} >= set(cands)
            break
    if hopeless:
        final = after
    else:
        say("strict verification", MAX_ROUNDS + 1, MAX_ROUNDS + 2)
        final = scan_fn(spec, strategy=_strategy(cands, flags), strict=True, recompiles=False)
    totals = _op_totals(spec, before, final, scan_fn)
    say("done", MAX_ROUNDS + 2, MAX_ROUNDS + 2)
    return _assemble(spec, before, final, cands, flags, totals, rounds, strict=not hopeless)


def _op_totals(
    spec: Spec, before: ScanReport, final: ScanReport, scan_fn: Callable[..., ScanReport]
) -> dict[str, int]:
    """Each kind's op count, the denominator of its fullgraph-coverage share. AC hides ops (a
    region that fell back to eager captures none), so where a kind had events or an error
    under AC its ops are counted once without AC, unless the kind errors before and after the
    plan: its shares are 0 whatever the count, and the scan is skipped."""
    from gbdoctor.frameworks.torchtitan_v02.strategies import STRATEGIES

    reps = representatives(before)
    totals = {b.kind: b.op_count for b in reps}
    after = {b.kind: b for b in representatives(final)}
    needs = [
        b
        for b in reps
        if (b.events or b.error) and not (b.error and b.kind in after and after[b.kind].error)
    ]
    if needs and spec.activation_checkpoint.mode != ACMode.NONE:
        reference = scan_fn(
            _without_ac(spec), strategy=STRATEGIES[BASELINE_STRATEGY], recompiles=False
        )
        ref_by_fqn = {b.fqn: b.op_count for b in reference.blocks}
        totals = {b.kind: max(b.op_count, ref_by_fqn.get(b.fqn, 0)) for b in reps}
    return totals


def _unify_variants(cands: dict[str, _Candidate]) -> None:
    """Give the variants of one block kind (``dense``, ``dense#2``: layers of one structure that
    trace apart, as under PP where neighbours differ) one recipe: the setup applies plans by
    the kind's label, without the variant, so a recipe that only one variant needs (a break
    isolated in ``layers.3``) is every variant's. The merged recipe isolates whatever any
    variant isolates; a module's forward stays compiled only where no variant saw it break."""
    groups: dict[str, list[_Candidate]] = {}
    for cand in cands.values():
        groups.setdefault(BlockKind.parse(cand.kind).label, []).append(cand)
    for label, group in groups.items():
        if len(group) < 2:
            continue
        eager = set().union(*(c.eager or set() for c in group))
        forwards = {
            m
            for m in set().union(*(c.compiled_forward or set() for c in group))
            if all(m in (c.compiled_forward or set()) for c in group if m in (c.eager or set()))
        }
        children = any(c.mode == CompileMode.CHILDREN for c in group)
        for cand in group:
            if children and cand.mode != CompileMode.CHILDREN:
                others = ", ".join(c.kind for c in group if c.mode == CompileMode.CHILDREN)
                cand.actions = [*(cand.actions or ()), "isolate-child"]
                cand.reasons = [
                    *(cand.reasons or ()),
                    f"variant: {others} (the same {label} blocks, traced apart) need(s) "
                    f"isolation, and the setup applies one recipe per block kind",
                ]
                cand.mode = CompileMode.CHILDREN
            cand.eager = set(eager)
            cand.compiled_forward = set(forwards)


def _without_ac(spec: Spec) -> Spec:
    return replace(
        spec, activation_checkpoint=replace(spec.activation_checkpoint, mode=ACMode.NONE)
    )


def _strategy(cands: dict[str, _Candidate], flags: set[str]) -> Strategy:
    return _plan_strategy(
        {k: c.recipe() for k, c in cands.items()}, tuple((f, True) for f in sorted(flags))
    )


def _assemble(
    spec: Spec,
    before: ScanReport,
    final: ScanReport,
    cands: dict[str, _Candidate],
    flags: set[str],
    totals: dict[str, int],
    rounds: int,
    *,
    strict: bool = True,
) -> Plan:
    before_by_kind = {b.kind: b for b in representatives(before)}
    final_by_kind = {b.kind: b for b in representatives(final)}
    kinds = []
    for kind, cand in sorted(cands.items()):
        old, new = before_by_kind[kind], final_by_kind.get(kind)
        verified = new is not None and clean(new)
        detail = "" if verified else verification_failure(new, strict=strict)
        recipe = cand.recipe()
        reasons = tuple(cand.reasons or ()) or (
            "clean: the whole block compiles with fullgraph=True",
        )
        kinds.append(
            KindPlan(
                kind=kind,
                layers=cand.layers,
                mode=recipe.mode,
                fullgraph=True,
                eager=recipe.eager,
                compiled_forward=recipe.compiled_forward,
                split_ac=recipe.split_ac,
                actions=tuple(dict.fromkeys(cand.actions or ("fullgraph-block",))),
                reasons=reasons,
                breaks_before=sum(b.count for b in old.breaks),
                breaks_after=sum(b.count for b in new.breaks) if new else 0,
                events_before=len(old.events),
                events_after=len(new.events) if new else 0,
                fullgraph_share_before=fullgraph_share(old, totals.get(kind, 0)),
                fullgraph_share_after=fullgraph_share(new, totals.get(kind, 0)) if new else 0.0,
                verified=verified,
                detail=detail,
                cudagraphs=new.cudagraphs.summary if new and new.cudagraphs else "",
                cudagraph_ready=bool(
                    verified
                    and new is not None  # implied by verified; said again for mypy
                    and new.cudagraphs
                    and new.cudagraphs.status == Readiness.READY
                ),
            )
        )
    suggestions = []
    if any(b.cause == "backward-hook" for blk in representatives(before) for b in blk.breaks):
        suggestions.append(
            "backward-hook: torch._dynamo.config.compiled_autograd = True also removes "
            "module backward-hook breaks, at the cost of compiling the whole backward"
        )
    return Plan(
        spec=spec.key,
        model=f"{spec.model.name}/{spec.model.flavor}",
        torch_version=final.torch_version,
        baseline_strategy=BASELINE_STRATEGY,
        flags=tuple((f, True) for f in sorted(flags)),
        flag_costs=tuple(f"{f}: {FLAG_COSTS[f]}" for f in sorted(flags)),
        kinds=tuple(kinds),
        verified=all(k.verified for k in kinds),
        rounds=rounds,
        suggestions=tuple(suggestions),
        simulated=before.setup.simulated,
        notes=_plan_notes(before),
        stages=stage_plans(spec, before, final, kinds),
    )


def _plan_notes(before: ScanReport) -> tuple[str, ...]:
    """The baseline scan's notes that concern the plan as a whole (not per-block caveats)."""
    keep = ("notice:", "simulated:", "data_parallel_shard_degree", "[compile]")
    return tuple(n for n in before.notes if n.startswith(keep))
