"""``gbdoctor report``: one self-contained HTML page of saved results
(``gbdoctor.report.html.render_html``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gbdoctor.cli.options import OutputOpt
from gbdoctor.cli.output import emit, preflight
from gbdoctor.records.enums import OutputFormat

if TYPE_CHECKING:
    from gbdoctor.records import GateResult, Plan, PriceReport, ScanReport
    from gbdoctor.report.gate_formats import GatePrintout
    from gbdoctor.report.html import Document
    from gbdoctor.report.plan_table import PlanPrintout


def report(
    results: Annotated[
        list[Path],
        typer.Argument(
            metavar="RESULT",
            help="JSON of scan, run or gate (--format json), plans (plan --emit-config json) "
            "and timelines",
            show_default=False,
        ),
    ],
    output: OutputOpt = None,
    source_root: Annotated[
        list[Path] | None,
        typer.Option(
            "--source-root",
            help="Where the scanned code lives, to show the lines around each break "
            "(besides the working directory, the results' folders and the installed packages; "
            "see docs/security.md)",
        ),
    ] = None,
) -> None:
    """Write one HTML page (offline: no network at view time) of scan, plan, run, gate and
    timeline results."""
    from gbdoctor.report.formats import Printout, render
    from gbdoctor.report.html import Results, load_document

    preflight(None, Printout.REPORT, output, inputs=results)
    documents = []
    for path in results:
        doc = load_document(path)
        if doc.kind == "plan":
            doc = _with_config(doc)
        documents.append(doc)
    from gbdoctor.records import ScanReport

    scans = [doc.record.spec for doc in documents if isinstance(doc.record, ScanReport)]
    roots = source_roots([*(source_root or []), *(p.parent for p in results)], scans)
    emit(render(Printout.REPORT, OutputFormat.HTML, Results(tuple(documents), roots)), output)


def source_roots(chosen: Sequence[Path], specs: Sequence[str]) -> tuple[Path, ...]:
    """Where a page may read source lines: the directories the command line chose (``chosen``
    and the working directory) and each scanned spec's root (``spec.stable_root``: its
    repository) when that lies inside one of them. A scan JSON names its spec, and a JSON can
    come from a stranger, so it can narrow the roots but never widen them (docs/security.md)."""
    from gbdoctor.spec import stable_root

    trusted = tuple(dict.fromkeys(p.resolve() for p in (Path.cwd(), *chosen)))
    found = []
    for spec in specs:
        root = Path(stable_root(spec)).resolve()
        if any(root.is_relative_to(base) for base in trusted):
            found.append(root)
    return tuple(dict.fromkeys((*found, *trusted)))


def _with_config(doc: Document) -> Document:
    from dataclasses import replace

    from gbdoctor.records import Plan

    assert isinstance(doc.record, Plan)
    return replace(doc, emitted=plan_configs(doc.record, None))


def plan_configs(plan: Plan, emitter: str | None) -> tuple[tuple[str, str], ...]:
    """(name, text) of the config a plan emits for the page: ``emitter``'s, else the plan's
    framework's own (plain PyTorch when the framework has none)."""
    from gbdoctor.plan.emit import EMITTERS
    from gbdoctor.plan.emit import emit as emit_plan

    name = emitter or (plan.framework if plan.framework in EMITTERS else "python")
    return ((name, emit_plan(plan, name)),)


def plan_printout(
    plan: Plan, price: PriceReport | None = None, emitter: str | None = None
) -> PlanPrintout:
    """What ``plan`` prints: the plan, each kind's predicted gain from ``price``, and for the
    page the config the plan emits (``emitter``'s, else the framework's own)."""
    from gbdoctor.report.plan_table import PlanPrintout

    return PlanPrintout(plan, price, configs=lambda: plan_configs(plan, emitter))


def gate_printout(
    result: GateResult, scans: Sequence[ScanReport], scan_files: Sequence[Path] = ()
) -> GatePrintout:
    """What ``gate`` prints: its verdict and findings, and for the page every scan it gated
    (source lines from the roots :func:`source_roots` allows, ``scan_files`` being the
    ``--scan`` JSONs)."""
    from gbdoctor.report.gate_formats import GatePrintout

    roots = source_roots([p.parent for p in scan_files], [s.spec for s in scans])
    return GatePrintout(result, scans=tuple(scans), source_roots=roots)


def write_step_summary(result: GateResult, html: Path | None) -> None:
    """In GitHub Actions, append the gate's markdown to ``$GITHUB_STEP_SUMMARY`` (the run's
    summary page), with where the HTML report is: the artifact ``$GBDOCTOR_REPORT_ARTIFACT``
    names (the action in action.yml sets it), else the file."""
    import os

    from gbdoctor.report.formats import Printout, render
    from gbdoctor.report.gate_formats import GatePrintout

    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary:
        return
    text = render(Printout.GATE, OutputFormat.MARKDOWN, GatePrintout(result))
    if html is not None:
        artifact = os.environ.get("GBDOCTOR_REPORT_ARTIFACT")
        where = (
            f"the artifact `{artifact}` of this run (Summary -> Artifacts)"
            if artifact
            else f"`{html}` (upload it with actions/upload-artifact to see it here)"
        )
        text += f"\nHTML report (the breaks, their source lines and fixes): {where}.\n"
    with open(summary, "a", encoding="utf-8") as out:
        out.write(text + "\n")
