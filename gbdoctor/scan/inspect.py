"""``inspect``: the model as set up, with what wraps, compiles, shards and hooks what."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch.nn as nn

from gbdoctor.capture import clean_fqn, find_hooks, torch_version, within
from gbdoctor.frameworks import CaptureStyle, Framework, framework_for
from gbdoctor.frameworks.registry import can_simulate
from gbdoctor.records import BlockSetup, HookInfo, SetupReport, Spec
from gbdoctor.scan.estimate import decide
from gbdoctor.scan.job import ScanJob, strategy_for
from gbdoctor.scan.merge import with_layout
from gbdoctor.scan.rank import build_and_setup, setup_info
from gbdoctor.scan.simulate import fake_process_group, simulation_mode, simulation_notice
from gbdoctor.setup import launched
from gbdoctor.setup.dist import resolve_device, run_ranks, single_process_group
from gbdoctor.spec import spec_notes


def inspect_spec(
    spec: Spec, *, strategy: str | None = None, framework: Framework | None = None
) -> SetupReport:
    """Set the spec's model up (on its real world size) and describe rank 0's view.

    The rule every command that builds a model follows (``scan.estimate.decide``) picks real
    local ranks or a simulation: a simulated inspect builds on meta and sets up rank 0 on a fake
    process group. ``framework``: the spec's, where the command resolved it; None: resolved
    here."""
    launched.check_world(spec.parallelism.world_size)
    if framework is None:
        framework = framework_for(spec)
    # A whole-engine-step framework (DeepSpeed) sets up on real local ranks only (no
    # simulation), always in fresh processes: its engine keeps process-wide state.
    own_processes = framework.capture_style == CaptureStyle.ENGINE_STEPS
    if not can_simulate(framework):
        from gbdoctor.scan.estimate import require_real

        require_real(spec, command="inspect")
    else:
        decision = decide(spec)
        if decision.simulate:
            return simulate_inspect(
                spec, strategy=strategy, reason=decision.reason, framework=framework
            )
    device = resolve_device(spec.gbdoctor.device)
    if not can_simulate(framework):
        framework.prepare_ranks(device)
    job = ScanJob(
        spec=spec,
        framework=framework,
        strategy=strategy_for(framework, spec, strategy),
        device=device,
    )
    world = spec.parallelism.world_size
    if world == 1 and not own_processes:
        with single_process_group(job.device, spec.gbdoctor.timeout_s):
            report = inspect_rank(job)
    else:
        report = run_ranks(
            inspect_rank,
            job,
            world_size=world,
            device_type=job.device,
            timeout_s=spec.gbdoctor.timeout_s,
        )[0]
    return with_layout(replace(report, notes=spec_notes(spec) + report.notes), world)


def simulate_inspect(
    spec: Spec,
    *,
    strategy: str | None = None,
    reason: str | None = "requested",
    framework: Framework | None = None,
) -> SetupReport:
    """Rank 0 of ``spec``'s world, set up on meta tensors and a fake process group, in this
    process (the same code as ``simulate_scan`` up to the capture). ``framework``: the spec's,
    where the caller resolved it; None: resolved here."""
    if framework is None:
        framework = framework_for(spec)
    job = ScanJob(
        spec=spec,
        framework=framework,
        strategy=strategy_for(framework, spec, strategy),
        device="cpu",
    )
    mode, _ = simulation_mode()
    with fake_process_group(spec.parallelism.world_size):
        report = inspect_rank(job, fake_mode=mode)
    notes = simulation_notice(spec, reason) + (
        f"simulated: rank 0 of {spec.parallelism.world_size} on a fake process group; the model "
        "was built on the meta device and set up by the same EP/AC/compile/FSDP2 code (parameter "
        "counts are rank 0's shards)",
    )
    return with_layout(
        replace(
            report, setup=replace(report.setup, simulated=True), notes=notes + spec_notes(spec)
        ),
        spec.parallelism.world_size,
    )


def _is_sharded(module: nn.Module) -> bool:
    """FSDP2-managed, or holding ZeRO-3-partitioned parameters of its own."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule) or any(
        hasattr(p, "ds_tensor") for p in module.parameters(recurse=False)
    )


def _local_numel(p: Any) -> int:
    """Elements of a parameter held on this rank (a DTensor's shard, a ZeRO-3 partition)."""
    if hasattr(p, "to_local"):
        return p.to_local().numel()
    if hasattr(p, "ds_tensor"):
        return p.ds_tensor.numel()
    return p.numel()


def inspect_rank(job: ScanJob, fake_mode: Any = None) -> SetupReport:
    setup, _ = build_and_setup(job, None, fake_mode)
    model = setup.model
    hooks = [
        HookInfo(module=h.module, kind=h.kind, installer=h.installer, name=h.name)
        for h in find_hooks(model, setup.hooks)
    ]
    hooks += [
        HookInfo(
            module=h.module,
            kind=h.kind,
            installer=h.installer,
            name=getattr(h.fn, "__qualname__", ""),
        )
        for h in setup.hooks
        if h.kind == "optimizer_pre_step"
    ]
    sharded = sorted({clean_fqn(n) or "<root>" for n, m in model.named_modules() if _is_sharded(m)})
    blocks = []
    for slot in setup.blocks:
        ac = tuple(slot.fqn if s == "" else f"{slot.fqn}.{s}" for s in slot.ac_wrapped)
        params = sum(_local_numel(p) for p in slot.block.parameters())
        blocks.append(
            BlockSetup(
                fqn=slot.fqn,
                kind=slot.kind,
                moe=slot.is_moe,
                ac_wrapped=ac,
                compiled=slot.regions,
                fullgraph=slot.fullgraph_regions,
                sharded=tuple(s for s in sharded if within(s, slot.fqn)),
                hooks=tuple(
                    sorted((h for h in hooks if within(h.module, slot.fqn)), key=_hook_order)
                ),
                params=int(params),
            )
        )
    in_block = lambda fqn: any(within(fqn, s.fqn) for s in setup.blocks)  # noqa: E731
    job.framework.release_rank()
    return SetupReport(
        spec=job.spec.key,
        model=f"{job.spec.model.name}/{job.spec.model.flavor}",
        torch_version=torch_version(),
        setup=setup_info(job.spec, job, setup),
        blocks=tuple(blocks),
        other_sharded=tuple(s for s in sharded if not in_block(s)),
        other_hooks=tuple(sorted((h for h in hooks if not in_block(h.module)), key=_hook_order)),
    )


def _hook_order(h: HookInfo) -> Any:
    return (h.module, h.kind, h.installer, h.name)
