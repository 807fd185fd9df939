"""One rank of a scan: build the model and its training setup, capture every block kind, classify.

Per rank: build -> set up (EP, AC, compile with recording backends, FSDP, optimizer) -> one
eager training step (FSDP lazy init, load-balancing hook, and the real arguments every block
receives) -> per distinct block kind, a fresh Dynamo capture of forward + backward through the
block's real wrappers -> records. ``scan.environment`` runs this on one or N ranks and merges.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from gbdoctor import causes
from gbdoctor.capture import (
    CaptureSession,
    Locator,
    RawCapture,
    collect_block_inputs,
    describe_error,
    eager_stance,
    error_traceback,
    fresh_inputs,
    innermost_user_location,
    reset_fsdp_state,
    run_block,
    strict_breaks,
)
from gbdoctor.capture.cudagraph_verdict import readiness
from gbdoctor.capture.locate import library_via, portable_path, portable_text, within
from gbdoctor.causes import known_issue, known_issue_note
from gbdoctor.errors import DEBUG_ENV, SetupError
from gbdoctor.frameworks import Framework, framework_for
from gbdoctor.records import (
    BlockReport,
    Break,
    Event,
    EventKind,
    RawBreak,
    Recompile,
    SetupInfo,
    Spec,
)
from gbdoctor.scan.dedupe import (
    Proof,
    group_blocks,
    kind_labels,
    prove_shared,
    rebase,
    retrace_shared,
    shortcut_repeated_blocks,
    unprovable,
)
from gbdoctor.scan.job import Progress, RankScan, ScanJob
from gbdoctor.scan.probe import RecompileProbe
from gbdoctor.scan.simulate import simulated_setup
from gbdoctor.setup.apply import Setup
from gbdoctor.setup.outputs import LossSource, loss_note, loss_source
from gbdoctor.setup.train import forward_loss, step_batch


def scan_rank_entry(job: ScanJob) -> RankScan:
    return scan_rank(job, None)


def build_and_setup(
    job: ScanJob, session: CaptureSession | None = None, fake_mode: Any = None
) -> tuple[Setup, Any]:
    """Build the model on this rank's device and apply the training setup.

    With ``fake_mode`` (simulated scans) the model is built and set up on meta, then becomes that
    mode's fake tensors (``simulate.simulated_setup``)."""
    spec = job.spec
    recipe = framework_for(spec)
    model, meshes = recipe.build(
        spec, job.device, meta=fake_mode is not None, max_seq_len=spec.training.seq_len
    )
    try:
        with (
            simulated_setup(model, fake_mode) if fake_mode is not None else contextlib.nullcontext()
        ):
            setup = recipe.set_up(
                model,
                spec,
                meshes,
                strategy=job.strategy,
                build_optimizer=True if fake_mode is not None else None,
                compile_fn=session.compile_fn if session else None,
                backend_for=session.recording_backend if session else None,
            )
    except (ValueError, AssertionError, RuntimeError) as exc:
        raise SetupError(
            f"could not apply the training setup: {exc}",
            hint="check the parallel degrees and the model's structure (`gbdoctor --debug ...` for details)",
        ) from exc
    return setup, meshes


def scan_rank(job: ScanJob, progress: Progress | None, fake_mode: Any = None) -> RankScan:
    """One rank's scan: per-block reports (same_as filled) and the setup description.

    ``fake_mode`` (simulated scans): build fake, and run the warm-up and captures under it."""
    session = CaptureSession()
    setup, meshes = build_and_setup(job, session, fake_mode)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        return _scan_set_up(job, session, setup, meshes, progress)


