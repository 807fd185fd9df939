"""The spec check of ``[parallelism]``'s context-parallel keys (``sections.check_parallelism``
calls it): what gbdoctor runs (``setup/context_parallel.py``, docs/pipeline.md) and, for what it
cannot, one line with the reason and what to scan instead.

No torch import here; the model registry (``gbdoctor.models``) is imported lazily.
"""

from __future__ import annotations

from gbdoctor.frameworks.common.schema import CP_ROTATE_METHODS
from gbdoctor.frameworks.common.specfile import SpecContext
from gbdoctor.records import ModelSpec, ParallelSpec


def check_cp(p: ParallelSpec, model: ModelSpec, ctx: SpecContext) -> None:
    """What context parallelism gbdoctor runs (``setup/context_parallel.py``, docs/pipeline.md):
    torchtitan v0.2.2's CP context around the step, on a (dp_shard x cp) mesh, SDPA attention
    through torch's ring attention; each refusal names what to scan instead."""
    cp, where = p.context_parallel_degree, ctx.where("parallelism", "context_parallel_degree")
    rotate = p.context_parallel_rotate_method
    if rotate not in CP_ROTATE_METHODS:
        ctx.fail(
            f"{ctx.where('parallelism', 'context_parallel_rotate_method')} = '{rotate}' is not "
            f"one of {', '.join(CP_ROTATE_METHODS)}",
            "torch's set_rotate_method values: allgather (torchtitan's default) or alltoall",
        )
    if cp == 1:
        return
    others = [
        f"{key} = {getattr(p, key)}"
        for key in ("tensor_parallel_degree", "pipeline_parallel_degree", "expert_parallel_degree")
        if getattr(p, key) > 1
    ]
    if others:
        ctx.fail(
            f"{where} = {cp} together with {', '.join(others)}: not supported yet (gbdoctor "
            "runs CP on the dp_shard x cp mesh; CP's own findings come from attention, which the "
            "other degrees do not change)",
            f"scan CP with those degrees at 1 (--set parallelism.{others[0].split(' ')[0]}=1), "
            "and the other degrees with context_parallel_degree = 1",
        )
    from gbdoctor.models import model_facts

    # Custom models: not known before running (their facts are all None).
    if model_facts(model).attn_type == "flex":
        ctx.fail(
            f"{where} = {cp} with {model.name} flavor '{model.flavor}' (FlexAttention): CP's "
            "Flex path cannot run on CPU: torch's context_parallel routes SDPA only (Flex needs "
            "its _ContextParallel module wrapper and a sharded BlockMask), and FlexAttention has "
            "no CPU backward",
            "scan the SDPA flavor under CP (--set model.flavor=debugmodel), or this flavor with "
            "context_parallel_degree = 1",
        )
