"""Formatters for :class:`~gbdoctor.gate.GateResult` (``gbdoctor gate`` / ``gbdoctor diff``),
and their renderers of a :class:`GatePrintout` (the registry is :mod:`gbdoctor.report.formats`).

``table`` lives in :mod:`gbdoctor.report.table` (the only rich importer); the others are
plain text: ``json`` (byte-stable), ``markdown`` (PR comment), ``github`` (annotations at the
file:line of each new break) and ``junit``; ``html`` is one page of the verdict and the scans.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gbdoctor.records import SEVERITIES, Finding, GateResult, ScanReport
from gbdoctor.records.io import dumps, to_jsonable
from gbdoctor.report.formats import Printout, RenderOptions, render
from gbdoctor.report.github import command
from gbdoctor.report.html import gate_document, render_html, scan_document
from gbdoctor.report.junit import element, xml_safe, xml_text
from gbdoctor.report.layout import short_location
from gbdoctor.report.markdown import code, md_table
from gbdoctor.report.table import GATE_TITLE, GateTableFormat
from gbdoctor.summary import with_user_names

__all__ = [
    "GateFormatter",
    "GatePrintout",
    "gate_github",
    "gate_html",
    "gate_json",
    "gate_junit",
    "gate_markdown",
    "gate_table",
    "render_gate",
]


@dataclass(frozen=True)
class GatePrintout:
    """What ``gate`` and ``diff`` print: the result under the command's ``title``; the HTML
    page also shows the ``scans`` gated, quoting source lines only under ``source_roots``."""

    result: GateResult
    title: str = GATE_TITLE
    scans: tuple[ScanReport, ...] = ()
    source_roots: tuple[Path, ...] = ()


class GateFormatter(Protocol):
    """Renders a gate result as text; ``title`` names the command (``gbdoctor gate`` or
    ``gbdoctor diff``) in headers, annotations and suite names."""

    title: str

    def render(self, result: GateResult) -> str: ...


class GateJsonFormat:
    """``--format json``: the findings plus the verdict, byte-stable."""

    title = GATE_TITLE

    def render(self, result: GateResult) -> str:
        data = to_jsonable(result)
        data.update(
            passed=result.passed,
            exit_code=result.exit_code,
            counts={s: result.count(s) for s in SEVERITIES},
        )
        return dumps(data)


def _where(f: Finding) -> str:
    return ", ".join(short_location(loc) for loc in f.locations)


class GateMarkdownFormat:
    """``--format markdown``: a PR comment."""

    title = GATE_TITLE

    def render(self, result: GateResult) -> str:
        lines = [
            f"## {self.title}: {'passed' if result.passed else 'FAILED'}",
            "",
            result.headline,
            "",
        ]
        if result.findings:
            lines += md_table(
                ("", "severity", "spec", "kind", "change", "cause", "location", "hint"),
                (
                    (
                        "fail" if result.fails(f) else "",
                        f.severity,
                        f.spec,
                        f.kind or "-",
                        f.what,
                        f.cause or "-",
                        _where(f) or "-",
                        f.hint,
                    )
                    for f in result.findings
                ),
            )
        else:
            lines.append("No change against the baseline.")
        if not result.passed:
            accept = code("gbdoctor gate SPEC --baseline FILE --update-baseline")
            lines += ["", f"Accept intended changes with {accept}."]
        return "\n".join(lines) + "\n"


class GateGithubFormat:
    """``--format github``: an annotation per failing finding at the file:line of each new break."""

    title = GATE_TITLE

    def render(self, result: GateResult) -> str:
        levels = {"regression": "error", "warning": "warning", "improvement": "notice"}
        lines = []
        for f in result.findings:
            level = "error" if result.fails(f) else levels.get(f.severity)
            if level is None:  # info: only in the other formats
                continue
            scope = f"{f.spec} [{f.kind}]" if f.kind else f.spec
            title = f"{self.title}: {f.kind + ': ' if f.kind else ''}{f.what}"
            message = f"{scope}: {f.what}"
            if f.gb_type:
                message += f"\ngb_type: {f.gb_type}"
            if f.hint:
                message += f"\nHint: {f.hint}"
            for loc in f.locations or (None,):
                lines.append(command(level, message, title=title, location=loc))
        lines.append(
            command("notice" if result.passed else "error", result.headline, title=self.title)
        )
        return "\n".join(lines) + "\n"


class GateJunitFormat:
    """``--format junit``: a testsuite per spec, a testcase per block kind, failures for failing findings."""

    title = GATE_TITLE

    def render(self, result: GateResult) -> str:
        root = element("testsuites", ("name", self.title))
        total = failed = 0
        for spec in result.specs:
            findings = [f for f in result.findings if f.spec == spec]
            kinds = sorted({k for s, k in result.kinds if s == spec} | {f.kind for f in findings})
            cases = []
            for kind in kinds:
                case = element("testcase", ("name", kind or "(spec)"), ("classname", spec))
                mine = [f for f in findings if f.kind == kind]
                for f in mine:
                    if result.fails(f):
                        fail = element("failure", ("type", f.severity), ("message", f.what))
                        fail.text = xml_safe(
                            "\n".join(
                                f"{k}: {v}"
                                for k, v in (
                                    ("cause", f.cause),
                                    ("gb_type", f.gb_type),
                                    ("location", ", ".join(map(str, f.locations))),
                                    ("hint", f.hint),
                                )
                                if v
                            )
                        )
                        case.append(fail)
                others = [f"{f.severity}: {f.what}" for f in mine if not result.fails(f)]
                if others:
                    out = element("system-out")
                    out.text = xml_safe("\n".join(others))
                    case.append(out)
                cases.append(case)
            failing = sum(1 for c in cases if c.find("failure") is not None)
            suite = element(
                "testsuite",
                ("name", spec),
                ("tests", len(cases)),
                ("failures", failing),
                ("errors", 0),
                ("skipped", 0),
            )
            suite.extend(cases)
            root.append(suite)
            total, failed = total + len(cases), failed + failing
        root.set("tests", str(total))
        root.set("failures", str(failed))
        root.set("errors", "0")
        return xml_text(root)


def _titled(formatter: type[GateFormatter]) -> Callable[[GatePrintout, RenderOptions], str]:
    """The renderer of a gate format: the formatter under the printout's title."""

    def render_titled(printout: GatePrintout, options: RenderOptions) -> str:
        titled = formatter()
        titled.title = printout.title
        if isinstance(titled, GateTableFormat):
            titled.details = options.details
        # A recompile finding quotes its guard, which may name Dynamo's stack slots.
        return titled.render(with_user_names(printout.result))

    return render_titled


