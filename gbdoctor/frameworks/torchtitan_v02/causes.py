"""What torchtitan adds to the cause taxonomy: the precedents of generic fixes (torchtitan's
setup applies them) and the upstream bug its setup hits (``causes.contributions``).

Light: no torch import (frameworks load when the command line is built)."""

from __future__ import annotations

from gbdoctor.causes.contributions import BlockerPrecedent, CauseKnowledge, Precedent
from gbdoctor.causes.known_issues import KnownIssue
from gbdoctor.records.enums import BlockerKind

TORCHTITAN_CAUSES = CauseKnowledge(
    precedents=(
        Precedent("fsdp-hook", 0, "torchtitan's order: compile, then FSDP"),
        Precedent("ep-dispatch", 0, "torchtitan's apply_compile does", after="= True"),
        Precedent("moe-load-balancing", 1, "as torchtitan does"),
        Precedent("inplace-in-sac", 0, "torchtitan does", after="= True"),
        Precedent("tensor-parallel", 0, "torchtitan's order", after="each block whole"),
        Precedent("tensor-parallel", 2, "torchtitan PR #3737"),
    ),
    blocker_precedents=(
        BlockerPrecedent(
            BlockerKind.COLLECTIVE,
            "torchtitan sets NCCL_GRAPH_REGISTER=0",
            after="replays the same graphs",
        ),
        BlockerPrecedent(
            BlockerKind.DYNAMIC_SHAPE, "torchtitan pads expert groups", after="a fixed size"
        ),
        BlockerPrecedent(
            BlockerKind.RELEASED_STATIC_INPUT,
            "torchtitan's SimpleFSDP in graph_trainer",
            after="inside the compiled graph",
        ),
    ),
    known_issues=(
        KnownIssue(
            pattern=r"profiler\._record_function_enter_new\S* invocation index \d+ encountered "
            r"during backward but not found in storage",
            summary=(
                "per-op selective AC replays a different number of FSDP record_function ops in "
                "the recompute than in the forward when FSDP all-gathers inside the checkpointed "
                "block (torchtitan's separate fully_shard of the experts under EP)"
            ),
            link="https://github.com/pytorch/torchtitan/issues/3427 "
            "(fix: https://github.com/pytorch/pytorch/pull/196862)",
            workaround='activation_checkpoint.mode = "full" (or selective_ac_option = a layer '
            "count) until the torch release with the fix",
            overrides=("activation_checkpoint.mode=full",),
        ),
    ),
)
"""The torchtitan v0.2 mirror's ``cause_knowledge`` (``CauseContributor``)."""
