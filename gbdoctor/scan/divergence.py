"""Rank divergence: the breaks some ranks meet in a block and others do not, why, and whether
that can hang training.

Every rank of a multi-rank scan captures its own blocks (``scan.rank``); ``scan.merge`` keeps
rank 0's records and asks :func:`rank_divergences` what differs. A break is keyed by its
gb_type and innermost user location; one that not every rank meets is a divergence. Layers of
one kind that diverge alike (a rank-0 print in every layer) fold into one record with
``layers``. The cause class follows from what the ranks share:

- the block's inputs differ in shape between ranks -> per-rank shape;
- every rank meets the same data-dependent break in the block (``.item()``, a branch on a
  tensor) -> per-rank data: what follows it depends on each rank's values;
- else -> rank-conditional code: a statement only some ranks run.

Whether it can desynchronize collectives in training follows from where the block's
collectives run: inside its compiled regions (tensor parallel; expert parallel in MoE blocks:
the graphs issue them) a rank that breaks or recompiles alone issues them from other graphs, in another order
(pytorch#126846); outside them (FSDP's hooks, a world that only shards data) the extra break
splits one rank's graph between the same collectives. A break that is itself a collective can.
"""

from __future__ import annotations

from collections.abc import Sequence

from gbdoctor.records import (
    BlockKind,
    BlockReport,
    Break,
    CollectiveHazard,
    DivergenceCause,
    RankDivergence,
    SetupInfo,
)

DATA_DEPENDENT_CAUSES = frozenset({"data-dependent", "moe-load-balancing", "ep-dispatch"})
"""Break causes whose outcome depends on a tensor's values."""
COLLECTIVE_CAUSES = frozenset({"collective", "tensor-parallel", "ep-dispatch"})
"""Break causes that are a collective (or DTensor communication) themselves."""

BreakKey = tuple[str, str]


def break_key(brk: Break) -> BreakKey:
    return (brk.gb_type, str(brk.location) if brk.location else brk.module)


def rank_divergences(
    blocks_per_rank: Sequence[Sequence[BlockReport]],
    setup: SetupInfo,
    input_shapes: Sequence[Sequence[str]] = (),
) -> tuple[RankDivergence, ...]:
    """The divergences between ranks' captures of the same blocks (index-aligned, rank order).
    ``input_shapes``: per rank, per block, a text of the block's input shapes (empty: unknown)."""
    world = len(blocks_per_rank)
    if world < 2:
        return ()
    found: dict[tuple[object, ...], RankDivergence] = {}
    for index, block in enumerate(blocks_per_rank[0]):
        per_rank = [blocks[index] for blocks in blocks_per_rank]
        met: dict[BreakKey, set[int]] = {}
        first: dict[BreakKey, Break] = {}
        for rank, report in enumerate(per_rank):
            for brk in report.breaks:
                met.setdefault(break_key(brk), set()).add(rank)
                first.setdefault(break_key(brk), brk)
        shared = [first[k] for k, ranks in met.items() if len(ranks) == world]
        shapes = {s[index] for s in input_shapes if index < len(s)}
        cause = _cause(shared, shapes)
        for key, ranks in met.items():
            if len(ranks) == world:
                continue
            brk = first[key]
            hazard = _hazard(brk, block.kind, setup)
            found_key = (block.kind, key, tuple(sorted(ranks)))
            if found_key in found:
                found[found_key] = _one_more_layer(found[found_key])
                continue
            found[found_key] = RankDivergence(
                block=block.fqn,
                kind=block.kind,
                ranks=tuple(sorted(ranks)),
                without=tuple(r for r in range(world) if r not in ranks),
                gb_type=brk.gb_type,
                location=brk.location,
                break_cause=brk.cause,
                cause=cause,
                hazard=hazard,
                fix=_fix(cause, hazard, brk),
            )
    return tuple(found.values())


def _one_more_layer(found: RankDivergence) -> RankDivergence:
    from dataclasses import replace

    return replace(found, layers=found.layers + 1)


def _cause(shared: list[Break], shapes: set[str]) -> DivergenceCause:
    if len(shapes) > 1:
        return DivergenceCause.PER_RANK_SHAPE
    if any(b.cause in DATA_DEPENDENT_CAUSES for b in shared):
        return DivergenceCause.PER_RANK_DATA
    return DivergenceCause.RANK_CONDITIONAL


def _hazard(brk: Break, kind: str, setup: SetupInfo) -> CollectiveHazard:
    # Tensor parallel puts collectives in every block's graphs; expert parallel, in its MoE
    # blocks' (the token all-to-all).
    expert_parallel = setup.ep_degree > 1 and BlockKind.parse(kind).base == "moe"
    collectives_in_graphs = setup.tp_degree > 1 or expert_parallel
    if collectives_in_graphs or brk.cause in COLLECTIVE_CAUSES:
        return CollectiveHazard.CAN_DESYNC
    return CollectiveHazard.CANNOT_DESYNC


def _fix(cause: DivergenceCause, hazard: CollectiveHazard, brk: Break) -> str:
    if cause == DivergenceCause.PER_RANK_SHAPE:
        fix = "give every rank the same shapes (pad to shared buckets), or mark the varying dimension dynamic"
    elif cause == DivergenceCause.PER_RANK_DATA:
        fix = (
            "make the branch traceable on every rank (torch.where / torch.cond instead of a "
            "Python branch on a tensor), or let ranks agree on what to compile: "
            "torch._dynamo.config.enable_compiler_collectives = True"
        )
    elif brk.cause == "python-side-effect":
        fix = (
            "move the logging out of the compiled region (log after the compiled call), or let "
            "Dynamo defer it: torch._dynamo.config.reorderable_logging_functions.add(print)"
        )
    else:
        fix = "run the same code on every rank inside the compiled region, or move the rank-only code out of it"
    if hazard == CollectiveHazard.CAN_DESYNC:
        fix += (
            "; until then enable compiler collectives "
            "(torch._dynamo.config.enable_compiler_collectives = True) so ranks compile alike"
        )
    return fix
