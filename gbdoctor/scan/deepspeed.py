"""``scan`` of a DeepSpeed setup: several real training steps through the engine, captured whole.

Unlike the torchtitan scan (one fresh capture per block kind, replaying the block's recorded
inputs), DeepSpeed's compiled region is usually the whole model (``engine.compile()``) and ZeRO-3's
hooks depend on the engine's step bookkeeping (parameter-fetch trace, module stack), so a block
cannot be driven alone the way training drives it. Each rank therefore runs
``deepspeed.initialize`` + the strategy's compile (the DeepSpeed recipe), then
:data:`CAPTURE_STEPS` training steps (``engine(x)``, ``engine.backward``, ``engine.step``) inside
one capture, recording every break with its real user stack and the module instance whose frame
broke, and every recompile with its guard failure (plus the ``recompile_limit`` hits). Breaks
are reported per block (the block containing the module), everything outside the blocks on a
``model`` row.
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
from gbdoctor.records import BlockReport, Event, EventKind, Recompile, ScanReport, SetupInfo, Spec
from gbdoctor.scan.job import Progress, RankScan, ScanJob
from gbdoctor.scan.merge import merge_ranks
from gbdoctor.scan.rank import block_report, build_and_setup, event_order
from gbdoctor.setup.apply import BlockSlot
from gbdoctor.setup.deepspeed import ROOT_REGION, check_jit_lock, cleanup_shared_memory
from gbdoctor.setup.dist import resolve_device, run_ranks
from gbdoctor.setup.recipe import recipe_for
from gbdoctor.setup.train import synthetic_batch

CAPTURE_STEPS = 3
"""Training steps per DeepSpeed capture: step 0 compiles, the later ones show whether the
compiled code is reused or recompiled ("recompiles every few steps", measured)."""


def scan_deepspeed(
    spec: Spec, *, strategy: Any, progress: Progress | None = None, strict: bool = False
) -> ScanReport:
    """Scan a ``framework = "deepspeed"`` spec. Every rank (world size 1 too) is a spawned
    process: DeepSpeed keeps process-wide state (its comm backend, ZeRO's module stack, the
    nvtx switch ``engine.compile`` flips) that a second setup in one process would inherit."""
    from gbdoctor.scan.estimate import require_real

    # DeepSpeed scans train real steps on local ranks: no simulation, and the same size limits
    # as `run` (exit 2 with how to shrink the spec).
    require_real(spec, command="scan")
    device = resolve_device(spec.gbdoctor.device)
    job = ScanJob(spec=spec, strategy=strategy, device=device, dedupe=False, strict=strict)
    world = spec.parallelism.world_size
    check_jit_lock(device)
    if progress:
        progress(f"deepspeed.initialize + {CAPTURE_STEPS} captured steps on {world} rank(s)", 0, 1)
    ranks = run_ranks(
        scan_deepspeed_rank,
        job,
        world_size=world,
        device_type=device,
        timeout_s=spec.gbdoctor.timeout_s,
    )
    if progress:
        progress("captured", 1, 1)
    return merge_ranks(spec, job, ranks)


def scan_deepspeed_rank(job: ScanJob) -> RankScan:
    """One rank: build, ``deepspeed.initialize`` + compile, capture ``CAPTURE_STEPS`` steps."""
    import torch.distributed as dist

    from gbdoctor.models import vocab_size

    spec = job.spec
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe = recipe_for(spec)
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
                tokens, labels = synthetic_batch(
                    seed=spec.training.seed,
                    step=step,
                    vocab=vocab,
                    local_batch=spec.capture_batch_size,
                    seq_len=spec.capture_seq_len,
                    rank=rank,
                    world_size=world,
                    device=meshes.device,
                )
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
        cleanup_shared_memory()
    reports = split_by_block(setup, raw, recorder.records, ROOT_REGION, spec_root=spec.root or None)
    stage = spec.deepspeed.zero_stage if spec.deepspeed else None
    info = SetupInfo(
        strategy=job.strategy.name,
        device=job.device,
        world_size=world,
        ep_degree=1,
        dp_shard=spec.parallelism.dp_shard,
        ac_mode="none",
        ac_option="",
        fsdp=False,
        dynamo_config=tuple(sorted((k, repr(v)) for k, v in setup.dynamo_flags)),
        batch_size=spec.capture_batch_size,
        seq_len=spec.capture_seq_len,
        framework="deepspeed",
        zero_stage=stage,
        steps=CAPTURE_STEPS,
        plan=job.strategy.plan,
    )
    notes = [
        f"DeepSpeed ZeRO-{stage}, {job.strategy.summary}; {CAPTURE_STEPS} training steps captured "
        f"through the engine on every rank (losses {', '.join(f'{x:.4f}' for x in losses)})"
    ]
    if spec.deepspeed and spec.deepspeed.filled:
        notes.append(
            "gbdoctor filled in DeepSpeed config keys the spec leaves out: "
            + ", ".join(spec.deepspeed.filled)
        )
    return tuple(reports), info, tuple(notes)


def split_by_block(
    setup: Any,
    raw: RawCapture,
    recompiles: list[Recompile],
    root: str,
    *,
    spec_root: str | None = None,
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
        report = block_report(slot, parts[slot.fqn], root=spec_root)
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
