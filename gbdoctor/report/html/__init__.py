"""``--format html`` and ``gbdoctor report``: one self-contained HTML page of one or more results
(scan, plan, run, gate), each with its JSON twin embedded.

The page opens offline: its CSS, its script and the chart library are inline, and its
Content-Security-Policy forbids any request. Every number on it is a field of the records (or a
count of :mod:`gbdoctor.summary`, where the JSON's ``totals`` come from); nothing is recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gbdoctor.records import GateResult, Plan, RunReport, ScanReport
from gbdoctor.records.io import dumps, to_jsonable
from gbdoctor.report.formats import RenderOptions
from gbdoctor.report.html.documents import Document, document_kind, load_document
from gbdoctor.report.html.extras import timeline_article
from gbdoctor.report.html.gate import gate_article
from gbdoctor.report.html.page import Page, h, tag
from gbdoctor.report.html.plan_run import plan_article, run_article
from gbdoctor.report.html.scan import scan_article
from gbdoctor.report.html.source import SourceReader

__all__ = [
    "Document",
    "HtmlFormat",
    "Results",
    "document_kind",
    "gate_document",
    "load_document",
    "plan_document",
    "render_html",
    "results_html",
    "run_document",
    "scan_document",
]

_TITLES = {"scan": "Scan", "plan": "Plan", "run": "Run", "gate": "Gate", "timeline": "Timeline"}


def _subject(doc: Document) -> str:
    record = doc.record
    if isinstance(record, GateResult):
        return ", ".join(record.specs) or doc.name
    model = getattr(record, "model", None)
    return f"{record.spec} ({model})" if model else str(record.spec)


def render_html(documents: Sequence[Document], source_roots: Sequence[Path] = ()) -> str:
    """The page of ``documents``, in the order given; source lines are read only under
    ``source_roots`` and the installed packages (see :class:`SourceReader`)."""
    reader = SourceReader(tuple(source_roots))
    kinds = ", ".join(dict.fromkeys(_TITLES[d.kind].lower() for d in documents))
    page = Page(title=f"gbdoctor report: {kinds}")
    for i, doc in enumerate(documents):
        ident = f"d{i}"
        record = doc.record
        if isinstance(record, ScanReport):
            body = scan_article(page, record, ident, reader)
        elif isinstance(record, Plan):
            body = plan_article(page, record, ident, doc.emitted)
        elif isinstance(record, RunReport):
            body = run_article(page, record, ident)
        elif isinstance(record, GateResult):
            body = gate_article(record, ident)
        else:
            body = timeline_article(page, record, ident)
        title = f"{_TITLES[doc.kind]}: {_subject(doc)}"
        twin_name = Path(doc.name).name if doc.name.endswith(".json") else f"{doc.kind}.json"
        twin = tag("p", page.twin(doc.json_text, twin_name), class_="no-print")
        page.nav.append((ident, _TITLES[doc.kind]))
        page.articles.append(
            tag(
                "article", tag("h2", h(title)) + twin + body, id=ident, class_=f"doc doc-{doc.kind}"
            )
        )
    return page.render()


@dataclass(frozen=True)
class Results:
    """What ``gbdoctor report`` prints: saved results, one page; source lines are read only
    under ``source_roots`` (and the installed packages)."""

    documents: tuple[Document, ...]
    source_roots: tuple[Path, ...] = ()


def results_html(results: Results, options: RenderOptions) -> str:
    """``gbdoctor report``'s one format (it has no ``--format``)."""
    return render_html(results.documents, source_roots=results.source_roots)


def scan_document(report: ScanReport, name: str = "scan") -> Document:
    from gbdoctor.report.json import render_json

    return Document("scan", report, name, render_json(report))


def plan_document(
    plan: Plan, plan_json: str, emitted: tuple[tuple[str, str], ...] = ()
) -> Document:
    """``plan_json``: the plan file's text (``plan --emit-config json``), made by the caller
    (report/ does not import plan/)."""
    return Document("plan", plan, "plan", plan_json, emitted)


def run_document(report: RunReport, name: str = "run") -> Document:
    return Document("run", report, name, dumps(to_jsonable(report)))


def gate_document(result: GateResult, gate_json: str, name: str = "gate") -> Document:
    """``gate_json``: the result as ``gate --format json`` writes it."""
    return Document("gate", result, name, gate_json)


class HtmlFormat:
    """Formatter for ``scan --format html``."""

    def render(self, report: ScanReport) -> str:
        # The scan just ran here: its spec's files are under the working directory.
        return render_html([scan_document(report)], source_roots=(Path.cwd(),))
