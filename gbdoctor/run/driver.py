"""``run``: train for real under several compile configurations and compare them.

``gbdoctor run SPEC`` first makes the plan (``plan.propose_plan``: the same planner and
verification as ``gbdoctor plan``) unless ``--plan FILE`` gives one or ``--no-plan`` skips it, then
trains every mode (eager, the torchtitan baselines, whole-block fullgraph, the plan) in FRESH
spawned rank processes (``run_ranks``, even for world size 1): clean Dynamo state, a process whose
peak memory belongs to that mode alone. Every mode builds the model from the same seed and trains
on the same synthetic batches, so losses are comparable step by step.

Noise is measured, not assumed away: the whole set of modes runs ``rounds`` times, in alternating
order (ABC, CBA, ABC, ...; ``rounds.train_rounds``, the loop ``price`` uses too), so slow drifts
of the machine hit every mode alike. Each round gives
each mode's median step time; a ratio between two modes is reported with the (min, max) of its
per-round values, and only a range entirely above 1 is called faster.

Per rank, mode and round (``worker``): build -> ``apply_setup`` with the mode's strategy ->
``warmup`` training steps (compilation happens here) -> ``steps`` measured training steps, each
timed on its own (after a barrier on multi-rank jobs, with CUDA synchronizes on GPU) and split
into forward, backward and optimizer. Recompiles are recorded with ``capture.recompiles.watch_recompiles``.

Which modes, defaults and shape: ``modes``; per-mode statistics and ratios: ``stats``; the
report from the rounds' measurements: ``assemble``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gbdoctor.capture import torch_version
from gbdoctor.errors import SpecError
from gbdoctor.frameworks.interface import Framework
from gbdoctor.frameworks.registry import framework_for, meta_model
from gbdoctor.records import CompileMode, RunContext, RunReport, RunSettings, Spec
from gbdoctor.run.assemble import build_report
from gbdoctor.run.measure import (
    device_peak,
    load_average,
    workaround_note,
)
from gbdoctor.run.modes import MODES_NEEDING_PLAN, framework_modes, resolve_modes
from gbdoctor.run.rounds import train_rounds
from gbdoctor.run.settings import prepare_training
from gbdoctor.scan.job import Progress
from gbdoctor.setup.compile import STRATEGIES, Strategy

_NOT_MADE = Strategy(
    name="plan (not made)",
    dense=STRATEGIES["none"].dense,
    moe=STRATEGIES["none"].moe,
    summary="no plan was made: the mode that needed it could not run on this device",
)


def run_modes(
    spec: Spec,
    settings: RunSettings,
    *,
    modes: list[str] | None = None,
    plan_path: str | None = None,
    make_plan: bool = True,
    progress: Progress | None = None,
    on_plan: Callable[[Any], None] | None = None,
    extra_modes: Mapping[str, Strategy] | None = None,
    framework: Framework | None = None,
) -> RunReport:
    """Make the plan, then train ``spec`` under each mode in fresh processes and compare.

    ``settings``: device, backend, warm-up, steps, rounds and shape (``run.settings.run_settings``:
    the CLI builds it once; 2 or more rounds give every ratio a spread).
    ``modes``: None runs every mode (``plan`` unless ``make_plan`` is False and no ``plan_path``).
    ``plan_path``: a saved plan JSON (``gbdoctor plan --emit-config json``) instead of making one.
    ``on_plan``: called with the :class:`~gbdoctor.plan.Plan` once it is made or loaded.
    ``extra_modes``: more modes by name, run after the chosen ones (``run --price`` adds the
    strategy the prices were measured against). ``framework``: the spec's, where the command
    resolved it; None: resolved here, once for the plan, the ranks and the report.
    A mode that fails (compile error, crash, timeout) is a failed record; the others still run.
    Bad input (unknown mode, bad plan, a model factory that fails) raises SpecError
    (BaselineError for an unreadable plan file).
    """
    if plan_path and not make_plan:
        raise SpecError("--plan FILE conflicts with --no-plan", hint="drop one of them")
    if framework is None:
        framework = framework_for(spec)
    mode_strategies, all_modes, baselines = framework_modes(framework)
    chosen = resolve_modes(modes, plan=make_plan or bool(plan_path), all_modes=all_modes)
    device = settings.device
    # The model on meta, built once for the memory check, the plan's decision (its capture
    # shape and memory) and the FLOPs: the three shapes differ, the model does not.
    model = meta_model(framework, spec)
    # Where a scan would simulate, exit 2 with the estimate and a --set that shrinks the spec.
    run_spec, dtype_note = prepare_training(spec, settings, framework, model=model)
    shape_note = f"{settings.shape_note}; {dtype_note}" if dtype_note else settings.shape_note
    table = framework.strategies
    strategies: dict[str, Any] = {
        m: table[mode_strategies[m]] for m in chosen if m not in MODES_NEEDING_PLAN
    }
    strategies.update(extra_modes or {})
    chosen += [m for m in extra_modes or {} if m not in chosen]
    # The plan's provenance for the report: none unless a plan is made or read below.
    plan_source: str | None = None
    plan_verified: bool | None = None
    plan_kinds: tuple[str, ...] = ()
    cudagraph_layers: tuple[str, ...] = ()
    # cudagraphs alone off CUDA does not run, so no plan is made for it (a --plan file is read).
    if "plan" in chosen or ("cudagraphs" in chosen and (device == "cuda" or plan_path)):
        plan, identity = _get_plan(spec, framework, model, plan_path, progress)
        if on_plan is not None:
            on_plan(plan)
        from gbdoctor.plan import plan_strategy

        # A plan file is applied strictly (its identity is checked against the model); a plan
        # made here is this model's by construction.
        for m in MODES_NEEDING_PLAN:
            if m in chosen:
                strategies[m] = plan_strategy(plan, spec, identity=identity)
        cudagraph_layers = tuple(fqn for k in plan.kinds if k.cudagraph_ready for fqn in k.layers)
        # The file's name and digest, as a scan names the plan it applied: never its local path.
        plan_source = identity or "made by this run (gbdoctor plan, verified by re-scanning)"
        plan_verified, plan_kinds = plan.verified, _plan_lines(plan)
    elif "cudagraphs" in chosen:
        strategies["cudagraphs"] = _NOT_MADE

    measured = train_rounds(
        run_spec,
        framework,
        {m: strategies[m] for m in chosen},
        settings,
        progress=progress,
        cudagraph_layers=cudagraph_layers,
        unavailable=_unavailable(chosen, device, cudagraph_layers),
    )
    raw = [
        (
            m,
            strategies[m],
            None if m in measured.failures else measured.runs[m],
            measured.failures.get(m),
            workaround_note(measured.workarounds[m]) if m in measured.workarounds else "",
        )
        for m in chosen
    ]
    loads = measured.loads
    flops = _flops(model, settings.seq_len)
    device_name, peak = device_peak(device)
    from gbdoctor.setup.optim import adamw_implementation

    context = RunContext(
        torch_version=torch_version(),
        optimizer=f"AdamW ({adamw_implementation(device)})",
        device_name=device_name,
        peak_tflops=peak,
        load=(max(loads, default=load_average()), os.cpu_count() or 1),
        flops_per_token=flops,
        plan_source=plan_source,
        plan_verified=plan_verified,
        plan_kinds=plan_kinds,
    )
    # The report states the shape as trained: the settings' note with the CPU dtype note.
    as_trained = replace(settings, shape_note=shape_note)
    return build_report(run_spec, raw, as_trained, context, baselines=baselines)


def _get_plan(
    spec: Spec, framework: Framework, model: Any, plan_path: str | None, progress: Progress | None
) -> tuple[Any, str | None]:
    """(plan, identity): the ``--plan`` file (read and checked), or a plan made and verified now
    (its scans decided once, from ``model``, the spec's on meta)."""
    from gbdoctor.plan import propose_plan, read_plan
    from gbdoctor.scan import scan_decision

    if plan_path:
        return read_plan(plan_path)
    say = (lambda msg, done, total: progress(f"plan: {msg}", done, total)) if progress else None
    decision = scan_decision(spec, framework, model=model)
    return propose_plan(spec, progress=say, framework=framework, decision=decision), None


def _plan_lines(plan: Any) -> tuple[str, ...]:
    lines = []
    for k in plan.kinds:
        what = "block fullgraph" if k.mode == CompileMode.BLOCK else "children fullgraph"
        if k.eager:
            what += f", eager {k.eager_summary()}"
        if k.split_ac:
            what += ", AC per child"
        lines.append(f"{k.kind}: {what}" + ("" if k.verified else f" (NOT verified: {k.detail})"))
    if plan.flags:
        lines.append("Dynamo flags: " + ", ".join(f"{name}={value}" for name, value in plan.flags))
    return tuple(lines)


def _unavailable(chosen: list[str], device: str, layers: tuple[str, ...]) -> dict[str, str]:
    """``cudagraphs`` off CUDA, or with no block kind the plan calls CUDA-graph ready (it would
    train the plan again under another name), is recorded as unavailable without running."""
    if "cudagraphs" not in chosen:
        return {}
    if device != "cuda":
        return {
            "cudagraphs": f"CUDA graphs need a CUDA device; this run is on {device}, so the mode "
            "did not run (the static prediction is in the plan and in `gbdoctor scan`)"
        }
    if not layers:
        return {
            "cudagraphs": "no block kind of the plan is CUDA-graph ready, so there is nothing to "
            "compile with mode=reduce-overhead (`gbdoctor causes --cudagraphs` says why)"
        }
    return {}


def _flops(model: Any, seq_len: int) -> int | None:
    """FLOPs per token of ``model`` (built on meta) at ``seq_len``: the count reads parameter
    shapes and the attention's length, not the model's RoPE table, so the model built at the
    spec's training length counts any run length."""
    from gbdoctor.run.flops import count_flops_per_token

    try:
        return count_flops_per_token(model, seq_len).flops_per_token
    except Exception:  # noqa: BLE001 - a model the count cannot read: no FLOPs, no MFU
        return None
