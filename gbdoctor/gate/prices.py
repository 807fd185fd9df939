"""Prices compared (``gbdoctor diff --max-price-rise PCT`` on two ``gbdoctor price`` outputs).

The total price of a scan is the sum of its block kinds' measured prices (ms per step). Two
totals are compared only when both were measured on the same device class (a CPU price says
nothing about a GPU step), and a rise fails only when it exceeds the threshold AND the two
spreads do not overlap (noise is never a regression).
"""

from __future__ import annotations

from gbdoctor.records import Finding, PriceReport, ScanReport, Severity


def _total(price: PriceReport) -> tuple[float, float, float]:
    """(median, low, high) of the summed kind prices, in ms per step."""
    kinds = [k for k in price.kinds if k.ms_per_step is not None]
    median = sum(k.ms_per_step or 0.0 for k in kinds)
    low = sum(k.spread_ms[0] if k.spread_ms else (k.ms_per_step or 0.0) for k in kinds)
    high = sum(k.spread_ms[1] if k.spread_ms else (k.ms_per_step or 0.0) for k in kinds)
    return median, low, high


def price_findings(
    old: ScanReport, new: ScanReport, key: str, max_rise_pct: float
) -> list[Finding]:
    """Findings about the total price; nothing when neither scan carries prices."""
    if old.price is None or new.price is None:
        if old.price is None and new.price is None:
            what = "no prices to compare: neither scan was made by `gbdoctor price`"
        else:
            what = "prices not compared: only one of the two scans carries them"
        return [Finding(severity=Severity.WARNING, spec=key, kind="", what=what)]
    if old.price.device != new.price.device:
        return [
            Finding(
                severity=Severity.WARNING,
                spec=key,
                kind="",
                what=f"prices not compared: measured on {old.price.device} and on {new.price.device}",
                hint="compare prices measured on the same device class",
            )
        ]
    before, _, before_high = _total(old.price)
    after, after_low, _ = _total(new.price)
    rise = (after - before) / abs(before) * 100 if before else (100.0 if after > 0 else 0.0)
    what = f"price per step {before:.1f} -> {after:.1f} ms ({rise:+.0f}%)"
    if rise > max_rise_pct and after_low > before_high:
        severity = Severity.REGRESSION
    elif rise < -max_rise_pct:
        severity = Severity.IMPROVEMENT
    else:
        severity = Severity.INFO
        if rise > max_rise_pct:
            what += ", within the spread of the two measurements"
    return [
        Finding(
            severity=severity,
            spec=key,
            kind="",
            what=what,
            hint="see the price per break in the new scan"
            if severity == Severity.REGRESSION
            else "",
        )
    ]
