"""``price``: what each distinct graph break costs a training step, measured.

Method (docs/price.md):

1. Scan the spec (the breaks to price) and make or read the plan (the fix of each block kind).
2. Train, with ``gbdoctor run``'s own loop (``run.rounds``), the mode ``as set up`` (the scan's
   strategy: the breaks as training meets them) and, per block kind with breaks, ``fix KIND``:
   the same setup with only that kind changed to the plan's verified recipe, or left eager where
   the plan has no verified fix. Where more than one kind is priced, also ``plan`` (every fix at
   once): the kinds' prices should add up to its gain, and the report shows both. Every mode
   runs ``rounds`` times in alternating order; modes share inductor's own compile cache, as
   training does, so a kind that a mode does not change is compiled once for all of them, and a
   second price of the same spec (or a price after training it) reuses the compiled kernels.
3. A kind's price is the median over rounds of step(as set up) - step(fix KIND), with the
   min-max of the per-round differences; a spread that contains 0 is ``free``. The step already
   holds every layer of the kind, so no multiplication by the layer count is needed.
4. The kind's price is split over its distinct breaks by the eager time each break's frame
   spent in one profiled step of ``as set up`` (``capture.profile``): Dynamo's break log names
   the frame each break ended, the profiler's regions give the time run outside compiled graphs
   in that frame, and the autograd nodes that eager work made give its backward. A kind with
   one distinct break gets the whole price.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, replace
from typing import Any

from gbdoctor.errors import SetupError, SpecError
from gbdoctor.frameworks.interface import CaptureStyle, CompileStrategy, Framework
from gbdoctor.frameworks.registry import framework_for
from gbdoctor.records import (
    BlockKind,
    Break,
    BreakPrice,
    Clock,
    CompileMode,
    Counterfactual,
    KindPrice,
    Plan,
    PriceReport,
    PriceSplit,
    RunSettings,
    ScanReport,
    Spec,
)
from gbdoctor.run.measure import (
    device_name,
    load_average,
    per_step_max,
)
from gbdoctor.run.rounds import CompileCache, KnownBugHit, train_rounds
from gbdoctor.run.settings import prepare_training
from gbdoctor.run.worker import RankRun
from gbdoctor.scan.job import Progress
from gbdoctor.setup.compile import BlockRecipe, Strategy
from gbdoctor.summary import group_by_kind

AS_SET_UP = "as set up"
WHOLE_PLAN = "plan"


@dataclass(frozen=True)
class _Mode:
    name: str
    strategy: Strategy
    kind: str | None = None
    """The kind this mode fixes (None: as set up, or the whole plan)."""
    counterfactual: Counterfactual | None = None
    recipe: str = ""


def price_scan(
    spec: Spec,
    report: ScanReport,
    plan: Plan,
    settings: RunSettings,
    *,
    progress: Progress | None = None,
    framework: Framework | None = None,
) -> ScanReport:
    """``report`` (a scan of ``spec``) with ``price`` filled in: see the module doc.
    ``settings``: device, backend, rounds, steps, shape and clock (``run.settings.run_settings``,
    built once by the command). ``framework``: the spec's, where the command resolved it;
    None: resolved here."""
    if framework is None:
        framework = framework_for(spec)
    if framework.capture_style != CaptureStyle.PER_BLOCK:
        raise SpecError(
            f"price needs per-block capture; {framework.title} scans capture whole engine steps",
            hint="price a per-block spec; `gbdoctor run` compares this framework's compile modes",
        )
    device, clock = settings.device, settings.clock
    run_spec, dtype_note = prepare_training(spec, settings, framework, real=False)
    as_set_up, relaxed = breaks_tolerated(framework.strategies[report.setup.strategy])
    modes = _modes(report, plan, as_set_up)
    notes = [dtype_note] if dtype_note else []
    if relaxed:
        notes.append(
            f"strategy {report.setup.strategy} compiles with fullgraph=True, where a break is an "
            "error: priced as set up with fullgraph=False, the breaks running as Dynamo splits them"
        )
    if len(modes) == 1:
        notes.append("no block kind has a graph break: nothing to price")
        return replace(report, price=_empty(report, settings, notes))
    try:
        measured = train_rounds(
            run_spec,
            framework,
            {m.name: m.strategy for m in modes},
            settings,
            progress=progress,
            cache=CompileCache.INDUCTOR,
            profile_mode=AS_SET_UP,
            retry_known_bugs=False,
            reuse_ranks=True,
        )
    except KnownBugHit as hit:
        # `run` measures baselines under the workaround; a price cannot: the workaround
        # changes the setup (its block kinds, their breaks), so the scan's breaks would not be
        # the ones measured.
        raise SetupError(
            f"the setup as scanned does not train: it hits a known upstream bug ({hit.issue.link})",
            hint="price the setup users run until the fix: "
            + " ".join(f"--set {o}" for o in hit.issue.overrides),
        ) from None
    runs, loads = measured.runs, measured.loads
    cores = os.cpu_count() or 1
    if clock == Clock.WALL and device == "cpu" and max(loads, default=0.0) > cores:
        notes.append(
            f"the machine was busy (load average up to {max(loads):.1f} on {cores} cores): "
            "wall-clock prices move with the other processes; --clock cpu measures the ranks' "
            "own work instead (docs/price.md, Clocks)"
        )
    failures = {mode: error for mode, (error, _) in measured.failures.items()}
    if AS_SET_UP in failures:
        raise SetupError(
            f"the setup as scanned does not train: {failures[AS_SET_UP]}",
            hint="price needs the as-set-up step time; fix the failure (`gbdoctor run` shows it too)",
        )
    base = [_median_step(r, clock) for r in runs[AS_SET_UP]]
    step_ms = statistics.median(base)
    kinds, breaks = _kind_prices(report, modes, runs, failures, base, step_ms, clock)
    plan_ms, plan_spread = None, None
    if WHOLE_PLAN in runs and WHOLE_PLAN not in failures:
        plan_ms, plan_spread = _difference(base, [_median_step(r, clock) for r in runs[WHOLE_PLAN]])
    elif WHOLE_PLAN in failures:
        notes.append(f"the whole plan did not train: {failures[WHOLE_PLAN]}")
    return replace(
        report,
        price=_price_record(
            settings,
            notes,
            step_ms=round(step_ms, 3),
            step_spread_ms=(round(min(base), 3), round(max(base), 3)),
            kinds=kinds,
            breaks=breaks,
            plan_ms=plan_ms,
            plan_spread_ms=plan_spread,
            load=(round(max(loads, default=load_average()), 2), cores),
        ),
    )


def breaks_tolerated(strategy: CompileStrategy) -> tuple[Strategy, bool]:
    """``strategy`` with fullgraph off everywhere (a break must split the graph, not fail the
    step), and whether anything changed. SpecError (exit 2) for a strategy that is not made of
    ``setup.compile``'s block recipes (a framework set up by its own code)."""
    if not isinstance(strategy, Strategy):
        raise SpecError(
            f"price relaxes block recipes; strategy {strategy.name!r} is not made of them",
            hint="price a spec whose framework compiles with setup/'s block recipes",
        )

    def relax(recipe: BlockRecipe) -> BlockRecipe:
        return replace(recipe, fullgraph=False)

    relaxed = replace(
        strategy,
        dense=relax(strategy.dense),
        moe=relax(strategy.moe),
        per_kind=tuple((label, relax(r)) for label, r in strategy.per_kind),
    )
    return relaxed, relaxed != strategy


