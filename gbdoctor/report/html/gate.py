"""A gate result in HTML: the verdict, then what went up first (failing findings, by spec and
kind), then the rest, in the gate's own order."""

from __future__ import annotations

from gbdoctor.records import Finding, GateResult, Severity
from gbdoctor.report.html.page import badge, h, table, tag
from gbdoctor.report.layout import short_location

__all__ = ["gate_article"]

_TONE: dict[str, str] = {
    Severity.REGRESSION: "bad",
    Severity.IMPROVEMENT: "good",
    Severity.WARNING: "warn",
    Severity.INFO: "info",
}


def _rows(result: GateResult, findings: list[Finding]) -> list[tuple[str, ...]]:
    return [
        (
            badge(
                f.severity + (" (fails)" if result.fails(f) else ""), _TONE.get(f.severity, "info")
            ),
            h(f.spec),
            h(f.kind or "-"),
            h(f.what),
            h(f.cause or "-"),
            h(", ".join(short_location(loc) for loc in f.locations) or "-"),
            h(f.hint or "-"),
        )
        for f in findings
    ]


def gate_article(result: GateResult, doc: str) -> str:
    verdict = tag(
        "div",
        h("PASSED" if result.passed else "FAILED"),
        class_="verdict " + ("good" if result.passed else "bad"),
    )
    parts = [verdict, tag("p", h(result.headline))]
    head = ("severity", "spec", "kind", "change", "cause", "location", "hint")
    # The order of the gate itself (most severe first), failing findings before the others.
    failing = [f for f in result.findings if result.fails(f)]
    others = [f for f in result.findings if not result.fails(f)]
    if failing:
        parts.append(
            tag(
                "section",
                tag("h3", h("What went up (fails the gate)")) + table(head, _rows(result, failing)),
                id=f"{doc}-failing",
            )
        )
    if others:
        parts.append(
            tag(
                "section",
                tag("h3", h("Other changes")) + table(head, _rows(result, others)),
                id=f"{doc}-other",
            )
        )
    if not result.findings:
        parts.append(tag("p", badge("no change against the baseline", "good")))
    checked = [(h(spec), h(kind)) for spec, kind in result.kinds]
    if checked:
        parts.append(
            tag(
                "details",
                tag("summary", h(f"{len(checked)} block kind(s) checked"))
                + table(("spec", "kind"), checked),
            )
        )
    return "".join(parts)
