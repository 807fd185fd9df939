"""The comparison: scans against a baseline (or an older scan), as findings and a verdict.

The gate fails (exit 1) when, for any spec and kind, a break key's count rises, a cause or a
gb_type appears that the baseline lacked, a ``region_eager`` or ``frame_skipped`` event count
rises, a block that traced now errors, or a scanned spec is missing from the baseline.
With ``recompiles`` it also fails when a kind's block recompiles more in the scan's probe steps
(``scan/probe.py``: the block run again with changed inputs) than the baseline accepted, and
above all when it recompiles in the last probe step, i.e. on every training step
(``steady_recompiles``). Improvements are reported and fail only with ``strict_improvements``; a
torch version other than the baseline's is a warning, and so is a break torch renamed (same
cause, location and checkpoint flag, or a rename of ``causes/renames.py``): "renamed by torch
2.15.0: GB0007 '...' -> GB0376 '...'", never a regression plus an improvement. A real scan
against a simulated baseline
entry (or the other way round) is an error (exit 2), not a diff.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gbdoctor.errors import BaselineError
from gbdoctor.gate.counts import block_key, kind_counts, spec_key
from gbdoctor.gate.kinds import UPDATE_HINT, compare_spec
from gbdoctor.gate.prices import price_findings
from gbdoctor.records import (
    SEVERITIES,
    Baseline,
    Finding,
    GateResult,
    ScanReport,
    Severity,
)


def _torch_warning(spec: str, baseline_torch: str, torch: str) -> list[Finding]:
    if not baseline_torch or baseline_torch == torch:
        return []
    return [
        Finding(
            severity=Severity.WARNING,
            spec=spec,
            kind="",
            what=f"torch version {baseline_torch} -> {torch}",
            hint="breaks may differ across torch versions; " + UPDATE_HINT,
        )
    ]


def _order(f: Finding) -> tuple[Any, ...]:
    return (SEVERITIES.index(f.severity), f.spec, f.kind, f.cause, f.gb_type, f.what)


def _check_same_environment(key: str, report: ScanReport, baseline: Baseline) -> None:
    """A real scan is never compared with a simulated baseline entry, or the other way round:
    the two capture different things (simulation: one rank, no values, stand-ins)."""
    if baseline.simulated is None or baseline.kinds(key) is None:
        return
    recorded = key in baseline.simulated
    if recorded != report.setup.simulated:
        was, now = ("simulated", "real") if recorded else ("real", "simulated")
        how = "with --simulate" if recorded else "for real (on a machine that fits it)"
        raise BaselineError(
            f"baseline entry for {key} was recorded from a {was} scan, but this scan is {now}; "
            "real and simulated captures are not compared",
            hint=f"scan it {how}, or re-record it with --update-baseline",
        )


def require_probe(report: ScanReport, key: str) -> None:
    """BaselineError (exit 2) for a scan without recompile counts where recompiles are gated."""
    if not report.setup.probed_recompiles:
        raise BaselineError(
            f"{key}: the scan ran without the recompile probe, so it has no recompile counts "
            "to gate on",
            hint="scan with `gbdoctor scan SPEC --recompile-probe`, or let `gate SPEC "
            "--recompiles` scan it",
        )


def check_gate(
    reports: Iterable[ScanReport],
    baseline: Baseline,
    *,
    strict_improvements: bool = False,
    recompiles: bool = False,
) -> GateResult:
    """Compare scans with the baseline.

    ``recompiles=True`` also fails when a kind's block recompiles more over the scan's probe steps
    than the baseline accepted, or recompiles on every step; otherwise recompile changes are
    informational. Graph-count changes are informational.
    """
    findings: list[Finding] = []
    specs: list[str] = []
    kinds: set[tuple[str, str]] = set()
    for report in reports:
        key = spec_key(report.spec)
        if recompiles:
            require_probe(report, key)
        specs.append(key)
        kinds.update((key, block_key(block)) for block in report.blocks)
        findings += _torch_warning(key, baseline.torch_version, report.torch_version)
        old = baseline.kinds(key)
        _check_same_environment(key, report, baseline)
        if old is None:
            findings.append(
                Finding(
                    severity=Severity.REGRESSION,
                    spec=key,
                    kind="",
                    what="spec not in baseline (run --update-baseline)",
                    hint="record it with `gbdoctor gate SPEC --baseline FILE --update-baseline`",
                )
            )
            continue
        findings += compare_spec(
            key,
            old,
            kind_counts(report),
            new_report=report,
            recompiles=recompiles,
            old_torch=baseline.torch_version,
            new_torch=report.torch_version,
        )
    return GateResult(
        findings=tuple(sorted(findings, key=_order)),
        strict_improvements=strict_improvements,
        specs=tuple(specs),
        kinds=tuple(sorted(kinds)),
    )


def diff_reports(
    old: ScanReport,
    new: ScanReport,
    *,
    strict_improvements: bool = False,
    recompiles: bool = False,
    max_price_rise: float | None = None,
) -> GateResult:
    """The gate's rules with the old scan as the baseline (``gbdoctor diff OLD.json NEW.json``).

    Improvements carry the locations of the breaks that went away (from the old scan).
    ``max_price_rise``: also compare the scans' total prices (``gate.prices``), failing on a
    rise of more than that many percent beyond both spreads.
    """
    key = spec_key(new.spec)
    if recompiles:
        require_probe(new, key)
    findings = _torch_warning(key, old.torch_version, new.torch_version)
    if spec_key(old.spec) != key:
        findings.append(
            Finding(
                severity=Severity.INFO,
                spec=key,
                kind="",
                what=f"comparing with spec {spec_key(old.spec)}",
            )
        )
    findings += compare_spec(
        key,
        kind_counts(old),
        kind_counts(new),
        new_report=new,
        old_report=old,
        recompiles=recompiles,
        old_torch=old.torch_version,
        new_torch=new.torch_version,
    )
    if max_price_rise is not None:
        findings += price_findings(old, new, key, max_price_rise)
    return GateResult(
        findings=tuple(sorted(findings, key=_order)),
        strict_improvements=strict_improvements,
        specs=(key,),
        kinds=tuple(sorted({(key, block_key(block)) for block in new.blocks})),
    )
