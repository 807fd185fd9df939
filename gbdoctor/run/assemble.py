"""A ``run``'s report from its rounds' raw measurements: each mode's result with ratios against
eager and the best baseline, notes (same regions as another mode, noisy steps), findings
(recompiles, divergence, failures), the plan's verdict; and the report read back from JSON."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from gbdoctor.records import (
    LOSS_RTOL,
    READABLE_RUN_SCHEMA_VERSIONS,
    RUN_SCHEMA_VERSION,
    ModeResult,
    ModeStatus,
    RunContext,
    RunReport,
    RunSettings,
    Spec,
    Verdict,
)
from gbdoctor.records.io import check_schema_version, load_record, parse_json_object
from gbdoctor.run.modes import BASELINES
from gbdoctor.run.stats import divergence, mode_from_rounds, ratio_with_spread
from gbdoctor.run.worker import RankRun
from gbdoctor.setup.compile import Strategy

NOISY_SPREAD = 2.0
"""A mode whose slowest measured step took more than this many times its fastest gets a note."""

Raw = tuple[str, Strategy, list[list[RankRun]] | None, tuple[str, str] | None, str]
"""(mode, strategy, per round the per-rank runs or None when it failed, (error, kind) when it
failed, the note of the known-bug workaround it ran under or "")."""


def build_report(
    spec: Spec,
    raw: list[Raw],
    settings: RunSettings,
    context: RunContext,
    *,
    baselines: tuple[str, ...] = BASELINES,
) -> RunReport:
    """Per-rank measurements -> records, with ratios and their spreads, loss checks, duplicates
    and findings. ``spec``: as trained (``run.settings.prepare_training``); ``settings``: as
    trained, its ``shape_note`` the report's (the driver adds the CPU dtype note); ``context``:
    the torch, machine, FLOPs and plan the report states; ``baselines``: the framework's modes
    that compete for best baseline, in its order (ties go to the first; the default framework's
    unless given).

    The steps: each mode's record from its rounds (:func:`_mode_results`), the best baseline,
    each mode compared with eager and that baseline (:func:`_compare_modes`), the report's own
    notes (:func:`_report_notes`)."""
    world = spec.parallelism.world_size
    tokens_per_step = spec.capture_batch_size * spec.capture_seq_len * world
    plan_verified = context.plan_verified
    results, layouts = _mode_results(raw, tokens_per_step, settings.warmup, plan_verified)
    ok = {m: r for m, r in results.items() if r.status == ModeStatus.OK and r.step_time_median_s}
    eager, best = ok.get("eager"), _best_baseline(ok, baselines)
    throughput = _Throughput(context.flops_per_token, context.peak_tflops, world)
    final, findings = _compare_modes(
        results, layouts, eager, None if best is None else ok[best], throughput, plan_verified
    )
    by_mode = {m.mode: m for m in final}
    ac = spec.activation_checkpoint
    return RunReport(
        spec=spec.key,
        model=f"{spec.model.name}/{spec.model.flavor}",
        torch_version=context.torch_version,
        device=settings.device,
        backend=settings.backend,
        world_size=world,
        batch_size=spec.capture_batch_size,
        seq_len=spec.capture_seq_len,
        warmup=settings.warmup,
        steps=settings.steps,
        seed=spec.training.seed,
        tokens_per_step=tokens_per_step,
        ac_mode=ac.mode,
        ac_option=ac.selective_ac_option,
        modes=tuple(final),
        rounds=settings.rounds,
        shape_note=settings.shape_note,
        optimizer=context.optimizer,
        device_name=context.device_name,
        flops_per_token=context.flops_per_token,
        peak_tflops=context.peak_tflops,
        plan_source=context.plan_source,
        plan_verified=plan_verified,
        plan_kinds=context.plan_kinds,
        plan_verdict=_plan_verdict(by_mode.get("plan"), best, by_mode),
        best_baseline=best,
        findings=tuple(findings),
        notes=_report_notes(settings, len(results), eager, best, throughput, context),
    )


@dataclass(frozen=True)
class _Throughput:
    """What turns a mode's tokens/s into TFLOP/s and MFU."""

    flops_per_token: int | None
    peak_tflops: float | None
    """The device's dense bf16 peak (None: not known, or a CPU)."""
    world: int


