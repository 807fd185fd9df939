"""One rank of a scan: build the model and its training setup, capture every block kind, classify.

Per rank: build -> set up (EP, AC, compile with recording backends, FSDP, optimizer) -> one
eager training step (FSDP lazy init, load-balancing hook, and the real arguments every block
receives) -> per distinct block kind, a fresh Dynamo capture of forward + backward through the
block's real wrappers -> records. ``scan.environment`` runs this on one or N ranks and merges.
The warm-up is ``scan.warm_up``'s; turning a capture into records, ``scan.block_report``'s.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from gbdoctor.capture import (
    CaptureSession,
    Locator,
    RawCapture,
    collect_block_inputs,
    describe_error,
    error_traceback,
    fresh_inputs,
    rank_local_fsdp,
    reset_fsdp_state,
    run_block,
    strict_breaks,
)
from gbdoctor.capture.locate import portable_text
from gbdoctor.causes import NO_FRAMEWORK_HOOKS, FrameworkHooks
from gbdoctor.errors import DEBUG_ENV, SetupError
from gbdoctor.frameworks.registry import hooks_of, zero_stage_of
from gbdoctor.records import BlockReport, EventKind, Recompile, SetupInfo, Spec
from gbdoctor.scan.block_report import block_report, layer_order
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
from gbdoctor.scan.warm_up import WarmUp, run_warm_up, warm_up_attempts
from gbdoctor.setup.ac import rng_stand_in_notes
from gbdoctor.setup.apply import Setup
from gbdoctor.setup.collectives import rank_local_collectives
from gbdoctor.setup.compile import shown_flags
from gbdoctor.setup.context_parallel import attention_dispatch, context_parallel_notes
from gbdoctor.setup.outputs import LossSource, loss_note, loss_source
from gbdoctor.setup.pipeline import pipeline_notes
from gbdoctor.setup.rank_main import report_stage
from gbdoctor.setup.train import step_batch


def scan_rank_entry(job: ScanJob) -> RankScan:
    """A spawned rank's scan; its stages go to the parent's progress (rank 0's)."""
    from gbdoctor.setup.rank_protocol import rank_progress

    return scan_rank(job, rank_progress())


def build_and_setup(
    job: ScanJob, session: CaptureSession | None = None, fake_mode: Any = None
) -> tuple[Setup, Any]:
    """Build the model on this rank's device and apply the training setup.

    With ``fake_mode`` (simulated scans) the model is built and set up on meta, then becomes that
    mode's fake tensors (``simulate.simulated_setup``)."""
    spec, recipe = job.spec, job.framework
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
    if progress:
        progress("setup: building the model and applying the training setup", 0, 1)
    setup, meshes = build_and_setup(job, session, fake_mode)
    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        return _scan_set_up(job, session, setup, meshes, progress)


def _scan_set_up(
    job: ScanJob, session: CaptureSession, setup: Setup, meshes: Any, progress: Progress | None
) -> RankScan:
    spec = job.spec
    from gbdoctor.models import vocab_size

    own_pipeline = setup.own_pipeline
    if own_pipeline:  # its schedule needs every PP rank in step (interface.OwnPipeline)
        job = replace(job, probe_recompiles=False)

    vocab = vocab_size(setup.model)
    tokens, labels = step_batch(spec, meshes, vocab, 0)
    recipe = job.framework
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

            def probe_batch(
                step: int, seq_len: int, batch: int | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
                return step_batch(spec, meshes, vocab, step, seq_len=seq_len, local_batch=batch)

            def probe_step(t: torch.Tensor, lab: torch.Tensor, notes: list[str]) -> None:
                run_warm_up(setup, warm_up_attempts(recipe, setup, t, lab), notes)

            probe = RecompileProbe(
                setup,
                spec.capture_seq_len,
                probe_batch,
                probe_step,
                root=spec.root or None,
                shapes=job.probe_shapes,
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
                hooks=hooks_of(recipe),
            )
        finally:
            if watch is not None:
                watch.remove()
        if sources:
            notes += (loss_note(sources[0]),)
    # A framework that sets up with its own code says what it changed (CPU stand-ins).
    layout = getattr(setup, "pipeline", None)
    if layout is not None and not own_pipeline:  # a framework's own pipeline has its own note
        notes += pipeline_notes(layout)
    notes += context_parallel_notes(setup, spec.capture_seq_len)
    notes += rng_stand_in_notes(setup.model)
    return reports, setup_info(spec, job, setup), notes + tuple(getattr(setup, "notes", ()))


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
    hooks: FrameworkHooks = NO_FRAMEWORK_HOOKS,
) -> tuple[tuple[BlockReport, ...], tuple[str, ...]]:
    """Warm up, then capture each distinct block kind of a model as set up, by any recipe
    (``model``, ``blocks`` with fqn/outer/kind/regions, ``hooks``, ``optimizer``). The caller
    enters the recipe's step context. ``probe``: after each kind's capture, run it again with
    changed inputs and record its recompiles (``probe.py``)."""
    outers = {slot.fqn: slot.outer for slot in setup.blocks}
    store, remove = collect_block_inputs(setup.model, outers)
    notes: list[str] = []
    # Only representatives are captured: repeated layers need not compute in the warm-up. Not
    # under a framework's own pipeline schedule: a shortcut output would be shared by its
    # microbatches, whose backwards then run through one graph twice.
    shortcut = dedupe and not setup.own_pipeline
    restore = shortcut_repeated_blocks(setup) if shortcut else (lambda: None)
    if progress:
        progress("warm-up: one eager training step", 0, 1)
    try:
        report_stage("the warm-up step")
        run_warm_up(setup, attempts, notes)
    finally:
        restore()
        remove()
    session.locator = Locator(setup.model, setup.hooks)
    # From here each rank works on its own, and ranks that compile differently do different
    # work (re-traces, failed proofs, more representatives, so more recompile probe steps): FSDP's
    # collectives and gbdoctor's own (the probe steps' loss) are answered on the rank.
    # Under CP the blocks' recorded inputs are already sequence shards: captures run under the
    # attention half of the step's CP context.
    with rank_local_fsdp(setup.model), rank_local_collectives(), attention_dispatch(setup):
        reports = _capture_kinds(
            session, setup, store, progress, notes, dedupe, strict, root, probe, hooks
        )
    return reports, tuple(dict.fromkeys(notes))


def _capture_kinds(
    session: CaptureSession,
    setup: Any,
    store: dict[str, Any],
    progress: Progress | None,
    notes: list[str],
    dedupe: bool,
    strict: bool,
    root: str | None,
    probe: RecompileProbe | None,
    hooks: FrameworkHooks,
) -> tuple[BlockReport, ...]:
    """``capture_set_up`` after the warm-up: each distinct kind captured, the rest proven."""
    groups = group_blocks(setup, store) if dedupe else [[s.fqn] for s in setup.blocks]
    slots = {s.fqn: s for s in setup.blocks}
    reps: dict[str, BlockReport] = {}
    shares: list[tuple[str, list[str]]] = []
    """(representative, the layers proven to share its capture), in capture order."""
    proofs: dict[str, Proof] = {}
    for number, members in enumerate(groups, 1):
        pending = list(members)
        while pending:
            rep, pending = pending[0], pending[1:]

            def stage(what: str, rep: str = rep, number: int = number) -> None:
                if progress:
                    progress(
                        f"kind {number} of {len(groups)} ({rep}): {what}", number - 1, len(groups)
                    )

            report_stage(f"capturing {rep}")
            stage(f"capture ({len(pending) + 1} candidate layer(s))")
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
                stage=stage,
                hooks=hooks,
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
                    stage=getattr(slots[fqn], "stage", None),
                    same_as=same_as,
                    dedupe=proof.method if proof else None,
                    dedupe_detail=proof.detail if proof else "",
                )
            )
    reports.sort(key=lambda r: layer_order(r.fqn))
    return tuple(reports)


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