gate_table = _titled(GateTableFormat)
gate_json = _titled(GateJsonFormat)
gate_markdown = _titled(GateMarkdownFormat)
gate_junit = _titled(GateJunitFormat)
gate_github = _titled(GateGithubFormat)


def gate_html(printout: GatePrintout, options: RenderOptions) -> str:
    """``--format html``: the verdict and what went up first, then every scan gated, as one
    page (each with its JSON embedded)."""
    # Every output says Dynamo's generated names in the user's terms (report.render's rule).
    result = with_user_names(printout.result)
    documents = [
        gate_document(result, GateJsonFormat().render(result)),
        *(
            scan_document(with_user_names(scan), f"scan-{i}")
            for i, scan in enumerate(printout.scans)
        ),
    ]
    return render_html(documents, source_roots=printout.source_roots)


def render_gate(
    result: GateResult, fmt: str, title: str = GATE_TITLE, *, details: bool = True
) -> str:
    """The gate result in format ``fmt`` under ``title`` (``gbdoctor diff`` for diff):
    :func:`gbdoctor.report.formats.render` of ``Printout.GATE``; :class:`SpecError` (exit 2)
    for an unknown format. ``details``: the table's informational findings too
    (``gate --details``); the other formats hold every finding."""
    return render(Printout.GATE, fmt, GatePrintout(result, title), RenderOptions(details=details))