def _mode_results(
    raw: list[Raw], tokens_per_step: int, warmup: int, plan_verified: bool | None
) -> tuple[dict[str, ModeResult], dict[str, Any]]:
    """(mode -> its record from its rounds, mode -> the regions it compiled): a failed or
    unavailable mode's record says why; the plan's says whether it verified."""
    results: dict[str, ModeResult] = {}
    layouts: dict[str, Any] = {}
    for mode, strategy, runs, failure, workaround in raw:
        if runs is None:
            error, kind = failure or ("unknown failure", "crash")
            results[mode] = ModeResult(
                mode=mode,
                strategy=strategy.name,
                status=ModeStatus.UNAVAILABLE
                if kind == ModeStatus.UNAVAILABLE
                else ModeStatus.FAILED,
                error=error,
                error_kind=kind,
            )
        else:
            results[mode] = mode_from_rounds(mode, strategy, runs, tokens_per_step, warmup)
            layouts[mode] = _relative_layout(runs[0][0].layout)
        if mode == "plan":
            results[mode] = replace(results[mode], plan_verified=plan_verified)
        if workaround:
            results[mode] = replace(results[mode], workaround=workaround)
    return results, layouts


def _best_baseline(ok: dict[str, ModeResult], baselines: tuple[str, ...]) -> str | None:
    """The fastest baseline that ran (ties: the first in the framework's order)."""
    ran = {m: r for m, r in ok.items() if m in baselines}
    return min(ran, key=lambda m: (ran[m].step_time_median_s, baselines.index(m))) if ran else None


def _compare_modes(
    results: dict[str, ModeResult],
    layouts: dict[str, Any],
    eager: ModeResult | None,
    best: ModeResult | None,
    throughput: _Throughput,
    plan_verified: bool | None,
) -> tuple[list[ModeResult], list[str]]:
    """(every mode with its ratios, loss check, duplicate and notes, the findings in mode
    order): ``best`` is the best baseline's record."""
    final: list[ModeResult] = []
    findings: list[str] = []
    for mode, res in results.items():
        notes = list(res.notes)
        updates: dict[str, Any] = {}
        if res.status == ModeStatus.OK:
            updates = _comparisons(res, eager, best, throughput)
            same = _earlier_same_layout(mode, layouts)
            if same is not None:
                updates["same_regions_as"] = same
                notes.append(_same_layout_note(res, results[same]))
            notes += _noisy_note(res)
            findings += _findings_of(
                mode, res, eager, updates["diverged"], updates["loss_rel_diff"]
            )
        elif res.status != ModeStatus.UNAVAILABLE:
            # An unavailable mode is not a finding: nothing failed (its ``error`` says why).
            findings.append(f"{mode} failed ({res.error_kind}): {res.error}")
        if mode == "plan" and plan_verified is False:
            notes.append(
                "the plan did NOT verify (some block kind still breaks under the strict scan); "
                "it ran anyway, as the planner emitted it"
            )
        final.append(replace(res, notes=tuple(notes), **updates))
    return final, findings


def _comparisons(
    res: ModeResult, eager: ModeResult | None, best: ModeResult | None, throughput: _Throughput
) -> dict[str, Any]:
    """A mode's ratios (vs eager, vs the best baseline, with spreads and verdicts), its
    TFLOP/s and MFU, and its loss check against eager, as the record's new field values."""
    updates: dict[str, Any] = {}
    median = res.step_time_median_s
    if eager is not None and median:
        ratio, spread, verdict = ratio_with_spread(eager, res)
        updates.update(
            speedup_vs_eager=ratio, speedup_vs_eager_range=spread, verdict_vs_eager=verdict
        )
    if best is not None and median:
        ratio, spread, verdict = ratio_with_spread(best, res)
        updates.update(
            speedup_vs_best_baseline=ratio,
            speedup_vs_best_baseline_range=spread,
            verdict_vs_best_baseline=verdict,
        )
    flops = throughput.flops_per_token
    if flops and res.tokens_per_s:
        from gbdoctor.run.flops import mfu

        updates["tflops_per_s"] = res.tokens_per_s * flops / 1e12
        updates["mfu"] = mfu(res.tokens_per_s, flops, throughput.peak_tflops, throughput.world)
    diverged, rel = divergence(res, eager)
    updates.update(diverged=diverged, loss_rel_diff=rel)
    return updates


