"""The pipeline schedule, run for real: what only pipeline parallelism does to compiled blocks.

A PP scan captures every block kind in one model (``scan.rank``); this runs what training runs
on top of it, on the scan's own gloo ranks: each rank builds the model, keeps its stages
(``setup.pipeline.split_stage``), wraps AC with its own layer counter and compiles every block
in place (``module.compile``, as the reference trainer does: torch's zero-bubble schedules refuse stage
modules holding a ``torch.compile`` wrapper), then torch's schedule named by the config
(``torch.distributed.pipelining``) trains a few steps: the first stage fed tokens, the others the
hidden states the schedule sends them, the loss on the last stage, AdamW after each step.

Steps: 0 and 1 at the config's microbatch shape (a recompile in step 1 is a steady-state one),
2 at a second microbatch shape (another sequence length, as the recompile probe uses), which
gives every block a second cache entry. What comes back, per block: the compiles after its
first (``Recompile`` records, the reason from Dynamo's recompile log); and, per schedule, a
crash of a training step (``pipeline_crash`` events) with the workaround that was then tried for
real. The crashes are the issue's: the zero-bubble split backward (dI then dW, which keeps the
autograd graph) against AOTAutograd's donated buffers (pytorch#161904), and AC with a second
cache entry of a compiled block when Dynamo's LRU cache picks the newest entry for the
recompute (pytorch#166926; the reference trainer turns the LRU cache off under AC, as gbdoctor
does).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from gbdoctor.errors import SetupError
from gbdoctor.records import Event, EventKind, Recompile, ScanReport, Spec

SHAPES = ("first", "first", "second", "first")
"""The microbatch shape of each schedule step: steps 0 and 1 the config's (a recompile in step
1 is a steady-state one), 2 a second shape (another sequence length, as the recompile probe
uses), 3 the first again, now with two cache entries per block (with Dynamo's LRU cache on:
where pytorch#166926 crashes, if the installed torch still does)."""
STEADY_STEP = 1
SECOND_SHAPE_STEP = 2
LRU_STEP = 3


class CrashKind(StrEnum):
    """Which PP-only crash a schedule step met (what the workaround is chosen by)."""

    ZERO_BUBBLE = "zero-bubble-backward"
    """The split backward (dI keeps the graph for dW) against AOTAutograd's donated buffers."""
    SECOND_SHAPE = "second-microbatch-shape"
    """Another microbatch shape through the same schedule: its stages keep the first step's
    buffer shapes, so the last stage's loss meets outputs of the old shape."""
    AC_CACHE = "ac-second-cache-entry"
    """AC with a second cache entry of a compiled block, Dynamo's LRU cache on."""
    OTHER = "other"


WHEN = {
    CrashKind.ZERO_BUBBLE: "every training step",
    CrashKind.SECOND_SHAPE: "when training feeds a second microbatch shape (evaluation at "
    "another sequence length, variable-length batches)",
    CrashKind.AC_CACHE: "once an AC-wrapped compiled block has a second cache entry",
}
"""Crash kind -> when training meets it (the schedule run provokes each on purpose)."""

WORKAROUNDS = {
    CrashKind.ZERO_BUBBLE: (
        "torch._functorch.config.donated_buffer = False",
        "pytorch#161904 (open: no torch release fixes it yet)",
    ),
    CrashKind.SECOND_SHAPE: (
        "a new schedule (new PipelineStage objects) for each microbatch shape",
        "torch's stages infer their shapes once; no fix known to gbdoctor",
    ),
    CrashKind.AC_CACHE: (
        "torch._C._dynamo.eval_frame._set_lru_cache(False) under AC (the reference trainer's #1991, #2204; "
        "gbdoctor's setup applies it)",
        "pytorch#166926 (open: no torch release fixes it yet; the workaround needs torch >= "
        "2.10, pytorch#167038)",
    ),
}
"""Crash kind -> (workaround, the issue and the torch release that fixes it)."""


class ScheduleCrash(SetupError):
    """A schedule step raised on a rank (the parent records it; its peers are stopped)."""


@dataclass(frozen=True)
class ScheduleTrial:
    """One run of the schedule on every rank, with the workarounds found needed so far."""

    spec: Spec
    donated_buffer: bool = True
    """AOTAutograd's default; False is the zero-bubble workaround."""
    new_schedule_per_shape: bool = False
    """The second-shape workaround: a new schedule for the second microbatch shape."""
    lru_step: bool = True
    """Run step 3 with Dynamo's LRU cache on (where AC is on: does pytorch#166926 crash?)."""


@dataclass(frozen=True)
class ScheduleFindings:
    """What the schedule run adds to a scan."""

    recompiles: dict[str, tuple[Recompile, ...]]
    """Block FQN -> its compiles after the first."""
    events: tuple[Event, ...] = ()
    """``pipeline_crash`` events, each on every block (the schedule could not train as set up)."""
    notes: tuple[str, ...] = ()
    losses: tuple[float, ...] = ()
    """The last stage's loss of each step (the microbatches' sum of their scaled losses)."""


def runnable(spec: Spec) -> str | None:
    """Why the schedule cannot run for this spec (None: it can)."""
    p = spec.parallelism
    if p.world_size != p.pipeline_parallel_degree:
        return (
            "the schedule runs on pure PP ranks only (world = PP degree); this spec also shards "
            f"data or tensors (world {p.world_size}, PP {p.pipeline_parallel_degree})"
        )
    if p.pipeline_parallel_schedule_csv:
        return "a CSV schedule needs torch's private runtime schedule; named schedules only"
    return None


def schedule_rank(trial: ScheduleTrial) -> dict[str, Any]:
    """One rank's run of ``trial`` (a spawned rank's target): its compiles and losses."""
    import torch

    from gbdoctor.capture import watch_recompiles
    from gbdoctor.capture.locate import portable_path
    from gbdoctor.capture.settings import set_lru_cache
    from gbdoctor.capture.stage_compiles import StageCompiles, donated_buffers
    from gbdoctor.models import block_container, build_model, vocab_size
    from gbdoctor.models.structure import find_blocks
    from gbdoctor.setup import ac as ac_mod
    from gbdoctor.setup.mesh import build_meshes
    from gbdoctor.setup.optim import build_adamw
    from gbdoctor.setup.pipeline import build_schedule, pipeline_layout, split_stage
    from gbdoctor.setup.train import synthetic_batch

    spec = trial.spec
    torch.manual_seed(spec.training.seed)
    model = build_model(spec.model, max_seq_len=spec.training.seq_len).train()
    vocab = vocab_size(model)
    layout = pipeline_layout(
        spec.parallelism, len(block_container(model)), spec.training.local_batch_size
    )
    meshes = build_meshes(spec.parallelism, "cpu")
    mine = layout.stages_of_rank(meshes.pp_rank)
    chunks = [(stage, split_stage(model, stage)) for stage in mine]
    del model
    # AC with this rank's own counter (its stages' blocks in stage order), then compile in place.
    blocks = [(fqn, b) for _, chunk in chunks for fqn, b in block_container(chunk)]
    wrapped = ac_mod.apply_ac(blocks, spec.activation_checkpoint)
    ac_on = any(subs for _, subs in wrapped.values())
    compiles = StageCompiles(
        owners={id(p): fqn for fqn, b in blocks for p in b.parameters()},
    )
    backend = compiles.backend()
    for _, chunk in chunks:
        container = find_blocks(chunk, spec.gbdoctor.blocks or None)
        for fqn, key, _ in container.items():
            outer = wrapped[fqn][0]
            outer.compile(backend=backend)
            container.set(key, outer)
    n = layout.microbatches

    def loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # torchtitan's cross entropy, scaled for accumulation over the microbatches.
        flat = pred.flatten(0, 1).float()
        return torch.nn.functional.cross_entropy(flat, labels.flatten(0, 1)) / n

    loss_fn = (
        torch.compile(loss, backend=compiles.backend("loss"))
        if "loss" in spec.compile.components
        else loss
    )
    assert meshes.pp is not None  # runnable(): PP > 1, so the mesh has its PP dimension
    group = meshes.pp.get_group()
    schedules = {"first": build_schedule(layout, chunks, group, loss_fn)}
    schedules["second"] = (
        build_schedule(layout, chunks, group, loss_fn)
        if trial.new_schedule_per_shape
        else schedules["first"]
    )
    optimizer = build_adamw(
        [p for _, c in chunks for p in c.parameters()], lr=8e-4, device_type="cpu"
    )
    first = any(stage.index == 0 for stage in mine)
    last = any(stage.index == len(layout.stages) - 1 for stage in mine)
    from gbdoctor.scan.probe import probe_seq_len

    seq = spec.capture_seq_len
    steps = SHAPES if trial.lru_step and ac_on else SHAPES[:LRU_STEP]
    losses: list[float] = []
    # torch logs the whole schedule at ERROR level when an action raises: the crash is
    # recorded as a finding, so keep its dump off the user's stderr.
    torch_log = logging.getLogger("torch.distributed.pipelining.schedules")
    level = torch_log.level
    torch_log.setLevel(logging.CRITICAL)
    try:
        with watch_recompiles(portable_path) as watch, donated_buffers(trial.donated_buffer):
            compiles.log_size = lambda: len(watch.records)
            for step, shape in enumerate(steps):
                # the reference trainer's setting under AC: the LRU cache off; on in the LRU step.
                set_lru_cache(not ac_on or step == LRU_STEP)
                compiles.step = step
                watch.tag(step=step, measured=step == STEADY_STEP)
                tokens, labels = synthetic_batch(
                    seed=spec.training.seed,
                    step=step,
                    vocab=vocab,
                    local_batch=layout.microbatch_size * n,
                    seq_len=probe_seq_len(seq, 1) if shape == "second" else seq,
                    rank=0,  # PP ranks share their data
                    world_size=1,
                    device="cpu",
                )
                step_losses: list[torch.Tensor] = []
                kwargs = dict(target=labels, losses=step_losses) if last else {}
                try:
                    schedules[shape].step(*((tokens,) if first else ()), **kwargs)
                except Exception as exc:  # the finding: recorded by the parent
                    raise ScheduleCrash(
                        f"{layout.schedule} step {step} ({shape} microbatch shape"
                        f"{', LRU cache on' if step == LRU_STEP else ''}) crashed on PP rank "
                        f"{meshes.pp_rank}: {_root_cause(exc)}"
                    ) from None
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(float(sum(x.detach() for x in step_losses)) if last else 0.0)
            records = list(watch.records)
    finally:
        set_lru_cache(True)
        torch_log.setLevel(level)
    return dict(
        rank=meshes.pp_rank,
        stages=[stage.index for stage in mine],
        compiles=[(c.owner, c.step, c.shapes, c.logged) for c in compiles.compiles],
        records=records,
        losses=losses,
        ac=ac_on,
        last=last,
    )


def _root_cause(exc: BaseException) -> str:
    """The innermost error's first line (the schedule wraps the real one in its own message),
    with what Dynamo says went wrong when the error is Dynamo's (its ``got ...``)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    got = next((line.split(": got ", 1)[1] for line in lines if ": got " in line), None)
    return f"{text} ({got[:300]})" if got else text


def block_recompiles(result: dict[str, Any]) -> dict[str, tuple[Recompile, ...]]:
    """Per block: every compile after its first, as a Recompile with Dynamo's reason."""
    records: list[Recompile] = result["records"]
    seen: set[str] = set()
    out: dict[str, list[Recompile]] = {}
    previous = 0
    for owner, step, shapes, logged in result["compiles"]:
        reason = records[logged - 1] if logged > previous else None
        previous = logged
        if owner not in seen:
            seen.add(owner)
            continue
        shape = ", ".join("x".join(map(str, s)) for s in shapes)
        out.setdefault(owner, []).append(
            Recompile(
                step=step,
                measured=step == STEADY_STEP,
                function=reason.function if reason else "forward",
                reason=reason.reason if reason else f"new inputs {shape}",
                location=reason.location if reason else None,
                # Beside the recompile probe's records of the same block: say where it came from.
                hint=f"pipeline schedule step {step} ({SHAPES[step]} microbatch shape)"
                + (f"; {reason.hint}" if reason and reason.hint else ""),
                failed_entries=reason.failed_entries if reason else 1,
            )
        )
    return {k: tuple(v) for k, v in out.items()}


_STEP = re.compile(r"step (\d+) \(")


def crash_kind(crash: ScheduleCrash) -> CrashKind:
    """Which PP-only crash this is, from the step it happened in and its root cause."""
    found = _STEP.search(crash.message)
    step = int(found.group(1)) if found else -1
    if "donated buffer" in crash.message:
        return CrashKind.ZERO_BUBBLE
    if step == SECOND_SHAPE_STEP:
        return CrashKind.SECOND_SHAPE
    if step == LRU_STEP:
        return CrashKind.AC_CACHE
    return CrashKind.OTHER


def run_schedule(spec: Spec) -> ScheduleFindings:
    """Run the schedule on the spec's ranks; after each PP-only crash, again with its
    workaround, so each workaround is verified for real (one spawn of the ranks per try)."""
    from gbdoctor.setup.dist import run_ranks

    def attempt(trial: ScheduleTrial) -> list[dict[str, Any]] | ScheduleCrash:
        try:
            return run_ranks(
                schedule_rank,
                trial,
                world_size=spec.parallelism.world_size,
                device_type="cpu",
                timeout_s=spec.gbdoctor.timeout_s,
            )
        except ScheduleCrash as crash:
            return crash

    fixes: dict[CrashKind, dict[str, bool]] = {
        CrashKind.ZERO_BUBBLE: dict(donated_buffer=False),
        CrashKind.SECOND_SHAPE: dict(new_schedule_per_shape=True),
        CrashKind.AC_CACHE: dict(lru_step=False),
    }
    trial = ScheduleTrial(spec)
    crashes: list[tuple[ScheduleCrash, CrashKind]] = []
    result = attempt(trial)
    while isinstance(result, ScheduleCrash):
        kind = crash_kind(result)
        crashes.append((result, kind))
        if kind not in fixes or any(k == kind for _, k in crashes[:-1]):
            break  # no workaround, or the workaround did not help
        trial = replace(trial, **fixes[kind])  # type: ignore[arg-type]  # bool fields only
        result = attempt(trial)
    ranks = None if isinstance(result, ScheduleCrash) else result
    trained = ranks is not None
    events = []
    for i, (crash, kind) in enumerate(crashes):
        fix, issue = WORKAROUNDS.get(kind, ("none known to gbdoctor", "no issue known"))
        later = crashes[i + 1 :]
        verified = (
            " (verified: with it the schedule got past this step)"
            if kind in fixes and (trained or later)
            else ""
        )
        events.append(
            Event(
                kind=EventKind.PIPELINE_CRASH,
                module="",
                detail=f"{kind}: {WHEN.get(kind, 'in the schedule run')}: {crash.message}; "
                f"workaround: {fix}{verified}; {issue}",
            )
        )
    if ranks is None:
        return ScheduleFindings({}, tuple(events), ())
    recompiles: dict[str, tuple[Recompile, ...]] = {}
    for rank in ranks:
        recompiles.update(block_recompiles(rank))
    last = next(r for r in ranks if r["last"])
    name = spec.parallelism.pipeline_parallel_schedule
    notes = [
        f"pipeline schedule: {name} trained {len(last['losses'])} steps for real on "
        f"{len(ranks)} gloo ranks, {_microbatches(spec)} microbatches of "
        f"{spec.parallelism.pipeline_parallel_microbatch_size} per step (step 2 at a second "
        "sequence length), every block compiled in place (aot_eager); the last stage's loss "
        + ", ".join(f"{x:.4f}" for x in last["losses"])
    ]
    if ranks[0]["ac"] and trial.lru_step:
        notes.append(
            "pipeline schedule: AC + a second cache entry (step 3, back at the first shape "
            "after step 2's) trained with Dynamo's LRU cache on too: pytorch#166926 does not "
            "reproduce here; gbdoctor keeps the workaround (LRU cache off under AC)"
        )
    return ScheduleFindings(recompiles, tuple(events), tuple(notes), tuple(last["losses"]))


def _microbatches(spec: Spec) -> int:
    return spec.training.local_batch_size // spec.parallelism.pipeline_parallel_microbatch_size


def with_schedule(report: ScanReport, found: ScheduleFindings) -> ScanReport:
    """``report`` with the schedule's recompiles and crash events on its blocks, and notes."""
    blocks = tuple(
        replace(
            block,
            recompiles=block.recompiles + found.recompiles.get(block.fqn, ()),
            events=block.events + tuple(replace(e, module=block.fqn) for e in found.events),
        )
        for block in report.blocks
    )
    return replace(report, blocks=blocks, notes=report.notes + found.notes)
