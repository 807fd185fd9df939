"""``scan`` of a framework that captures whole engine steps (``CaptureStyle.ENGINE_STEPS``):
several real training steps through the engine, captured whole.

Unlike the per-block scan (one fresh capture per block kind, replaying the block's recorded
inputs), such a framework's compiled region is usually the whole model (DeepSpeed's
``engine.compile()``) and its hooks depend on the engine's step bookkeeping (ZeRO-3's
parameter-fetch trace, module stack), so a block cannot be driven alone the way training drives
it. Each rank therefore runs the framework's setup and compile, then :data:`CAPTURE_STEPS`
training steps inside one capture, recording every break with its real user stack and the
module instance whose frame broke, and every recompile with its guard failure (plus the
``recompile_limit`` hits). Breaks are reported per block (the block containing the module),
everything outside the blocks on the framework's root row (``Framework.root_region``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from gbdoctor.capture import (
    CaptureSession,
    Locator,
    RawCapture,
    clean_fqn,
    describe_error,
    error_traceback,
    strict_breaks,
    within,
)
from gbdoctor.capture.locate import portable_path
from gbdoctor.capture.recompiles import watch_recompiles
from gbdoctor.causes import NO_FRAMEWORK_HOOKS, FrameworkHooks
from gbdoctor.errors import SetupError
from gbdoctor.frameworks.interface import CaptureStyle, EngineStepFramework, Framework
from gbdoctor.frameworks.registry import hooks_of
from gbdoctor.records import BlockReport, Event, EventKind, Recompile, ScanReport, Spec
from gbdoctor.scan.block_report import block_report, event_order
from gbdoctor.scan.job import Progress, RankScan, ScanJob
from gbdoctor.scan.merge import merge_ranks
from gbdoctor.scan.rank import build_and_setup
from gbdoctor.setup.apply import BlockSlot
from gbdoctor.setup.dist import run_ranks
from gbdoctor.setup.train import step_batch

CAPTURE_STEPS = 3
"""Training steps per engine-step capture: step 0 compiles, the later ones show whether the
compiled code is reused or recompiled ("recompiles every few steps", measured)."""


def scan_engine_steps(
    spec: Spec,
    framework: Framework,
    device: str,
    *,
    strategy: Any,
    progress: Progress | None = None,
    strict: bool = False,
) -> ScanReport:
    """Scan a spec whose framework captures whole engine steps. Every rank (world size 1 too)
    is a spawned process: such an engine keeps process-wide state (DeepSpeed's comm backend,
    ZeRO's module stack, the nvtx switch ``engine.compile`` flips) that a second setup in one
    process would inherit."""
    engine = _engine_framework(framework)
    # These scans train real steps on local ranks: no simulation, and the same size limits as
    # `run`, checked by the caller (``environment.scan_decision``: exit 2 with how to shrink).
    job = ScanJob(
        spec=spec,
        framework=framework,
        strategy=strategy,
        device=device,
        dedupe=False,
        strict=strict,
    )
    world = spec.parallelism.world_size
    engine.prepare_ranks(device)
    if progress:
        progress(f"{engine.set_up_words} + {CAPTURE_STEPS} captured steps on {world} rank(s)", 0, 1)
    ranks = run_ranks(
        scan_engine_steps_rank,
        job,
        world_size=world,
        device_type=device,
        timeout_s=spec.gbdoctor.timeout_s,
    )
    if progress:
        progress("captured", 1, 1)
    return merge_ranks(spec, job, ranks)


def _engine_framework(framework: Framework) -> EngineStepFramework:
    if framework.capture_style != CaptureStyle.ENGINE_STEPS:
        raise SetupError(f"{framework.name} scans capture per block, not whole engine steps")
    if not isinstance(framework, EngineStepFramework):
        raise SetupError(
            f"framework '{framework.name}' captures whole engine steps but does not implement "
            "gbdoctor.frameworks.interface.EngineStepFramework (root_region, set_up_words, "
            "engine_setup_info, engine_notes)"
        )
    return framework


def scan_engine_steps_rank(job: ScanJob) -> RankScan:
    """One rank: build, the framework's setup + compile, capture ``CAPTURE_STEPS`` steps."""
    from gbdoctor.models import vocab_size

    spec = job.spec
    recipe = _engine_framework(job.framework)
    session = CaptureSession()
    setup, meshes = build_and_setup(job, session)
    session.locator = Locator(setup.model, setup.hooks)
    session.module_names = {id(m): clean_fqn(n) for n, m in setup.model.named_modules()}
    vocab = vocab_size(setup.model)
    losses: list[float] = []
    strict = job.strict and all(set(s.regions) == set(s.fullgraph_regions) for s in setup.blocks)
    try:
        with (
            recipe.step_context(setup),
            session.capture() as raw,
            watch_recompiles() as recorder,
        ):
            for step in range(CAPTURE_STEPS):
                recorder.tag(step=step, measured=False)
                tokens, labels = step_batch(spec, meshes, vocab, step)
                try:
                    if strict:
                        with strict_breaks():
                            losses.append(recipe.train_step(setup, tokens, labels))
                    else:
                        losses.append(recipe.train_step(setup, tokens, labels))
                except Exception as exc:  # a step that cannot be traced is data, not a crash
                    raw.error = f"step {step}: {describe_error(exc)}"
                    raw.error_traceback = error_traceback(exc)
                    break
    finally:
        recipe.release_rank()
    reports = split_by_block(
        setup,
        raw,
        recorder.records,
        recipe.root_region,
        spec_root=spec.root or None,
        hooks=hooks_of(recipe),
    )
    info = recipe.engine_setup_info(spec, job.strategy, job.device, setup, CAPTURE_STEPS)
    notes = recipe.engine_notes(spec, job.strategy, CAPTURE_STEPS, losses)
    return tuple(reports), info, notes


def split_by_block(
    setup: Any,
    raw: RawCapture,
    recompiles: list[Recompile],
    root: str,
    *,
    spec_root: str | None = None,
    hooks: FrameworkHooks = NO_FRAMEWORK_HOOKS,
) -> list[BlockReport]:
    """Per-block reports from one whole-model capture: each break goes to the block containing
    the module it was attributed to; breaks outside every block, and recompiles of code that is
    not one block's own (ZeRO's hooks serve every module), go to the ``root`` row. Paths are
    relative to ``spec_root`` (the spec's ``Spec.root``), as in every scan."""
    slots = list(setup.blocks)
    whole = setup.strategy.mode == "engine"
    root_regions = (root,) if whole else ()
    root_slot = BlockSlot(
        fqn=root,
        key="",
        block=setup.model,
        outer=setup.model,
        is_moe=False,
        kind="model",
        regions=root_regions,
        fullgraph_regions=root_regions if setup.strategy.fullgraph else (),
    )

    def owner(module: str) -> str:
        return next((s.fqn for s in slots if within(module, s.fqn)), root)

    parts: dict[str, RawCapture] = {s.fqn: RawCapture() for s in [*slots, root_slot]}
    for rb, region in raw.breaks:
        parts[owner(rb.module)].breaks.append((rb, region or owner(rb.module)))
    for rb, region in raw.frame_skips:
        parts[owner(rb.module)].frame_skips.append((rb, region or owner(rb.module)))
    for region, ops in raw.graphs.items():
        parts[region if region in parts else root].graphs.setdefault(region, []).extend(ops)
    # CUDA-graph readiness: each compiled region's ATen graphs and findings go to its row.
    for finding in raw.cudagraph_findings:
        parts[finding.region if finding.region in parts else root].cudagraph_findings.append(
            finding
        )
    for region, n in raw.aten_graphs_by_region.items():
        parts[region if region in parts else root].aten_graphs += n
    seen = {rb.gb_type for rb, _ in raw.breaks}
    parts[root].counter_types = {t: n for t, n in raw.counter_types.items() if t not in seen}
    parts[root].error = raw.error
    reports = []
    portable = [_portable(r, spec_root) for r in recompiles]
    for slot in [root_slot, *slots]:
        report = block_report(slot, parts[slot.fqn], root=spec_root, hooks=hooks)
        mine = tuple(r for r in portable if _recompile_owner(r, slots, root, spec_root) == slot.fqn)
        limits = {
            r.function: Event(
                kind=EventKind.RECOMPILE_LIMIT,
                module=slot.fqn,
                gb_type="Dynamo recompile limit exceeded",
                detail=f"{r.function} hit {r.hint.removeprefix('hit ')}: it runs eagerly from now "
                f"on, for every module it serves (last guard failure: {r.reason})",
            )
            for r in mine
            if r.limit_hit
        }
        events = tuple(sorted(report.events + tuple(limits.values()), key=event_order))
        reports.append(replace(report, recompiles=mine, events=events))
    return reports


_CODE_AT = re.compile(r"^(?P<name>\S+) at (?P<path>.+):(?P<line>\d+)$")


def _portable(rec: Recompile, spec_root: str | None) -> Recompile:
    """Paths in a recompile record that do not depend on the machine (as break locations)."""
    m = _CODE_AT.match(rec.function)
    function = (
        f"{m['name']} at {portable_path(m['path'], spec_root)}:{m['line']}" if m else rec.function
    )
    location = rec.location
    if location and ":" in location:
        path, _, line = location.rpartition(":")
        location = f"{portable_path(path, spec_root)}:{line}"
    return replace(rec, function=function, location=location)


def _recompile_owner(rec: Recompile, slots: list[Any], root: str, spec_root: str | None) -> str:
    """Recompiles of a block's own forward (per-block compile) belong to the first block using
    that code; everything else (ZeRO's hooks, the model's forward) to the root row."""
    import inspect

    for slot in slots:
        fn = getattr(type(slot.block), "forward", None)
        code = getattr(inspect.unwrap(fn), "__code__", None) if fn is not None else None
        if code is not None and rec.function.startswith(
            f"{code.co_name} at {portable_path(code.co_filename, spec_root)}:"
        ):
            return slot.fqn
    return root