def _noisy_note(res: ModeResult) -> list[str]:
    """The note of a mode whose measured steps vary more than :data:`NOISY_SPREAD` (or none)."""
    fastest, slowest = res.step_time_min_s, res.step_time_max_s
    if not (fastest and slowest and slowest / fastest > NOISY_SPREAD):
        return []
    if res.graphs_measured:
        return [
            f"measured step times vary {slowest / fastest:.1f}x (recompiles in the measured steps)"
        ]
    return [
        f"measured step times vary {slowest / fastest:.1f}x ({fastest:.3g}-{slowest:.3g} s) "
        "with no recompile in between: the machine is probably busy; compare modes with care"
    ]


def _findings_of(
    mode: str, res: ModeResult, eager: ModeResult | None, diverged: bool, rel: float | None
) -> list[str]:
    """What a mode that ran found: recompiles in the measured steps, the recompile limit,
    skipped or re-recorded CUDA graphs, losses that diverge from eager."""
    findings: list[str] = []
    if res.recompiles:
        first = next(e for e in res.recompile_events if e.measured and not e.limit_hit)
        findings.append(
            f"{mode}: {res.recompiles} recompile(s) during the measured steps "
            f"(first: {first.reason}" + (f" at {first.location}" if first.location else "") + ")"
        )
    if res.recompile_limit_hit:
        findings.append(f"{mode}: Dynamo hit recompile_limit; some frames ran eagerly afterwards")
    if res.cudagraph_skips:
        findings.append(
            f"{mode}: inductor skipped cudagraphs {len(res.cudagraph_skips)} time(s) "
            f"(first: {res.cudagraph_skips[0]})"
        )
    if res.cudagraph_rerecords:
        findings.append(
            f"{mode}: inductor re-recorded cudagraphs {len(res.cudagraph_rerecords)} "
            f"time(s) ({_most_common(res.cudagraph_rerecords)})"
        )
    if diverged:
        findings.append(f"{mode}: losses diverge from eager ({_divergence_text(res, eager, rel)})")
    return findings


def _report_notes(
    settings: RunSettings,
    modes: int,
    eager: ModeResult | None,
    best: str | None,
    throughput: _Throughput,
    context: RunContext,
) -> tuple[str, ...]:
    """The report's own notes: what is unavailable and why, a single round, CPU memory and
    MFU, a busy machine, several ranks."""
    notes: list[str] = []
    world, load = throughput.world, context.load
    if eager is None:
        notes.append("no successful eager run: speedups vs eager and loss checks are unavailable")
    if best is None:
        notes.append("no successful baseline mode: speedups vs the best baseline are unavailable")
    if settings.rounds < 2 and modes > 1:
        notes.append(
            "a single round: ratios have no spread, so no difference is called a speedup "
            "(use --rounds 2 or more)"
        )
    if settings.device == "cpu":
        notes.append(
            "peak memory on CPU is the rank process's peak RSS (torch and compilation included)"
        )
        notes.append(
            "MFU needs a device peak; CPU peaks are not tabulated, so only achieved TFLOP/s is shown"
        )
    elif throughput.flops_per_token and throughput.peak_tflops is None:
        notes.append(f"no dense bf16 peak known for {context.device_name!r}: MFU not computed")
    if load is not None and load[0] > load[1] + world:
        notes.append(
            f"the machine was busy: 1-minute load average up to {load[0]:.1f} on {load[1]} cores "
            f"(this run's own ranks add at most {world}); timings include contention from other "
            "processes"
        )
    if world > 1:
        notes.append(
            f"step times are the slowest of {world} ranks per step; losses are global (all-reduced)"
        )
    return tuple(notes)


