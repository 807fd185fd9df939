"""``scan``: choose where the capture runs, run it there, merge the ranks.

Three environments, one per-rank pipeline (``scan.rank.scan_rank``):

- in-process: world size 1, a single-process group;
- spawned ranks: world size N, one spawned process per rank (``setup.dist.run_ranks``);
- simulated: ``--simulate``, a world too large for local ranks, or a spec whose estimated memory
  does not fit this machine (``scan.estimate.decide``, the rule every command that builds a
  model follows); rank 0 of N in this process on a fake process group and fake tensors
  (``scan.simulate``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gbdoctor.errors import SetupError
from gbdoctor.frameworks import CaptureStyle, Framework, framework_for
from gbdoctor.frameworks.registry import can_simulate, runs_own_pipeline
from gbdoctor.records import Decision, ScanReport, Spec
from gbdoctor.records.shapes import ShapeStream
from gbdoctor.scan.estimate import decide, pin, require_real
from gbdoctor.scan.job import Progress, ScanJob, probe_by_default, strategy_for
from gbdoctor.scan.merge import merge_ranks, with_layout
from gbdoctor.scan.rank import scan_rank, scan_rank_entry
from gbdoctor.scan.simulate import (
    fake_process_group,
    simulation_mode,
    simulation_notes,
)
from gbdoctor.setup import launched
from gbdoctor.setup.dist import resolve_device, run_ranks, single_process_group


def scan(
    spec: Spec,
    *,
    strategy: Any = None,
    dedupe: bool = True,
    progress: Progress | None = None,
    strict: bool = False,
    recompiles: bool | None = None,
    decision: Decision | None = None,
    shapes: ShapeStream | None = None,
    framework: Framework | None = None,
) -> ScanReport:
    """Scan ``spec``; multi-rank specs run on spawned local ranks and are merged. DeepSpeed
    Specs of a framework that captures whole engine steps (``CaptureStyle.ENGINE_STEPS``) are
    captured over several steps (``scan.engine_steps``), which record their recompiles
    themselves.

    ``recompiles``: probe every captured block with changed inputs (``probe.py``; about two
    eager training steps and two block replays per block kind); None: on unless
    ``GBDOCTOR_RECOMPILE_PROBE=0`` (``job.probe_by_default``). A simulation runs no step, so it
    never probes. ``decision``: an earlier :func:`scan_decision` to keep (plan re-scans keep
    the first one, its reason and notice included); None decides now. With ``recompiles``, a
    real pipeline-parallel scan also trains the config's schedule on its ranks
    (``scan.pipeline_schedule``: the recompiles and crashes only PP causes). ``shapes``: a
    shape stream whose distinct shapes the probe steps follow instead (docs/shapes.md); it
    turns the probe on. ``framework``: the spec's, where the command resolved it (a plan's
    re-scans pass the plan's); None: resolved here, once for the scan and its ranks."""
    if framework is None:
        framework = framework_for(spec)
    if recompiles is None:
        recompiles = probe_by_default() or shapes is not None
    probe_shapes = (
        tuple(dict.fromkeys(shapes.shape(i, 0).shape for i in range(len(shapes.steps))))
        if shapes is not None and recompiles
        else ()
    )
    if strategy is None or isinstance(strategy, str):
        strategy = strategy_for(framework, spec, strategy)
    launched.check_world(spec.parallelism.world_size)
    if decision is None:
        decision = scan_decision(spec, framework)
    if framework.capture_style == CaptureStyle.ENGINE_STEPS:
        from gbdoctor.scan.engine_steps import scan_engine_steps

        # Real ranks always (such a framework never simulates): the device is resolved here.
        device = resolve_device(spec.gbdoctor.device)
        return scan_engine_steps(
            spec, framework, device, strategy=strategy, progress=progress, strict=strict
        )
    spec = pin(spec, decision)
    if decision.simulate:
        return simulate_scan(
            spec,
            strategy=strategy,
            dedupe=dedupe,
            progress=progress,
            strict=strict,
            reason=decision.reason,
            framework=framework,
        )
    # Resolved only for a real scan: a simulation runs on fake CPU tensors whatever the device.
    device = resolve_device(spec.gbdoctor.device)
    job = ScanJob(
        spec=spec,
        framework=framework,
        strategy=strategy,
        device=device,
        dedupe=dedupe,
        strict=strict,
        probe_recompiles=recompiles,
        probe_shapes=probe_shapes,
    )
    world = spec.parallelism.world_size
    if world == 1 and launched.current() is None:
        with single_process_group(device, spec.gbdoctor.timeout_s):
            ranks = [scan_rank(job, progress)]
    else:
        if progress:
            progress(f"starting {world} ranks", 0, 1)
        ranks = run_ranks(
            scan_rank_entry,
            job,
            world_size=world,
            device_type=device,
            timeout_s=spec.gbdoctor.timeout_s,
            progress=(
                (
                    lambda message, done, total: progress(
                        f"rank 0 of {world}: {message}", done, total
                    )
                )
                if progress
                else None
            ),
        )
        if progress:
            progress(f"captured on {world} ranks", 1, 1)
    report = merge_ranks(spec, job, ranks)
    if (
        recompiles
        and spec.parallelism.pp_enabled
        and launched.current() is None
        and not runs_own_pipeline(framework)
    ):
        report = _with_pipeline_schedule(spec, report, progress)
    if probe_shapes and shapes is not None:
        note = (
            f"recompile probe: the {len(probe_shapes)} distinct shapes of --shapes "
            f"{shapes.source or 'file'} (rank 0's), in stream order"
        )
        report = replace(report, notes=(*report.notes, note))
    return with_notice(report, decision)


