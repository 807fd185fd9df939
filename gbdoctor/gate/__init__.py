"""The pre-merge check: compare scans against a recorded baseline. Pure logic, no torch (the
pinned Dynamo settings aside).

- ``counts``: what is compared: spec keys, break keys, each block kind's counts;
- ``baseline``: the baseline file: built from scans, merged, written under a lock, read back;
- ``pins``: the Dynamo settings a baseline pins for every scan gated against it;
- ``kinds``: one spec's block kinds against the baseline's, as findings;
- ``compare``: scans against a baseline (or an older scan) as findings and a verdict;
- ``workflow``: ``gbdoctor gate`` end to end: scan under the pins, then record or check.
"""

from __future__ import annotations

from gbdoctor.gate.baseline import (
    baseline_from_reports,
    dump_baseline,
    load_baseline,
    merge_baselines,
    open_baseline,
    parse_baseline,
    record_baseline,
)
from gbdoctor.gate.compare import check_gate, diff_reports, require_probe
from gbdoctor.gate.counts import break_key, kind_counts, spec_key
from gbdoctor.gate.kinds import FAILING_EVENTS
from gbdoctor.gate.pins import PINNED_DYNAMO, PINS_ENV, current_pins, pinned_dynamo
from gbdoctor.gate.workflow import run_gate
from gbdoctor.records import (
    BASELINE_SCHEMA_VERSION,
    SEVERITIES,
    Baseline,
    Finding,
    GateResult,
    KindCounts,
)

__all__ = [
    "BASELINE_SCHEMA_VERSION",
    "FAILING_EVENTS",
    "PINNED_DYNAMO",
    "PINS_ENV",
    "SEVERITIES",
    "Baseline",
    "Finding",
    "GateResult",
    "KindCounts",
    "baseline_from_reports",
    "break_key",
    "check_gate",
    "current_pins",
    "diff_reports",
    "dump_baseline",
    "kind_counts",
    "load_baseline",
    "merge_baselines",
    "open_baseline",
    "parse_baseline",
    "pinned_dynamo",
    "record_baseline",
    "require_probe",
    "run_gate",
    "spec_key",
]