def _modes(report: ScanReport, plan: Plan, as_set_up: Strategy) -> list[_Mode]:
    """``as set up``, one ``fix KIND`` per kind with breaks, and ``plan`` when there are two or
    more such kinds."""
    modes = [_Mode(AS_SET_UP, as_set_up)]
    by_kind = {k.kind: k for k in plan.kinds}
    fixed: list[tuple[str, BlockRecipe]] = []
    for kind, blocks in group_by_kind(report).items():
        if not any(b.breaks for b in blocks):
            continue
        label = BlockKind.parse(kind).label
        kp = by_kind.get(kind)
        if kp is not None and kp.verified and kp.breaks_after < kp.breaks_before:
            recipe = BlockRecipe(
                mode=kp.mode,
                fullgraph=kp.fullgraph,
                eager=kp.eager,
                compiled_forward=kp.compiled_forward,
                split_ac=kp.split_ac,
            )
            how, words = Counterfactual.PLAN_FIX, _recipe_words(recipe)
        else:
            recipe, how, words = BlockRecipe(mode=CompileMode.NONE), Counterfactual.EAGER, "eager"
        fixed.append((label, recipe))
        strategy = replace(
            as_set_up,
            name=f"fix {kind}",
            per_kind=(*as_set_up.per_kind, (label, recipe)),
            flags=_merged_flags(as_set_up.flags, plan.flags),
        )
        modes.append(_Mode(f"fix {kind}", strategy, kind, how, words))
    if len(fixed) > 1:
        whole = replace(
            as_set_up,
            name=WHOLE_PLAN,
            per_kind=(*as_set_up.per_kind, *fixed),
            flags=_merged_flags(as_set_up.flags, plan.flags),
        )
        modes.append(_Mode(WHOLE_PLAN, whole))
    return modes


