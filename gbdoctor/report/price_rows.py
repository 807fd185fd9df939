"""The price section's text, laid out once for the table and markdown formats (``gbdoctor
price``): every number comes from the report's ``price`` record, nothing is recomputed."""

from __future__ import annotations

from gbdoctor.records import (
    PRICE_CONSISTENT_WITHIN,
    BreakPrice,
    Clock,
    KindPrice,
    PriceCheck,
    PriceReport,
)

PRICE_HEADERS = ("kind", "cause", "gb id", "location", "ms/step [rounds]", "share", "split")
KIND_HEADERS = ("kind", "layers", "against", "ms/step [rounds]", "share", "verdict")


def _ms(value: float | None, spread: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    text = f"{value:.1f}"
    return text + (f" [{spread[0]:.1f} to {spread[1]:.1f}]" if spread else "")


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _verdict(price: KindPrice) -> str:
    if price.ms_per_step is None:
        return price.detail
    if price.free:
        return "free (within noise)"
    return "costs" if price.ms_per_step > 0 else "the breaks' setup is faster"


def break_rows(price: PriceReport) -> list[tuple[str, ...]]:
    """One row per distinct break, the most expensive first (ties in scan order)."""
    order = sorted(
        range(len(price.breaks)),
        key=lambda i: (-(price.breaks[i].ms_per_step or float("-inf")), i),
    )
    return [_break_row(price.breaks[i]) for i in order]


def _break_row(b: BreakPrice) -> tuple[str, ...]:
    return (
        b.kind,
        b.cause,
        b.gb_id or "-",
        b.location or "-",
        _ms(b.ms_per_step, b.spread_ms) + (" (free)" if b.free else ""),
        _share(b.share),
        b.split,
    )


def kind_rows(price: PriceReport) -> list[tuple[str, ...]]:
    return [
        (
            k.kind,
            str(k.layers),
            f"{k.counterfactual}: {k.recipe}",
            _ms(k.ms_per_step, k.spread_ms),
            _share(k.share),
            _verdict(k),
        )
        for k in price.kinds
    ]


def price_headline(price: PriceReport) -> str:
    """How the prices were measured, in one line."""
    load, cores = price.load
    clock = " in the ranks' CPU time" if price.clock == Clock.CPU else ""
    return (
        f"Measured{clock} on {price.device} ({price.device_name}), backend {price.backend}, "
        f"{price.world_size} rank(s), {price.batch_size} x {price.seq_len} tokens per rank, "
        f"{price.rounds} round(s) x ({price.warmup} warm-up + {price.steps} steps); step as set "
        f"up {_ms(price.step_ms, price.step_spread_ms)} ms; load {load:.1f} on {cores} core(s)."
    )


def cause_totals(price: PriceReport) -> str:
    """The price per cause (every priced break of that cause, all kinds), largest first."""
    totals: dict[str, float] = {}
    for b in price.breaks:
        if b.ms_per_step is not None:
            totals[b.cause] = totals.get(b.cause, 0.0) + b.ms_per_step
    if not totals:
        return ""
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    return "Price by cause: " + ", ".join(f"{cause} {ms:.1f} ms/step" for cause, ms in ranked) + "."


def price_check(price: PriceReport) -> str:
    """The kinds' prices against the whole plan's measured gain, when both exist."""
    if price.plan_ms is None:
        return ""
    total = sum(k.ms_per_step for k in price.kinds if k.ms_per_step is not None)
    return (
        f"Check: the kinds' prices add up to {total:.1f} ms/step; every fix at once gained "
        f"{_ms(price.plan_ms, price.plan_spread_ms)} ms/step."
    )


def run_price_check(check: PriceCheck | None) -> str:
    """``run --price``: the prices' predicted gain beside the gain this run measured."""
    if check is None:
        return ""
    predicted = f"{_ms(check.predicted_ms, check.predicted_spread_ms)} ms/step"
    clock = " (CPU time)" if check.clock == Clock.CPU else ""
    head = (
        f"Price check{clock}: the prices predict {predicted} for the plan against {check.as_set_up}"
    )
    if check.measured_ms is None:
        return f"{head}; {check.detail}."
    verdict = "consistent" if check.consistent else "NOT consistent"
    ratio = f", ratio {check.ratio:.2f}" if check.ratio is not None else ""
    why = f" Note: {check.detail}." if check.detail else ""
    return (
        f"{head}; this run measured {_ms(check.measured_ms, check.measured_spread_ms)} "
        f"ms/step{ratio}: {verdict} (within {PRICE_CONSISTENT_WITHIN * 100:.0f} %, or inside the other's spread).{why}"
    )