def setup_info(spec: Spec, job: ScanJob, setup: Setup) -> SetupInfo:
    flags = shown_flags(setup.dynamo_flags)
    if setup.ac_enabled:
        flags = tuple(sorted(flags + (("lru_cache", "False"),)))
    return SetupInfo(
        framework=spec.gbdoctor.framework,
        zero_stage=zero_stage_of(job.framework, spec),
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
        **pipeline_info(getattr(setup, "pipeline", None)),
    )


def pipeline_info(layout: Any) -> dict[str, Any]:
    """The setup fields that describe pipeline parallelism (none without it)."""
    if layout is None:
        return {}
    return dict(
        pp_degree=layout.degree,
        pp_schedule=layout.schedule,
        pp_stages=len(layout.stages),
        pp_microbatches=layout.microbatches,
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
    stage: Callable[[str], None] = lambda what: None,
    hooks: FrameworkHooks = NO_FRAMEWORK_HOOKS,
) -> BlockReport:
    """Capture one block (forward + backward) and turn what Dynamo did into records.

    ``prove``: run after the capture, with Dynamo's caches still holding the block's compiled
    code, unless the block did not trace or Dynamo abandoned a frame of it (dedupe's proof).

    ``strict``: when every compiled region of the block is fullgraph, run it under
    ``error_on_graph_break(True)`` (``fullgraph=True`` alone silently allows data-dependent
    capture), so any break becomes an error of the block.

    ``stage``: told each step after the capture (recompile probe, dedupe proof, readiness).
    """
    if inputs is None:
        return BlockReport(
            fqn=slot.fqn,
            kind=slot.kind,
            error="the block was not called by the model's forward",
            regions=slot.regions,
            fullgraph_regions=slot.fullgraph_regions,
            stage=getattr(slot, "stage", None),
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
            stage(
                f"recompile probe ({len(probe.shapes)} stream shapes)"
                if probe.shapes
                else "recompile probe (2 steps with changed inputs)"
            )
            with session.probe():
                report_stage(f"probing recompiles of {slot.fqn}")
                recompiles = probe.run(slot, notes if notes is not None else [])
        if prove is not None and raw.error is None and not raw.frame_skips:
            stage("proving the other layers share this capture")
            with session.paused():
                prove(raw)
    if setup.optimizer is not None:
        setup.optimizer.zero_grad(set_to_none=True)
    stage("records and CUDA-graph readiness")
    return replace(block_report(slot, raw, root=root, hooks=hooks), recompiles=recompiles)