def _merged_flags(
    base: tuple[tuple[str, Any], ...], extra: tuple[tuple[str, Any], ...]
) -> tuple[tuple[str, Any], ...]:
    merged = dict(base) | dict(extra)
    return tuple(sorted(merged.items()))


def _recipe_words(recipe: BlockRecipe) -> str:
    words = "block fullgraph" if recipe.mode == CompileMode.BLOCK else "children fullgraph"
    if recipe.eager:
        words += ", eager " + ", ".join(recipe.eager)
    if recipe.split_ac:
        words += ", AC per child"
    return words


STEP_TIMES = {Clock.WALL: "step_times", Clock.CPU: "step_cpu_times"}
"""The ``RankRun`` field each clock reads."""


def _median_step(ranks: list[RankRun], clock: Clock) -> float:
    """The round's median step time in ms on ``clock`` (slowest rank per step)."""
    return statistics.median(per_step_max(ranks, STEP_TIMES[clock])) * 1e3


def _difference(base: list[float], other: list[float]) -> tuple[float, tuple[float, float]]:
    """Median and (min, max) over rounds of base - other, in ms (rounds paired in order)."""
    diffs = [a - b for a, b in zip(base, other, strict=False)]
    return round(statistics.median(diffs), 3), (round(min(diffs), 3), round(max(diffs), 3))


def _kind_prices(
    report: ScanReport,
    modes: list[_Mode],
    runs: dict[str, list[list[RankRun]]],
    failures: dict[str, str],
    base: list[float],
    step_ms: float,
    clock: Clock,
) -> tuple[tuple[KindPrice, ...], tuple[BreakPrice, ...]]:
    groups = group_by_kind(report)
    frames, eager_us = _profile(runs[AS_SET_UP][0])
    kinds: list[KindPrice] = []
    breaks: list[BreakPrice] = []
    for mode in modes:
        if mode.kind is None or mode.counterfactual is None:
            continue
        blocks = groups[mode.kind]
        if mode.name in failures:
            price = KindPrice(
                kind=mode.kind,
                layers=len(blocks),
                counterfactual=mode.counterfactual,
                recipe=mode.recipe,
                ms_per_step=None,
                detail=f"the counterfactual did not train: {failures[mode.name]}",
            )
        else:
            ms, spread = _difference(base, [_median_step(r, clock) for r in runs[mode.name]])
            price = KindPrice(
                kind=mode.kind,
                layers=len(blocks),
                counterfactual=mode.counterfactual,
                recipe=mode.recipe,
                ms_per_step=ms,
                spread_ms=spread,
                share=round(ms / step_ms, 4),
                free=spread[0] <= 0 <= spread[1],
            )
        kinds.append(price)
        representative = next(b for b in blocks if b.same_as is None and b.breaks)
        breaks.extend(_split(price, representative.breaks, frames, eager_us, step_ms))
    return tuple(kinds), tuple(breaks)


