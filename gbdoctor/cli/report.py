"""``gbdoctor report``: one self-contained HTML page of saved results
(``gbdoctor.report.html.render_html``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gbdoctor.cli.options import OutputOpt
from gbdoctor.cli.output import emit, preflight

if TYPE_CHECKING:
    from gbdoctor.records import GateResult, Plan, ScanReport
    from gbdoctor.report.html import Document


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
    from gbdoctor.report.html import load_document, render_html

    preflight(None, "report", output, inputs=results)
    documents = []
    for path in results:
        doc = load_document(path)
        if doc.kind == "plan":
            doc = _with_config(doc)
        documents.append(doc)
    from gbdoctor.records import ScanReport

    scans = [doc.record.spec for doc in documents if isinstance(doc.record, ScanReport)]
    roots = source_roots([*(source_root or []), *(p.parent for p in results)], scans)
    emit(render_html(documents, source_roots=roots), output)


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


def plan_html(plan: Plan, emitter: str | None) -> str:
    """``plan --format html``: the plan's page, with its JSON twin and emitted config."""
    from gbdoctor.plan.planner import dump_plan
    from gbdoctor.report.html import plan_document, render_html

    return render_html([plan_document(plan, dump_plan(plan), plan_configs(plan, emitter))])


def gate_html(
    result: GateResult, scans: Sequence[ScanReport], scan_files: Sequence[Path] = ()
) -> str:
    """The gate's page: its verdict and findings first, then every scan it gated (source lines
    from the roots :func:`source_roots` allows, ``scan_files`` being the ``--scan`` JSONs)."""
    from gbdoctor.report.gate_formats import GateJsonFormat
    from gbdoctor.report.html import gate_document, render_html, scan_document
    from gbdoctor.summary import with_user_names

    # Every output says Dynamo's generated names in the user's terms (report.render's rule).
    result, scans = with_user_names(result), [with_user_names(s) for s in scans]
    gate_doc = gate_document(result, GateJsonFormat().render(result))
    roots = source_roots([p.parent for p in scan_files], [s.spec for s in scans])
    documents = [gate_doc, *(scan_document(s, f"scan-{i}") for i, s in enumerate(scans))]
    return render_html(documents, source_roots=roots)


def write_step_summary(result: GateResult, html: Path | None) -> None:
    """In GitHub Actions, append the gate's markdown to ``$GITHUB_STEP_SUMMARY`` (the run's
    summary page), with where the HTML report is: the artifact ``$GBDOCTOR_REPORT_ARTIFACT``
    names (the action in action.yml sets it), else the file."""
    import os

    from gbdoctor.report.gate_formats import render_gate

    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary:
        return
    text = render_gate(result, "markdown")
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