def _fmt_ratio(ratio: float | None, spread: tuple[float, float] | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" + (f" [{spread[0]:.2f}-{spread[1]:.2f}]" if spread else "")


def _plan_verdict(plan: ModeResult | None, best: str | None, by_mode: dict[str, ModeResult]) -> str:
    """The plan against the best baseline, in one sentence that never calls noise a speedup."""
    if plan is None:
        return ""
    if plan.status != ModeStatus.OK:
        return f"the plan failed ({plan.error_kind}): {plan.error}"
    if best is None:
        return "no baseline ran successfully: nothing to compare the plan with"
    if plan.same_regions_as == best and plan.dynamo_config == by_mode[best].dynamo_config:
        return f"the plan compiles exactly what {best} compiles, with the same Dynamo settings: it is that baseline"
    ratio = _fmt_ratio(plan.speedup_vs_best_baseline, plan.speedup_vs_best_baseline_range)
    verdict = plan.verdict_vs_best_baseline
    if verdict == Verdict.FASTER:
        return f"the plan is faster than the best baseline ({best}): {ratio}, every round above 1"
    if verdict == Verdict.SLOWER:
        return f"the plan is slower than the best baseline ({best}): {ratio}, every round below 1"
    if verdict == Verdict.WITHIN_NOISE:
        return f"the plan and the best baseline ({best}) are within noise: {ratio}; the spread contains 1, no speedup"
    return f"the plan vs the best baseline ({best}): {ratio} from a single round, no spread: no speedup claimed"


def _relative_layout(layout: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    regions = tuple(sorted(r for _, regions, _ in layout for r in regions))
    fullgraph = tuple(sorted(r for _, _, fg in layout for r in fg))
    return (fullgraph, regions)


def _earlier_same_layout(mode: str, layouts: dict[str, Any]) -> str | None:
    """The first earlier mode that compiled exactly the regions ``mode`` compiled (None for eager)."""
    if not layouts[mode][1]:
        return None
    for other, layout in layouts.items():
        if other == mode:
            return None
        if layout == layouts[mode]:
            return other
    return None


def _same_layout_note(res: ModeResult, same: ModeResult) -> str:
    diff = _flag_diff(res.dynamo_config, same.dynamo_config)
    text = f"compiles the same regions as {same.mode}"
    text += (
        f"; only the Dynamo settings differ ({diff})" if diff else " with the same Dynamo settings"
    )
    if res.graphs == same.graphs and res.graph_breaks == same.graph_breaks:
        return (
            text
            + f", and both compiled {res.graphs} graph(s): the gap between the two is run-to-run noise"
        )
    return text + f", which changed the graphs ({same.graphs} vs {res.graphs})"


def _flag_diff(a: tuple[tuple[str, str], ...], b: tuple[tuple[str, str], ...]) -> str:
    da, db = dict(a), dict(b)
    keys = sorted(set(da) | set(db))
    return ", ".join(
        f"{k}: {db.get(k, 'default')} -> {da.get(k, 'default')}"
        for k in keys
        if da.get(k) != db.get(k)
    )


def _divergence_text(res: ModeResult, eager: ModeResult | None, rel: float | None) -> str:
    if rel is None:
        return "a loss is not finite"
    assert eager is not None
    return (
        f"step 0 loss {res.losses[0]:.5g} vs eager {eager.losses[0]:.5g}, "
        f"relative difference {rel:.2g} > {LOSS_RTOL:g}"
    )


def report_from_json(text: str) -> RunReport:
    """Rebuild a :class:`RunReport` from ``render_run(report, "json")`` output (BaselineError
    on malformed input)."""
    data = parse_json_object(text, "run report")
    check_schema_version(
        data,
        READABLE_RUN_SCHEMA_VERSIONS,
        "run report",
        "run",
        hint="re-run with this gbdoctor version",
    )
    # Version 1 lacks what version 2 added (with defaults): read as the current version.
    return load_record(RunReport, data | {"schema_version": RUN_SCHEMA_VERSION}, "run report")


def _most_common(rerecords: tuple[str, ...]) -> str:
    """``N x function: reason`` of the most frequent re-recording."""
    why, n = Counter(rerecords).most_common(1)[0]
    return f"most: {n} x {why}"
