"""``gbdoctor run --price FILE``: does what the prices predict match what ``run`` measures?

The priced scan (``gbdoctor price -f json``) says what fixing each block kind saves per step;
``run`` trains the mode as set up and the plan in the same rounds. The check sets the sum of the
kinds' prices beside the paired per-round difference of the two modes (docs/price.md). The two
only compare when they were measured alike: same ranks, backend, batch and sequence length.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from gbdoctor.frameworks.interface import Framework
from gbdoctor.price.driver import breaks_tolerated
from gbdoctor.records import (
    PRICE_CONSISTENT_WITHIN,
    Clock,
    ModeResult,
    PriceCheck,
    RunReport,
    ScanReport,
)
from gbdoctor.records.enums import ModeStatus
from gbdoctor.setup.compile import Strategy


def priced_mode(framework: Framework, priced: ScanReport) -> dict[str, Strategy]:
    """The extra run mode that reproduces what the prices were measured against, from the
    strategies of the spec's ``framework``."""
    strategy, _ = breaks_tolerated(framework.strategies[priced.setup.strategy])
    return {AS_PRICED: strategy}


AS_PRICED = "as-priced"
"""The run mode ``run --price`` adds: the strategy the prices were measured against, exactly as
``price`` ran it (fullgraph relaxed where the spec's strategy would fail on the breaks)."""


def with_price_check(report: RunReport, priced: ScanReport) -> RunReport:
    """``report`` with its ``price_check`` for the priced scan ``priced``."""
    return replace(report, price_check=price_check(report, priced))


def _round_medians(mode: ModeResult, clock: Clock) -> tuple[float, ...]:
    return mode.round_cpu_medians_s if clock == Clock.CPU else mode.round_medians_s


def price_check(report: RunReport, priced: ScanReport) -> PriceCheck:
    price = priced.price
    assert price is not None, "the caller reads a priced scan"
    as_set_up = f"{AS_PRICED} ({priced.setup.strategy})"
    kinds = [k for k in price.kinds if k.ms_per_step is not None]
    predicted = sum(k.ms_per_step or 0.0 for k in kinds)
    ends = [k.spread_ms or (k.ms_per_step or 0.0,) * 2 for k in kinds]  # one round: no spread
    low, high = sum(lo for lo, _ in ends), sum(hi for _, hi in ends)
    check = PriceCheck(
        clock=price.clock,
        as_set_up=as_set_up,
        predicted_ms=round(predicted, 1),
        predicted_spread_ms=(round(low, 1), round(high, 1)),
        measured_ms=None,
    )
    differs = [
        f"{what} {ran} here, {priced_at} when priced"
        for what, ran, priced_at in (
            ("ranks", report.world_size, price.world_size),
            ("backend", report.backend, price.backend),
            ("batch", report.batch_size, price.batch_size),
            ("seq_len", report.seq_len, price.seq_len),
        )
        if ran != priced_at
    ]
    if differs:
        hint = f"rerun with --batch-size {price.batch_size} --seq-len {price.seq_len}"
        return replace(check, detail=f"not comparable ({'; '.join(differs)}): {hint}")
    modes = {m.mode: m for m in report.modes}
    missing = [
        name
        for name in (AS_PRICED, "plan")
        if name not in modes or modes[name].status != ModeStatus.OK
    ]
    if missing:
        return replace(
            check,
            detail=f"mode(s) {', '.join(missing)} did not run (failed, or left out by --modes)",
        )
    base, plan = (
        _round_medians(modes[AS_PRICED], price.clock),
        _round_medians(modes["plan"], price.clock),
    )
    gains = [(b - p) * 1e3 for b, p in zip(base, plan, strict=False)]
    if not gains:
        return replace(check, detail="no measured rounds")
    measured = statistics.median(gains)
    spread = (min(gains), max(gains))
    ratio = predicted / measured if measured else None
    consistent = (
        (ratio is not None and abs(predicted - measured) <= PRICE_CONSISTENT_WITHIN * abs(measured))
        or low <= measured <= high
        or spread[0] <= predicted <= spread[1]
    )
    return replace(
        check,
        measured_ms=round(measured, 1),
        measured_spread_ms=(round(spread[0], 1), round(spread[1], 1)),
        ratio=round(ratio, 2) if ratio is not None else None,
        consistent=consistent,
        detail="" if consistent else _drift(price.step_ms, base, abs(predicted - measured)),
    )


def _drift(priced_step_ms: float, base_rounds_s: tuple[float, ...], disagreement: float) -> str:
    """Why an inconsistent check may say nothing about the prices: the same mode, as set up,
    ran at another speed here than when priced, by at least as much as the two disagree (on a
    busy CPU, measured up to 40 ms per step between runs of the per-op SAC variant)."""
    here = statistics.median(base_rounds_s) * 1e3
    if abs(here - priced_step_ms) < disagreement:
        return ""
    return (
        f"the mode as set up ran {here:.1f} ms per step here and {priced_step_ms:.1f} ms when "
        f"priced ({here - priced_step_ms:+.1f} ms): the machine moved between the two "
        "measurements by at least as much as they disagree; rerun both on a quieter machine "
        "(or with --clock cpu and more --rounds)"
    )
