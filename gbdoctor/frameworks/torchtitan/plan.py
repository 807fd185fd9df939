"""The installed torchtitan's planner: per block kind, keep torchtitan's own compile where it is
clean, else the least change that makes it train, proven by re-scanning.

torchtitan >= 0.3 compiles every block whole with ``fullgraph=True``, so a break is a training
failure, not a slowdown. Per kind, from the scan under torchtitan's own settings:
- clean: keep the block's ``fullgraph=True`` compile (``block``);
- a break a Dynamo flag removes (``causes.flags_removing``, allowed by the cause's plan actions):
  set the flag, keep ``fullgraph=True``;
- any other break: compile the block with ``fullgraph=False`` (it trains, in several graphs);
- a block that does not trace: leave it eager (``eager``).
Each round re-scans with the candidate; the final scan runs under Dynamo's strict check, so a
kind is verified only when its fullgraph regions are clean, or its partial graphs trace without
error. Config keys express compile on/off only: the per-kind choices and flags are applied after
torchtitan's ``parallelize_fn`` (``layer_plan``; ``emit.py`` writes the same code for the user).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gbdoctor.frameworks.common.plan import (
    clean,
    fullgraph_share,
    representatives,
    stage_plans,
    take_flags,
    verification_failure,
)
from gbdoctor.frameworks.torchtitan import NAME, STRATEGIES, TitanStrategy
from gbdoctor.frameworks.torchtitan.layer_plan import EAGER, PARTIAL
from gbdoctor.records import BlockReport, KindPlan, Plan, Readiness, ScanReport, Spec

MAX_ROUNDS = 2
BLOCK = "block"
FLAG_COST = "a Dynamo setting torchtitan does not set; it applies to every compiled region"


@dataclass
class _Kind:
    kind: str
    layers: tuple[str, ...]
    mode: str = BLOCK
    fullgraph: bool = True
    actions: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def layer_plan_strategy(plan: Plan) -> TitanStrategy:
    """The strategy that applies ``plan``: compile on, the per-layer changes, its flags."""
    return TitanStrategy(
        name="plan",
        compile=True,
        layers=_layer_modes(plan.kinds),
        flags=plan.flags,
        summary=f"gbdoctor plan for {plan.spec}",
    )


def _layer_modes(kinds: tuple[KindPlan, ...] | list[KindPlan]) -> tuple[tuple[str, str], ...]:
    out = []
    for k in kinds:
        mode = EAGER if k.mode == EAGER else (None if k.fullgraph else PARTIAL)
        if mode is not None:
            out += [(fqn.rsplit(".", 1)[-1], mode) for fqn in k.layers]
    return tuple(sorted(out, key=lambda lm: (len(lm[0]), lm[0])))


def _candidate_strategy(kinds: dict[str, _Kind], flags: set[str]) -> TitanStrategy:
    plans = [
        KindPlan(kind=k.kind, layers=k.layers, mode=k.mode, fullgraph=k.fullgraph)
        for k in kinds.values()
    ]
    return TitanStrategy(
        name="plan",
        compile=True,
        layers=_layer_modes(plans),
        flags=tuple((f, True) for f in sorted(flags)),
    )


def _absorb(cand: _Kind, block: BlockReport, flags: set[str]) -> None:
    if block.error is not None and not block.breaks:
        if cand.mode != EAGER:
            cand.mode, cand.fullgraph = EAGER, False
            cand.actions.append("leave-eager")
            cand.reasons.append(
                f"error: the block does not trace ({block.error[:120]}); it runs eager"
            )
        return
    for brk in block.breaks:
        wanted = take_flags(brk, flags, cand.actions, cand.reasons)
        if not wanted and cand.fullgraph:
            cand.fullgraph = False
            cand.actions.append("fullgraph-off")
            cand.reasons.append(
                f"{brk.cause}: {brk.gb_type} at {brk.location} fails torchtitan's fullgraph=True "
                "compile; the block is compiled with fullgraph=False (several graphs)"
            )
    if block.events and cand.fullgraph and not block.breaks:
        cand.fullgraph = False
        cand.actions.append("fullgraph-off")
        cand.reasons.append(f"{block.events[0].kind} at {block.events[0].module}: fullgraph=False")


def propose_layer_plan(
    spec: Spec,
    *,
    scan_fn: Callable[..., ScanReport],
    progress: Callable[[str, int, int], None] | None = None,
) -> Plan:
    """Scan under torchtitan's own settings (compile on), propose per kind, re-scan, verify
    strictly."""
    say = progress or (lambda *_: None)
    total = MAX_ROUNDS + 2
    say("baseline scan (torchtitan's own compile)", 0, total)
    base = TitanStrategy("torchtitan", compile=True)
    before = scan_fn(spec, strategy=base, recompiles=False)
    flags: set[str] = set()
    kinds: dict[str, _Kind] = {}
    for block in representatives(before):
        layers = tuple(b.fqn for b in before.blocks if b.kind == block.kind)
        kinds[block.kind] = _Kind(kind=block.kind, layers=layers)
        _absorb(kinds[block.kind], block, flags)
    rounds = 0
    # When torchtitan's own compile is clean there is nothing to refine: the strict scan below
    # proves it.
    while rounds < MAX_ROUNDS and any(k.actions for k in kinds.values()):
        rounds += 1
        say(f"verification round {rounds}", rounds, total)
        after = scan_fn(spec, strategy=_candidate_strategy(kinds, flags), recompiles=False)
        dirty = [b for b in representatives(after) if b.kind in kinds and not _ok(kinds[b.kind], b)]
        if not dirty:
            break
        state = [(k.mode, k.fullgraph) for k in kinds.values()], set(flags)
        for block in dirty:
            _absorb(kinds[block.kind], block, flags)
        if state == ([(k.mode, k.fullgraph) for k in kinds.values()], flags):
            break
    say("strict verification", total - 1, total)
    final = scan_fn(spec, strategy=_candidate_strategy(kinds, flags), strict=True, recompiles=False)
    say("done", total, total)
    return _assemble(spec, before, final, kinds, flags, rounds)


def _ok(cand: _Kind, block: BlockReport | None) -> bool:
    """Verified: fullgraph kinds clean; fullgraph=False kinds trace; eager kinds always."""
    if cand.mode == EAGER:
        return True
    if block is None:
        return False
    return clean(block) if cand.fullgraph else block.error is None


def _assemble(
    spec: Spec,
    before: ScanReport,
    final: ScanReport,
    kinds: dict[str, _Kind],
    flags: set[str],
    rounds: int,
) -> Plan:
    before_by_kind = {b.kind: b for b in representatives(before)}
    final_by_kind = {b.kind: b for b in representatives(final)}
    out = []
    for kind, cand in sorted(kinds.items()):
        old, new = before_by_kind[kind], final_by_kind.get(kind)
        verified = _ok(cand, new)
        total_ops = old.op_count
        out.append(
            KindPlan(
                kind=kind,
                layers=cand.layers,
                mode=cand.mode,
                fullgraph=cand.fullgraph,
                actions=tuple(dict.fromkeys(cand.actions or ["keep-torchtitan-compile"])),
                reasons=tuple(cand.reasons)
                or ("clean: torchtitan's whole-block fullgraph=True compile stays",),
                breaks_before=sum(b.count for b in old.breaks),
                breaks_after=sum(b.count for b in new.breaks) if new else 0,
                events_before=len(old.events),
                events_after=len(new.events) if new else 0,
                fullgraph_share_before=fullgraph_share(old, total_ops),
                fullgraph_share_after=fullgraph_share(new, total_ops) if new else 0.0,
                verified=verified,
                detail="" if verified else verification_failure(new),
                cudagraphs=new.cudagraphs.summary if new and new.cudagraphs else "",
                cudagraph_ready=bool(
                    verified and new and new.cudagraphs and new.cudagraphs.status == Readiness.READY
                ),
            )
        )
    return Plan(
        spec=spec.key,
        model=f"{spec.model.name}/{spec.model.flavor}",
        torch_version=final.torch_version,
        baseline_strategy=STRATEGIES["torchtitan"].name,
        flags=tuple((f, True) for f in sorted(flags)),
        flag_costs=tuple(f"{f}: {FLAG_COST}" for f in sorted(flags)),
        kinds=tuple(out),
        verified=all(k.verified for k in out),
        rounds=rounds,
        notes=tuple(n for n in before.notes if n.startswith("notice:")),
        framework=NAME,
        stages=stage_plans(spec, before, final, out),
    )
