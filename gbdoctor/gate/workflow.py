"""What ``gbdoctor gate`` does once its inputs are read: scan under the baseline's pinned Dynamo
settings, then record the scans into the baseline or check them against it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from gbdoctor.gate.baseline import record_baseline
from gbdoctor.gate.compare import check_gate
from gbdoctor.gate.pins import current_pins, pinned_dynamo
from gbdoctor.records import Baseline, GateResult, ScanReport


def run_gate(
    baseline_path: Path,
    baseline: Baseline | None,
    reports: Sequence[ScanReport],
    scans: Iterable[Callable[[], ScanReport]] = (),
    *,
    update: bool = False,
    strict_improvements: bool = False,
    recompiles: bool = False,
    warn: Callable[[str], None] = lambda line: None,
) -> GateResult | None:
    """Gate saved ``reports`` plus those the pending ``scans`` produce (called in order).

    ``baseline`` is the file's contents as :func:`~gbdoctor.gate.baseline.open_baseline` read
    them. The scans run under the Dynamo settings it pins (``nested_graph_breaks``, ...; this
    torch's current values when it pins none), so counts stay comparable across torch releases
    whose defaults differ; ``warn`` hears of a pinned setting this torch lacks.

    ``update``: merge every report into the baseline file and return None (the gate passes).
    Otherwise the result of :func:`~gbdoctor.gate.compare.check_gate`.
    """
    pins = (
        baseline.dynamo_config
        if baseline is not None and baseline.dynamo_config
        else current_pins()
    )
    with pinned_dynamo(pins) as unknown:
        for name in unknown:
            warn(f"warning: this torch has no Dynamo setting {name!r} the baseline pins")
        reports = [*reports, *(scan() for scan in scans)]
    if update:
        record_baseline(baseline_path, reports, pins)
        return None
    if baseline is None:
        raise ValueError("checking needs a baseline (open_baseline reads it unless updating)")
    return check_gate(
        reports, baseline, strict_improvements=strict_improvements, recompiles=recompiles
    )
