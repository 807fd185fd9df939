"""Price records: what each distinct graph break costs a training step (``price/driver.py``).

A price is measured, never estimated: per block kind, the training step as set up (with the
kind's breaks) against the same step with the kind fixed (the plan's verified recipe for that
kind, or the kind left eager where no fix exists); the difference is split over the kind's
distinct breaks by the eager time each break's frame spent in a profiled step. Units are
milliseconds per training step (forward + backward + optimizer, slowest rank), on the
``PriceReport.clock``: wall time, or the ranks' CPU time.
"""

from __future__ import annotations

from typing import Annotated

from gbdoctor.records.base import record
from gbdoctor.records.bounds import BATCH_SIZE, ROUNDS, SEQ_LEN, SHARE, STEPS, WARMUP, WORLD_SIZE
from gbdoctor.records.enums import Clock, Counterfactual, PriceSplit


@record
class KindPrice:
    """The measured price of one block kind's breaks: step(as set up) - step(kind fixed)."""

    kind: str
    layers: int
    counterfactual: Counterfactual
    """What the kind was compared against: the plan's fix, or the kind left eager."""
    recipe: str
    """The counterfactual in words (``block fullgraph``, ``children fullgraph, eager moe.experts``)."""
    ms_per_step: float | None
    """Median over rounds of the per-round difference; None when a mode failed (``detail``)."""
    spread_ms: tuple[float, float] | None = None
    """(min, max) of the per-round differences."""
    share: Annotated[float, SHARE] | None = None
    """``ms_per_step`` over the as-set-up step time."""
    free: bool = False
    """The spread contains 0: the kind's breaks cost nothing measurable here."""
    detail: str = ""


@record
class BreakPrice:
    """The price of one distinct break (a scan break of the kind, identified as in baselines)."""

    kind: str
    cause: str
    gb_type: str
    gb_id: str | None
    location: str
    """``file:line`` as the scan reports it (empty when the break has no location)."""
    module: str
    ms_per_step: float | None
    spread_ms: tuple[float, float] | None = None
    share: Annotated[float, SHARE] | None = None
    split: PriceSplit = PriceSplit.WHOLE_KIND
    """How the kind's price was divided among its breaks."""
    eager_ms: float | None = None
    """Eager time of this break's frame in the profiled step, forward and the backward of that
    eager work (the split's weight), summed over layers and ranks' maximum."""
    free: bool = False


@record
class PriceReport:
    """``ScanReport.price``: how the prices were measured, the kinds' prices and the breaks'."""

    backend: str
    device: str
    device_name: str
    world_size: Annotated[int, WORLD_SIZE]
    rounds: Annotated[int, ROUNDS]
    warmup: Annotated[int, WARMUP]
    steps: Annotated[int, STEPS]
    batch_size: Annotated[int, BATCH_SIZE]
    seq_len: Annotated[int, SEQ_LEN]
    step_ms: float
    """Median step time as set up (every round)."""
    step_spread_ms: tuple[float, float]
    kinds: tuple[KindPrice, ...]
    breaks: tuple[BreakPrice, ...]
    plan_ms: float | None = None
    """Measured gain of every fix at once (step as set up - step with the whole plan): the
    check on the kinds' prices, which should add up to about this."""
    plan_spread_ms: tuple[float, float] | None = None
    load: tuple[float, int] = (0.0, 1)
    """(load average seen, cores): prices measured on a busy machine say so."""
    notes: tuple[str, ...] = ()
    clock: Clock = Clock.WALL
    """The time every ms above is measured in (scan schema 7; earlier prices are wall time)."""


PRICE_CONSISTENT_WITHIN = 0.30
"""Relative agreement between a price and a measured gain that counts as consistent (issue 27's
bar), besides spread overlap: ``run --price`` decides with it and its report line quotes it."""


@record
class PriceCheck:
    """``gbdoctor run --price FILE``: the prices' predicted gain set beside the gain ``run``
    measured between the mode as set up and the plan (``RunReport.price_check``)."""

    as_set_up: str
    """What the prices were measured against: ``as-priced (STRATEGY)``, the run mode that
    reproduces it (the priced scan's strategy, fullgraph relaxed as ``price`` ran it)."""
    predicted_ms: float
    """Sum of the priced kinds' prices: what fixing them all should save per step."""
    predicted_spread_ms: tuple[float, float]
    """(sum of the kinds' minimums, sum of their maximums)."""
    measured_ms: float | None
    """Median over rounds of step(as set up) - step(plan), paired within each round; None when
    either mode did not run (``detail``)."""
    measured_spread_ms: tuple[float, float] | None = None
    ratio: float | None = None
    """``predicted_ms / measured_ms``."""
    consistent: bool | None = None
    """Within :data:`PRICE_CONSISTENT_WITHIN` of the measured gain, or either number inside the
    other's spread; None when not comparable."""
    detail: str = ""
    clock: Clock = Clock.WALL
    """The prices' clock, which the measured side is read in too (run schema 5)."""
