"""Decide before materializing: real local ranks, or a simulation, for every command that builds a model.

One rule (``decide``), used by ``scan``, ``inspect``, ``plan`` and ``gate``; ``run`` trains for real
and calls ``require_real`` instead, which refuses (exit 2) where ``decide`` would simulate:

1. ``--simulate`` / ``[gbdoctor] simulate = true``: simulated, as asked.
2. A world larger than the ranks this machine runs locally (``local_world_limit``): simulated.
3. The memory a real scan needs on this machine does not fit in the memory available: simulated.
   The model is built on the meta device (nothing allocated) and ``scan.memory_estimate`` adds
   up, per rank, what a real scan holds at its peak, times the local ranks, against a safe share
   of the memory available.
4. FlexAttention flavors cannot be simulated: FlexAttention has no CPU backward, and simulation
   runs fake CPU tensors. A spec that would be simulated with one is refused with exit 2 naming
   the flavor and the ways around it.
5. A real scan on CPU at the training shape whose compute would take minutes captures at a
   smaller shape instead, when the spec does not set ``[gbdoctor] batch_size`` / ``seq_len``
   (``scan.cpu_capture_shape``). Simulated scans (fake tensors) keep the training shape.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.records import Decision, MemoryEstimate, Spec
from gbdoctor.scan.cpu_capture_shape import capture_shape
from gbdoctor.scan.memory_estimate import available_memory, describe, estimate_memory

# ------------------------------------------------------------------------------ local limits


def local_world_limit() -> int:
    """Most ranks a real scan spawns on this machine: two per CPU core.

    Every local rank holds a full copy of the model and runs its own Dynamo; past about two per
    core a CPU machine thrashes, and a production world (64, 256 ranks) could not run at all.
    """
    from gbdoctor.setup import launched

    session = launched.current()
    if session is not None:
        return session.world_size  # a launcher's ranks are real, wherever they run
    return max(2, 2 * (os.cpu_count() or 1))


# ------------------------------------------------------------------------------ the rule


def flex_flavor(spec: Spec) -> bool:
    """Whether a built-in flavor uses FlexAttention (custom models: not known before running)."""
    from gbdoctor.models import model_facts

    return model_facts(spec.model).attn_type == "flex"


def _refuse_flex(spec: Spec, reason: str) -> None:
    why = "simulation was requested" if reason == "requested" else reason
    raise SpecError(
        f"{spec.model.name} flavor '{spec.model.flavor}' uses FlexAttention, which has no CPU "
        f"backward, so it cannot be simulated on fake CPU tensors ({why})",
        hint=f"scan it for real on a CUDA machine, or at a size that fits (e.g. --set model.flavor="
        f"{_sdpa_twin(spec)} for the same setup with SDPA attention)",
    )


def _sdpa_twin(spec: Spec) -> str:
    from gbdoctor.models import family_flavors

    for suffix in ("_flex_attn", "_irope"):
        base = spec.model.flavor.removesuffix(suffix)
        if base != spec.model.flavor and base in family_flavors(spec.model.name):
            return base
    return "debugmodel"


def decide(spec: Spec, *, model: Any = None, available: int | None = None) -> Decision:
    """Real local ranks or a simulation for ``spec`` (the module docstring's rule).

    ``model``: the spec's model built on meta (built here when not given). ``available``: bytes
    available (read from the machine when not given; tests inject it)."""
    if spec.gbdoctor.simulate:
        decision = Decision(simulate=True, reason="requested")
    else:
        world, limit = spec.parallelism.world_size, local_world_limit()
        if world > limit:
            decision = Decision(
                simulate=True,
                reason=(
                    f"world size {world} exceeds the {limit} ranks this machine runs locally "
                    f"(2 per CPU core), so the scan was simulated automatically"
                ),
            )
        else:
            if model is None:
                model = _meta_model(spec)
            # Memory is estimated at the shape a real scan would capture (rule 5); a simulation
            # computes nothing and keeps the training shape.
            shaped = capture_shape(spec, model)
            shape, notice = shaped if shaped else (None, None)
            decision = _memory_decision(
                pin(spec, Decision(simulate=False, capture_shape=shape)), model, available
            )
            if not decision.simulate:
                decision = replace(decision, capture_shape=shape, notice=notice)
            elif shape is not None:
                # Too large even at the smaller shape: the notice gives the estimate at the
                # training shape, which the simulation keeps.
                decision = _memory_decision(spec, model, available)
    if decision.simulate and flex_flavor(spec):
        _refuse_flex(spec, decision.reason or "")
    return decision


def _meta_model(spec: Spec) -> Any:
    from gbdoctor.frameworks.registry import framework_for, meta_model

    # Where the caller passed none: a command that needs the model again builds it once and
    # passes it (``run``: its memory check, its plan's decision and its FLOPs).
    return meta_model(framework_for(spec), spec)


def _memory_decision(spec: Spec, model: Any, available: int | None) -> Decision:
    from gbdoctor.setup.dist import resolve_device

    device = resolve_device(spec.gbdoctor.device)
    if available is None:
        available = available_memory(device)
    if model is None:
        model = _meta_model(spec)
    estimate = estimate_memory(spec, model, available=available)
    if device == "cuda":
        # Each rank has a GPU of its own: compare one rank with one device.
        estimate = replace(estimate, local_ranks=1)
    if estimate.fits:
        return Decision(simulate=False, estimate=estimate)
    return Decision(
        simulate=True,
        estimate=estimate,
        reason=(f"a real scan {describe(estimate)}, so the scan was simulated automatically"),
    )


def pin(spec: Spec, decision: Decision) -> Spec:
    """``spec`` with the decision fixed (``[gbdoctor] simulate``, and the capture shape when it
    was reduced), so re-scans (plan rounds) do not decide again."""
    tool = replace(spec.gbdoctor, simulate=decision.simulate)
    if decision.capture_shape is not None:
        tool = replace(
            tool, batch_size=decision.capture_shape[0], seq_len=decision.capture_shape[1]
        )
    return spec if tool == spec.gbdoctor else replace(spec, gbdoctor=tool)


def require_real(
    spec: Spec, *, available: int | None = None, command: str = "run", model: Any = None
) -> MemoryEstimate | None:
    """For ``run`` (it trains for real and cannot simulate): the estimate, or exit 2 with how to
    shrink the spec when ``decide`` would simulate. ``model``: the spec's model built on meta
    (built here when not given)."""
    if spec.gbdoctor.simulate:
        raise SpecError(
            f"`gbdoctor {command}` trains for real and cannot simulate "
            "([gbdoctor] simulate = true)",
            hint="drop --set gbdoctor.simulate=true; use `gbdoctor scan --simulate` to see "
            "the breaks of a production-size spec",
        )
    world, limit = spec.parallelism.world_size, local_world_limit()
    if world > limit:
        raise SpecError(
            f"`gbdoctor {command}` trains for real on local ranks, and world size {world} "
            f"exceeds the {limit} this machine runs (2 per CPU core)",
            hint="shrink the world, e.g. --world-size 2 or --set parallelism."
            "data_parallel_shard_degree=2 (EP must divide it)",
        )
    decision = _memory_decision(spec, model, available)
    if decision.simulate:
        assert decision.estimate is not None
        raise SpecError(
            f"`gbdoctor {command}` trains for real and cannot simulate: a real run "
            f"{describe(decision.estimate)}",
            hint=shrink_hint(spec, decision.estimate),
        )
    return decision.estimate


def shrink_hint(spec: Spec, estimate: MemoryEstimate) -> str:
    """How to make ``spec`` fit: a smaller flavor when the weights alone do not, else smaller shapes."""
    state = estimate.params + estimate.grads + estimate.optimizer + estimate.overhead
    if state * estimate.local_ranks > estimate.budget and spec.model.name != "custom":
        return (
            f"run a smaller flavor with the same setup, e.g. --set model.flavor={_smallest(spec)} "
            "(and --set gbdoctor.batch_size=2 --set gbdoctor.seq_len=64), or run on a machine "
            "with more memory"
        )
    return (
        "shrink the step, e.g. --set gbdoctor.batch_size=2 --set gbdoctor.seq_len=64, or run on "
        "a machine with more memory"
    )


def _smallest(spec: Spec) -> str:
    from gbdoctor.models import family_flavors

    flavors = family_flavors(spec.model.name)
    return (
        "debugmodel" if "debugmodel" in flavors else (flavors[0] if flavors else spec.model.flavor)
    )