def _with_pipeline_schedule(
    spec: Spec, report: ScanReport, progress: Progress | None
) -> ScanReport:
    """``report`` with what training the spec's pipeline schedule for real found."""
    from gbdoctor.scan.pipeline_schedule import run_schedule, runnable, with_schedule

    why = runnable(spec)
    if why is not None:
        return replace(report, notes=(*report.notes, f"pipeline schedule: not run: {why}"))
    if progress:
        progress(f"training the {spec.parallelism.pipeline_parallel_schedule} schedule", 0, 1)
    try:
        found = run_schedule(spec)
    except SetupError as exc:
        # A rank that died or ran out of time (not a crash the run recognizes): the capture
        # stands; the report says the schedule's findings are missing, and why.
        return replace(report, notes=(*report.notes, f"pipeline schedule: failed: {exc.message}"))
    return with_schedule(report, found)


def scan_decision(spec: Spec, framework: Framework | None = None, *, model: Any = None) -> Decision:
    """How a scan of ``spec`` runs, decided once per command (``plan`` keeps it for every
    re-scan, ``price`` for its scan and its plan): ``--simulate``, a world too large for local
    ranks or too much memory simulates, or a smaller CPU shape is captured (``estimate.decide``);
    a framework that cannot simulate runs for real or is refused with how to shrink it (exit 2),
    and so does one that captures whole engine steps (they train real steps). ``framework``:
    the spec's, where the command resolved it; None: resolved here. ``model``: the spec's
    model on meta where the command built it (``run``), else built here when needed."""
    if framework is None:
        framework = framework_for(spec)
    if can_simulate(framework) and framework.capture_style != CaptureStyle.ENGINE_STEPS:
        return decide(spec, model=model)
    return Decision(simulate=False, estimate=require_real(spec, command="scan", model=model))


def with_notice(report: ScanReport, decision: Decision) -> ScanReport:
    """``report`` with the decision's notice (a reduced capture shape) as its first note."""
    if decision.notice is None or decision.notice in report.notes:
        return report
    return replace(report, notes=(decision.notice, *report.notes))


def simulate_scan(
    spec: Spec,
    *,
    strategy: Any = None,
    dedupe: bool = True,
    progress: Progress | None = None,
    strict: bool = False,
    reason: str | None = "requested",
    framework: Framework | None = None,
) -> ScanReport:
    """Scan rank 0 of ``spec``'s world in this process, on a fake process group and fake tensors.
    ``framework``: the spec's, where the caller resolved it; None: resolved here."""
    if framework is None:
        framework = framework_for(spec)
    if strategy is None or isinstance(strategy, str):
        strategy = strategy_for(framework, spec, strategy)
    world = spec.parallelism.world_size
    # Fake tensors live on cpu whatever the spec's device: the fake backend needs no accelerator.
    job = ScanJob(
        spec=spec,
        framework=framework,
        strategy=strategy,
        device="cpu",
        dedupe=dedupe,
        strict=strict,
    )
    mode, _ = simulation_mode()
    if progress:
        progress(
            f"simulating rank 0 of {world} ranks"
            + ("" if reason == "requested" else f" ({reason})"),
            0,
            1,
        )
    with fake_process_group(world):
        rank0 = scan_rank(job, progress, fake_mode=mode)
    report = merge_ranks(spec, job, [rank0])
    # One process stands for the whole world: the layout counts the ranks it simulates, so the
    # report reads as the real scan it stands for.
    return with_layout(
        replace(
            report,
            setup=replace(report.setup, simulated=True),
            notes=simulation_notes(spec, reason) + report.notes,
        ),
        world,
    )