def _profile(ranks: list[RankRun]) -> tuple[dict[int, Any], dict[int, float]]:
    """Rank 0's break frames and, per frame, the slowest rank's eager microseconds."""
    eager: dict[int, float] = {}
    for rank in ranks:
        for frame, us in rank.eager_us_by_frame.items():
            eager[frame] = max(eager.get(frame, 0.0), us)
    return ranks[0].break_frames, eager


def _split(
    kind: KindPrice,
    distinct: tuple[Break, ...],
    frames: dict[int, Any],
    eager_us: dict[int, float],
    step_ms: float,
) -> list[BreakPrice]:
    """The kind's price over its distinct breaks (the module doc's step 4)."""
    from gbdoctor.capture.profile import BreakFrames

    finder = BreakFrames(frames=frames)
    weights = [
        sum(eager_us.get(f, 0.0) for f in finder.frames_at(b.location)) / 1e3
        if b.location is not None
        else 0.0
        for b in distinct
    ]
    if len(distinct) == 1:
        split, shares = PriceSplit.WHOLE_KIND, [1.0]
    elif sum(weights) > 0:
        split, shares = PriceSplit.EAGER_TIME, [w / sum(weights) for w in weights]
    else:
        split, shares = PriceSplit.EVEN, [1.0 / len(distinct)] * len(distinct)
    out = []
    for brk, weight, share in zip(distinct, weights, shares, strict=True):
        ms = None if kind.ms_per_step is None else round(kind.ms_per_step * share, 3)
        spread = (
            None
            if kind.spread_ms is None
            else (round(kind.spread_ms[0] * share, 3), round(kind.spread_ms[1] * share, 3))
        )
        out.append(
            BreakPrice(
                kind=kind.kind,
                cause=brk.cause,
                gb_type=brk.gb_type,
                gb_id=brk.gb_id,
                location=str(brk.location) if brk.location else "",
                module=brk.module,
                ms_per_step=ms,
                spread_ms=spread,
                share=None if ms is None else round(ms / step_ms, 4),
                split=split,
                eager_ms=round(weight, 3) if brk.location is not None else None,
                free=kind.free,
            )
        )
    return out


def _price_record(
    settings: RunSettings,
    notes: list[str],
    *,
    step_ms: float,
    step_spread_ms: tuple[float, float],
    kinds: tuple[KindPrice, ...],
    breaks: tuple[BreakPrice, ...],
    plan_ms: float | None,
    plan_spread_ms: tuple[float, float] | None,
    load: tuple[float, int],
) -> PriceReport:
    """A price under the settings it was measured with: its times, kinds and breaks, the whole
    plan's gain (None: not measured) and the load seen. Every measured field is a parameter
    without a default, so each caller says all of them and mypy checks their types."""
    return PriceReport(
        backend=settings.backend,
        device=settings.device,
        device_name=device_name(settings.device),
        world_size=settings.ranks,
        rounds=settings.rounds,
        warmup=settings.warmup,
        steps=settings.steps,
        batch_size=settings.batch_size,
        seq_len=settings.seq_len,
        step_ms=step_ms,
        step_spread_ms=step_spread_ms,
        kinds=kinds,
        breaks=breaks,
        plan_ms=plan_ms,
        plan_spread_ms=plan_spread_ms,
        load=load,
        notes=tuple(notes),
        clock=settings.clock,
    )


def _empty(report: ScanReport, settings: RunSettings, notes: list[str]) -> PriceReport:
    """The price of a scan with no break: nothing trained, so no step time, no plan's gain and
    no load seen ((0.0, 1): ``PriceReport``'s default, which this price always wrote)."""
    return _price_record(
        settings,
        notes,
        step_ms=0.0,
        step_spread_ms=(0.0, 0.0),
        kinds=(),
        breaks=(),
        plan_ms=None,
        plan_spread_ms=None,
        load=(0.0, 1),
    )