def _scan_set_up(
    job: ScanJob, session: CaptureSession, setup: Setup, meshes: Any, progress: Progress | None
) -> RankScan:
    spec = job.spec
    from gbdoctor.models import vocab_size

    vocab = vocab_size(setup.model)
    tokens, labels = step_batch(spec, meshes, vocab, 0)
    recipe = framework_for(spec)
    with recipe.step_context(setup):
        attempts = warm_up_attempts(recipe, setup, tokens, labels)
        # The model's output on the warm-up says where the loss came from (a note); the
        # captures drive blocks directly, so only the warm-up's forward reaches this hook.
        sources: list[LossSource] = []
        watch = (
            None
            if setup.own_loss  # the framework's own loss reads the output: nothing to say
            else setup.model.register_forward_hook(
                lambda module, args, output: sources.append(loss_source(output, labels, vocab))
            )
        )
        probe = None
        if job.probe_recompiles:

            def probe_batch(step: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
                return step_batch(spec, meshes, vocab, step, seq_len=seq_len)

            def probe_step(t: torch.Tensor, lab: torch.Tensor, notes: list[str]) -> None:
                run_warm_up(setup, warm_up_attempts(recipe, setup, t, lab), notes)

            probe = RecompileProbe(
                setup, spec.capture_seq_len, probe_batch, probe_step, root=spec.root or None
            )
        try:
            reports, notes = capture_set_up(
                session,
                setup,
                attempts,
                progress,
                dedupe=job.dedupe,
                strict=job.strict,
                root=job.spec.root or None,
                probe=probe,
            )
        finally:
            if watch is not None:
                watch.remove()
        if sources:
            notes += (loss_note(sources[0]),)
    # A framework that sets up with its own code says what it changed (CPU stand-ins).
    return reports, setup_info(spec, job, setup), notes + tuple(getattr(setup, "notes", ()))


WarmUp = list[tuple[str, Callable[[], None]]]
"""(name, step) pairs, strongest first: the first that runs is the warm-up."""


def capture_set_up(
    session: CaptureSession,
    setup: Any,
    attempts: WarmUp,
    progress: Progress | None,
    *,
    dedupe: bool = True,
    strict: bool = False,
    root: str | None = None,
    probe: RecompileProbe | None = None,
) -> tuple[tuple[BlockReport, ...], tuple[str, ...]]:
    """Warm up, then capture each distinct block kind of a model as set up, by any recipe
    (``model``, ``blocks`` with fqn/outer/kind/regions, ``hooks``, ``optimizer``). The caller
    enters the recipe's step context. ``probe``: after each kind's capture, run it again with
    changed inputs and record its recompiles (``probe.py``)."""
    outers = {slot.fqn: slot.outer for slot in setup.blocks}
    store, remove = collect_block_inputs(setup.model, outers)
    notes: list[str] = []
    # Only representatives are captured: repeated layers need not compute in the warm-up.
    restore = shortcut_repeated_blocks(setup) if dedupe else (lambda: None)
    try:
        run_warm_up(setup, attempts, notes)
    finally:
        restore()
        remove()
    session.locator = Locator(setup.model, setup.hooks)
    groups = group_blocks(setup, store) if dedupe else [[s.fqn] for s in setup.blocks]
    slots = {s.fqn: s for s in setup.blocks}
    reps: dict[str, BlockReport] = {}
    shares: list[tuple[str, list[str]]] = []
    """(representative, the layers proven to share its capture), in capture order."""
    proofs: dict[str, Proof] = {}
    for members in groups:
        pending = list(members)
        while pending:
            rep, pending = pending[0], pending[1:]
            if progress:
                progress(
                    f"capturing {rep} ({len(pending) + 1} candidate layer(s))",
                    len(reps),
                    len(reps) + 1,
                )
            proven: dict[str, Proof] = {}
            reps[rep] = capture_block(
                session,
                setup,
                slots[rep],
                store.get(rep),
                strict=strict,
                root=root,
                probe=probe,
                notes=notes,
                prove=_prover(session, setup, slots, store, rep, pending, proven)
                if pending
                else None,
            )
            why = _unprovable_reason(reps[rep])
            for fqn in pending:
                proofs[fqn] = proven.get(fqn) or unprovable(rep, why)
            if reps[rep].error is not None:
                # Nothing traced, nothing to prove with: the others share the error record
                # (capturing each would repeat the failure; --no-dedupe captures every layer).
                shares.append((rep, [rep, *pending]))
                break
            shares.append((rep, [rep, *(f for f in pending if proofs[f].shared)]))
            pending = [f for f in pending if not proofs[f].shared]
    if progress:
        progress("captured", len(reps), len(reps))
    # Kinds stay structural: layers of one structure that trace differently are captured apart
    # (``same_as``/``dedupe`` say so) but keep their structure's label, as plans and baselines
    # key their entries by it.
    labels = kind_labels(setup, groups)
    kinds = {fqn: labels[members[0]] for members in groups for fqn in members}
    reports = []
    for rep, members in shares:
        base = reps[rep]
        for fqn in members:
            same_as = None if fqn == rep else rep
            shared = rebase(base, rep, fqn) if same_as else base
            proof = proofs.get(fqn)
            reports.append(
                replace(
                    shared,
                    kind=kinds[rep],
                    same_as=same_as,
                    dedupe=proof.method if proof else None,
                    dedupe_detail=proof.detail if proof else "",
                )
            )
    reports.sort(key=lambda r: _layer_order(r.fqn))
    return tuple(reports), tuple(dict.fromkeys(notes))


_NO_CPU_KERNEL = "with arguments from the 'CPU' backend"
_BF16_FAILURE = re.compile(
    r"BFloat16|bfloat16|same dtype|expected scalar type|dtype mismatch", re.IGNORECASE
)


def warm_up_attempts(
    recipe: Framework, setup: Setup, tokens: torch.Tensor, labels: torch.Tensor
) -> WarmUp:
    """The recipe's training step, then forward-only fallbacks."""

    def full_step() -> None:
        recipe.train_step(setup, tokens, labels)

    from gbdoctor.setup.train import loss_context

    def forward_only() -> None:
        with loss_context(setup):
            forward_loss(setup.model, tokens, labels, 1)

    def forward_no_grad() -> None:
        with torch.no_grad(), loss_context(setup):
            forward_loss(setup.model, tokens, labels, 1)

    return [
        ("the eager training step", full_step),
        ("an eager forward", forward_only),
        ("an eager forward under no_grad", forward_no_grad),
    ]


def run_warm_up(setup: Any, attempts: WarmUp, notes: list[str]) -> None:
    """One eager training step: FSDP lazy init, the load-balancing hook, the blocks' real inputs.

    If the eager step fails (e.g. eager SAC around an FSDP-managed module fails in backward),
    that is a note, and the inputs come from the next, weaker attempt (a forward with autograd,
    else under no_grad); the per-block captures then show which blocks fail and why.
    """
    failures = []
    for name, attempt in attempts:
        try:
            with eager_stance():
                attempt()
        except Exception as exc:  # noqa: BLE001 - reported, then the next, weaker warm-up
            error = describe_error(exc)
            failures.append(f"{name} fails under this setup ({error}){known_issue_note(error)}")
            reset_fsdp_state(setup.model)
            if setup.optimizer is not None:
                setup.optimizer.zero_grad(set_to_none=True)
            continue
        if failures:
            notes.append("; ".join(failures) + f"; blocks were captured after {name}")
        return
    hint = "fix the model or the setup first (run `gbdoctor --debug ...` for the traceback)"
    issue = known_issue(failures[-1])
    if issue is not None:
        hint = f"a known upstream bug ({issue.link}); {issue.workaround}"
    if any(_NO_CPU_KERNEL in f for f in failures):
        # e.g. a flash/varlen attention op: only CUDA kernels are registered for it.
        hint = (
            "an op of this model has no CPU kernel (CUDA only): scan on a GPU machine, or "
            "choose a configuration with a CPU path (e.g. another attention backend)"
        )
    if any(_BF16_FAILURE.search(f) for f in failures):
        # FSDP's MixedPrecisionPolicy casts parameters to bfloat16 (torchtitan's default
        # mixed_precision_param); code that builds fp32 tensors next to them then fails.
        hint = (
            "the parameters run in bfloat16 under FSDP's mixed_precision_param; retry with "
            "--set training.mixed_precision_param=float32"
        )
    raise SetupError(f"the model does not run eagerly under this setup: {failures[-1]}", hint=hint)


def _prover(
    session: CaptureSession,
    setup: Setup,
    slots: dict[str, Any],
    store: dict[str, Any],
    rep: str,
    candidates: list[str],
    proven: dict[str, Proof],
) -> Callable[[RawCapture], None]:
    """Run inside ``rep``'s capture (Dynamo still holds its compiled code): prove each candidate
    on it (``dedupe.prove_shared``), filling ``proven``, until a re-trace leaves other code in
    Dynamo's caches."""

    def prove(capture: RawCapture) -> None:
        runs = {}
        for fqn in candidates:
            if store.get(fqn) is not None:

                def run(outer: Any = slots[fqn].outer, inputs: Any = store[fqn]) -> None:
                    args, kwargs = fresh_inputs(inputs)
                    run_block(outer, args, kwargs)

                runs[fqn] = run

        def on_failure() -> None:
            reset_fsdp_state(setup.model)

        def settle() -> None:
            if setup.optimizer is not None:
                setup.optimizer.zero_grad(set_to_none=True)

        # First every candidate on the unchanged code (compiles nothing), then, in layer order,
        # a re-trace of those whose guards failed, until one breaks differently: its code then
        # sits in Dynamo's caches, and the rest wait for the next representative.
        for fqn, run in runs.items():
            proven[fqn] = prove_shared(rep, run, on_failure)
            settle()
        for fqn, run in runs.items():
            if not proven[fqn].failed_guard:
                continue
            proven[fqn] = retrace_shared(
                rep, run, session, capture, on_failure, proven[fqn].failed_guard
            )
            settle()
            if proven[fqn].compiled_other_code:
                for later in list(runs)[list(runs).index(fqn) + 1 :]:
                    if not proven[later].shared:
                        del proven[later]
                return

    return prove


def _unprovable_reason(report: BlockReport) -> str:
    """Why a representative's capture cannot prove other layers (empty when it could)."""
    if report.error is not None:
        return "it could not be traced, so this layer shares its error record unproven"
    if any(e.kind == EventKind.FRAME_SKIPPED for e in report.events):
        return "Dynamo abandoned a frame of it, and skipped code has no guards to check"
    return "this layer was not called by the model's forward"


def _layer_order(fqn: str) -> tuple[int, str]:
    tail = fqn.rsplit(".", 1)[-1]
    return (int(tail), fqn) if tail.isdigit() else (1 << 30, fqn)


def setup_info(spec: Spec, job: ScanJob, setup: Setup) -> SetupInfo:
    flags = tuple(sorted((k, repr(v)) for k, v in setup.dynamo_flags))
    if setup.ac_enabled:
        flags = tuple(sorted(flags + (("lru_cache", "False"),)))
    ds = spec.deepspeed
    return SetupInfo(
        framework=spec.gbdoctor.framework,
        zero_stage=ds.zero_stage if ds else None,
        strategy=job.strategy.name,
        device=job.device,
        world_size=spec.parallelism.world_size,
        ep_degree=spec.parallelism.expert_parallel_degree,
        dp_shard=spec.parallelism.dp_shard,
        dp_replicate=spec.parallelism.data_parallel_replicate_degree,
        ac_mode=spec.activation_checkpoint.mode,
        ac_option=spec.activation_checkpoint.selective_ac_option,
        fsdp=setup.fsdp,
        tp_degree=spec.parallelism.tensor_parallel_degree,
        dynamo_config=flags,
        batch_size=spec.capture_batch_size,
        seq_len=spec.capture_seq_len,
        plan=job.strategy.plan,
        probed_recompiles=job.probe_recompiles,
    )


def capture_block(
    session: CaptureSession,
    setup: Setup,
    slot: Any,
    inputs: Any,
    *,
    strict: bool = False,
    root: str | None = None,
    probe: RecompileProbe | None = None,
    notes: list[str] | None = None,
    prove: Callable[[RawCapture], None] | None = None,
) -> BlockReport:
    """Capture one block (forward + backward) and turn what Dynamo did into records.

    ``prove``: run after the capture, with Dynamo's caches still holding the block's compiled
    code, unless the block did not trace or Dynamo abandoned a frame of it (dedupe's proof).

    ``strict``: when every compiled region of the block is fullgraph, run it under
    ``error_on_graph_break(True)`` (``fullgraph=True`` alone silently allows data-dependent
    capture), so any break becomes an error of the block.
    """
    if inputs is None:
        return BlockReport(
            fqn=slot.fqn,
            kind=slot.kind,
            error="the block was not called by the model's forward",
            regions=slot.regions,
            fullgraph_regions=slot.fullgraph_regions,
        )
    args, kwargs = fresh_inputs(inputs)
    strict = strict and bool(slot.regions) and set(slot.regions) == set(slot.fullgraph_regions)
    session.root = slot.fqn
    with session.capture() as raw:
        try:
            if strict:
                with strict_breaks():
                    run_block(slot.outer, args, kwargs)
            else:
                run_block(slot.outer, args, kwargs)
        except Exception as exc:  # a block that cannot be traced is data, not a crash
            raw.error = portable_text(describe_error(exc, root), root)
            raw.error_traceback = error_traceback(exc)
            if os.environ.get(DEBUG_ENV) == "1":  # --debug: the report keeps one line, stderr all
                print(f"{slot.fqn} does not trace:\n{raw.error_traceback}", file=sys.stderr)
            reset_fsdp_state(setup.model)
        if setup.optimizer is not None:
            setup.optimizer.zero_grad(set_to_none=True)
        recompiles: tuple[Recompile, ...] = ()
        if probe is not None and raw.error is None:
            # Same Dynamo state as the capture: which guards fail when the inputs change.
            with session.paused():
                recompiles = probe.run(slot, notes if notes is not None else [])
        if prove is not None and raw.error is None and not raw.frame_skips:
            with session.paused():
                prove(raw)
    if setup.optimizer is not None:
        setup.optimizer.zero_grad(set_to_none=True)
    return replace(block_report(slot, raw, root=root), recompiles=recompiles)


def _in_ac(slot: Any, module: str) -> bool:
    """Whether ``module`` sits in one of the block's AC-wrapped regions."""
    for sub in slot.ac_wrapped:
        region = slot.fqn if sub == "" else f"{slot.fqn}.{sub}"
        if within(module, region):
            return True
    return False


def _ac_region(slot: Any, module: str) -> str:
    """FQN of the AC region a module sits in (the block, or the wrapped child)."""
    for sub in slot.ac_wrapped:
        region = slot.fqn if sub == "" else f"{slot.fqn}.{sub}"
        if module == region or module.startswith(region + ".") or sub == "":
            return region
    return module or slot.fqn


def _rerooted(finding: Any, root: str | None) -> Any:
    loc = finding.location
    if loc is None or not os.path.exists(loc.file):
        return finding
    return replace(
        finding, location=replace(loc, file=portable_path(os.path.abspath(loc.file), root))
    )


def block_report(slot: Any, raw: RawCapture, *, root: str | None = None) -> BlockReport:
    """Records of one capture; locations relative to ``root`` (the spec's ``Spec.root``)."""
    merged: dict[tuple[Any, ...], Break] = {}
    events: dict[tuple[Any, ...], Event] = {}
    for rb, region in raw.breaks:
        location = innermost_user_location(rb.frames, root, component=rb.component)
        brk = Break(
            cause=causes.classify(rb),
            gb_type=rb.gb_type,
            gb_id=causes.gb_id_for(rb.gb_type),
            location=location,
            module=rb.module or region or slot.fqn,
            in_checkpoint=rb.in_checkpoint,
            component=rb.component,
            region=region,
            explanation=portable_text(rb.explanation, root),
            hints=tuple(portable_text(h, root) for h in rb.hints),
            context=portable_text(rb.context, root),
            via=library_via(rb.frames, root, component=rb.component),
        )
        key = (brk.cause, brk.gb_type, str(brk.location), brk.module, brk.in_checkpoint)
        merged[key] = replace(merged[key], count=merged[key].count + 1) if key in merged else brk
        if rb.in_checkpoint:
            ac_region = _ac_region(slot, brk.module)
            events[("region_eager", ac_region)] = Event(
                kind="region_eager",
                module=ac_region,
                gb_type=rb.gb_type,
                location=location,
                detail="a break inside the activation-checkpoint region sent the whole region to eager",
            )
    for rb, region in raw.frame_skips:
        location = innermost_user_location(rb.frames, root)
        module = rb.module or region or slot.fqn
        events[("frame_skipped", module, str(location))] = Event(
            kind="frame_skipped",
            module=module,
            gb_type=rb.gb_type,
            location=location,
            detail=portable_text(rb.context, root)
            or "Dynamo skipped the whole frame and ran it eagerly",
        )
    seen_types = {b.gb_type for b in merged.values()}
    for gb_type, n in sorted(raw.counter_types.items()):
        if gb_type not in seen_types:
            # Only counters saw it (no stack): keep it, never drop a break.
            rb = RawBreak(gb_type=gb_type, message=gb_type, component="torch")
            merged[(gb_type,)] = Break(
                cause=causes.classify(rb),
                gb_type=gb_type,
                gb_id=causes.gb_id_for(gb_type),
                location=None,
                module=slot.fqn,
                in_checkpoint=False,
                component="torch",
                region=slot.fqn,
                count=n,
            )
    for region in sorted(raw.entered):
        # With the checkpoint side-effect flag (the default strategy's) or scalar capture, a
        # break inside a checkpoint region need not carry the HOP in its record; the region
        # still produced no graph and ran eagerly, which is what region_eager reports.
        inside = sorted((b for b in merged.values() if b.region == region), key=break_order)
        checkpointed = [b for b in inside if _in_ac(slot, b.module)]
        ran = raw.graphs.get(region) or region in raw.ran_compiled
        if ran or raw.error is not None or not checkpointed:
            continue
        ac_region = _ac_region(slot, checkpointed[0].module)
        if ("region_eager", ac_region) not in events:
            events[("region_eager", ac_region)] = Event(
                kind="region_eager",
                module=ac_region,
                gb_type=checkpointed[0].gb_type,
                location=checkpointed[0].location,
                detail="a break inside the activation-checkpoint region left it with no graph: "
                "the whole region ran eagerly",
            )
    for region in sorted(raw.entered):
        if (
            not raw.graphs.get(region)
            and region not in raw.ran_compiled
            and not any(e.module.startswith(region) for e in events.values())
            and not any(b.region == region for b in merged.values())
            and raw.error is None
        ):
            events[("frame_skipped", region, "")] = Event(
                kind="frame_skipped",
                module=region,
                detail="the compiled region ran without producing a graph",
            )
    graphs = [n for ops in raw.graphs.values() for n in ops]
    breaks = tuple(sorted(merged.values(), key=break_order))
    # Readiness findings are located while the backend runs, relative to the working directory;
    # re-root them at the spec's root like every other location (CWD-independent reports).
    findings = [_rerooted(f, root) for f in raw.cudagraph_findings]
    ordered = tuple(sorted(events.values(), key=event_order))
    eager = [e for e in ordered if e.kind in (EventKind.REGION_EAGER, EventKind.FRAME_SKIPPED)]
    ready = readiness(findings, raw.aten_graphs, eager) if slot.regions else None
    return BlockReport(
        fqn=slot.fqn,
        kind=slot.kind,
        graph_count=len(graphs),
        op_count=sum(graphs),
        breaks=breaks,
        events=ordered,
        error=raw.error,
        regions=slot.regions,
        fullgraph_regions=slot.fullgraph_regions,
        region_ops=tuple(sorted((r, sum(ops)) for r, ops in raw.graphs.items())),
        cudagraphs=ready,
    )


def break_order(b: Break) -> tuple[Any, ...]:
    loc = b.location
    return (b.module, loc.file if loc else "", loc.line if loc else 0, b.gb_type, b.cause)


def event_order(e: Event) -> tuple[Any, ...]:
    loc = e.location
    return (e.kind, e.module, loc.file if loc else "", loc.line if loc else 0, e.gb_type)
