"""The HTML report without a browser: what each section holds, read back with ``html.parser``
and compared with the JSON it was made from (counted here independently of ``summary``)."""

from __future__ import annotations

import json
import re
from html import escape, unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from html_cases import distinct_breaks, run_report
from repo_paths import FIXTURES, REPO
from typer.testing import CliRunner

from gbdoctor.cli.root import app
from gbdoctor.report.html import load_document, render_html, run_document

GOLDEN = FIXTURES / "golden"
SCANS = sorted((GOLDEN / "scan").glob("*.json"))
EP2_SCAN = GOLDEN / "scan" / "llama4_debug_ep2.json"
"""A scan with FSDP/EP hook breaks and eager regions."""


def rendered(path: Path, **options: object) -> tuple[dict, str]:
    """The result file's JSON and its page (``render_html`` options passed on)."""
    return json.loads(path.read_text()), render_html([load_document(path)], **options)


class Elements(HTMLParser):
    """Every start tag as (tag, attributes), and the text of the page."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def with_class(self, name: str) -> list[dict[str, str | None]]:
        return [a for _, a in self.tags if name in (a.get("class") or "").split()]


@pytest.mark.parametrize("path", SCANS, ids=lambda p: p.stem)
def test_scan_page_matches_its_json(path: Path) -> None:
    data, text = rendered(path)
    page = Elements(text)
    cells = page.with_class("cell")
    assert [c["data-fqn"] for c in cells] == [b["fqn"] for b in data["blocks"]]
    assert [c["data-kind"] for c in cells] == [b["kind"] for b in data["blocks"]]
    assert len(page.with_class("break-row")) == distinct_breaks(data)
    kinds = {c["data-kind"] for c in page.with_class("kind-card")}
    assert kinds == {b["kind"] for b in data["blocks"]}
    # Every cell opens an existing card of its own kind.
    cards = {c["id"]: c["data-kind"] for c in page.with_class("kind-card")}
    assert all(cards[c["data-card"]] == c["data-kind"] for c in cells)
    cards_text = " ".join(page.text)
    totals = data["totals"]
    for value, label in ((totals["breaks"], "graph breaks"), (totals["graphs"], "graphs")):
        assert re.search(rf"\b{value}\s*{label}", cards_text), label


def test_strip_marks_breaks_and_eager_regions() -> None:
    data, text = rendered(EP2_SCAN)
    cells = Elements(text).with_class("cell")
    for block, cell in zip(data["blocks"], cells, strict=True):
        marks = set((cell["class"] or "").split())
        assert ("breaks" in marks) == bool(block["breaks"])
        eager = any(e["kind"] in ("region_eager", "frame_skipped") for e in block["events"])
        assert ("eager" in marks) == eager
    assert any("eager" in (c["class"] or "") for c in cells)


def test_break_shows_the_source_lines_read_at_report_time() -> None:
    data, text = rendered(EP2_SCAN, source_roots=[REPO])
    brk = next(b for block in data["blocks"] for b in block["breaks"])
    loc = brk["location"]
    line = (REPO / loc["file"]).read_text().splitlines()[loc["line"] - 1]
    assert f"{loc['file']}:{loc['line']}" in text
    hit = re.search(r'<span class="hit"><i>(\d+)</i>(.*?)</span>', text)
    assert hit is not None and int(hit.group(1)) == loc["line"]
    assert unescape(hit.group(2)) == line
    assert brk["gb_id"] in text and "fsdp" in text


def test_a_location_not_found_says_so(tmp_path: Path) -> None:
    data = json.loads(EP2_SCAN.read_text())
    for block in data["blocks"]:
        for brk in block["breaks"]:
            brk["location"]["file"] = "nowhere/missing_module.py"
    path = tmp_path / "scan.json"
    path.write_text(json.dumps(data))
    text = render_html([load_document(path)])
    assert "not found at report time" in text and "nowhere/missing_module.py" in text


def test_page_is_self_contained() -> None:
    docs = [load_document(p) for p in (SCANS[0], GOLDEN / "plan" / "llama4_debug.json")]
    text = render_html(docs)
    assert "default-src 'none'" in text  # the browser refuses any request the page would make
    assert not re.search(r"<(script|img|link|iframe)[^>]+(src|href)=", text)
    assert "sourceMappingURL" not in text and "@import" not in text
    assert text.count("<html") == 1 and text.endswith("</html>\n")


def test_same_input_gives_the_same_page() -> None:
    doc = load_document(GOLDEN / "scan" / "deepseek_v3_debug_ep2.json")
    assert render_html([doc]) == render_html([doc])


def test_plan_page_shows_before_after_and_the_emitted_config() -> None:
    path = GOLDEN / "plan" / "llama4_debug.json"
    data = json.loads(path.read_text())
    result = CliRunner().invoke(app, ["report", str(path)])
    assert result.exit_code == 0, result.output
    text = result.stdout
    for kind in data["kinds"]:
        assert f"{kind['breaks_before']} -&gt; {kind['breaks_after']}" in text
    assert "Emitted config (torchtitan)" in text
    assert text.count('badge good">verified') >= sum(k["verified"] for k in data["kinds"])


def test_gate_page_puts_what_went_up_first() -> None:
    data, text = rendered(GOLDEN / "gate" / "debug_specs_and_custom.json")
    assert "FAILED" in text and data["passed"] is False
    first = text.index("What went up")
    for finding in data["findings"]:
        if finding["severity"] == "regression":
            assert text.index(escape(finding["what"])) > first


def test_run_charts_carry_the_records_numbers() -> None:
    report = run_report()
    text = render_html([run_document(report)])
    charts = [
        json.loads(body)
        for ident, body in re.findall(
            r'<script type="application/json" id="(chart-\d+)">(.*?)</script>', text
        )
    ]
    by_title = {}
    for canvas, spec in zip(re.findall(r'aria-label="([^"]+)"', text), charts, strict=True):
        by_title[canvas] = spec
    step = by_title["Step time per mode"]["datasets"]
    assert step[0]["data"] == [m.step_time_median_s for m in report.modes]
    assert step[1]["data"] == [[m.step_time_min_s, m.step_time_max_s] for m in report.modes]
    speed = by_title["Speed-up vs eager"]["datasets"]
    assert speed[1]["data"] == [None, [1.1, 1.3]]
    loss = by_title["Loss per step"]["datasets"]
    assert [d["data"] for d in loss] == [list(m.losses) for m in report.modes]


def test_report_cli_refuses_what_is_not_a_result(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    result = CliRunner().invoke(app, ["report", str(other)])
    assert result.exit_code == 2
    assert "not a gbdoctor scan, plan, run or gate result" in result.output


def test_gate_format_html_from_saved_scans(tmp_path: Path) -> None:
    out = tmp_path / "gate.html"
    result = CliRunner().invoke(
        app,
        [
            "gate",
            "--scan",
            str(GOLDEN / "scan" / "llama4_debug.json"),
            "--baseline",
            str(FIXTURES / "baselines" / "debug-specs.json"),
            "--format",
            "html",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code in (0, 1), result.output
    text = out.read_text()
    assert "gbdoctor report: gate" in text and ("PASSED" in text or "FAILED" in text)


def test_a_real_run_page_shows_every_mode() -> None:
    path = Path(__file__).with_name("test_html_run_llama4_debug.json")
    data, text = rendered(path)
    page = Elements(text)
    modes = [m["mode"] for m in data["modes"]]
    assert len(modes) == 5
    text = " ".join(page.text)
    for mode in data["modes"]:
        assert mode["mode"] in text and mode["verdict_vs_eager"] in text


def test_price_of_a_scan() -> None:
    """#27's ``ScanReport.price``: a section and a line per priced break (skipped until then)."""
    price_records = pytest.importorskip(
        "gbdoctor.records.price", reason="ScanReport.price arrives with #27"
    )
    from dataclasses import replace

    from gbdoctor.report.html import scan_document

    report = load_document(EP2_SCAN).record
    block = next(b for b in report.blocks if b.breaks)
    brk = block.breaks[0]
    price = price_records.PriceReport(
        backend="aot_eager",
        device="cpu",
        device_name="",
        world_size=2,
        rounds=2,
        warmup=1,
        steps=3,
        batch_size=2,
        seq_len=64,
        step_ms=812.5,
        step_spread_ms=(800.0, 830.0),
        kinds=(
            price_records.KindPrice(
                kind=block.kind,
                layers=3,
                counterfactual="plan-fix",
                recipe="children fullgraph",
                ms_per_step=41.0,
                spread_ms=(30.0, 52.0),
                share=0.05,
            ),
        ),
        breaks=(
            price_records.BreakPrice(
                kind=block.kind,
                cause=brk.cause,
                gb_type=brk.gb_type,
                gb_id=brk.gb_id,
                location=str(brk.location),
                module=brk.module,
                ms_per_step=41.0,
                spread_ms=(30.0, 52.0),
                share=0.05,
            ),
        ),
    )
    text = render_html([scan_document(replace(report, price=price))])
    assert "Price of the breaks" in text
    assert "41 ms (30..52) per step, 5.0% of the step (whole-kind)" in text


def test_timeline_document(tmp_path: Path) -> None:
    """#29's ``gbdoctor timeline`` result as a document (skipped until its records land)."""
    tl = pytest.importorskip("gbdoctor.records.timeline", reason="timelines arrive with #29")
    from gbdoctor.records.io import dumps, to_jsonable

    frame = "forward at fixtures/timeline/step_counter.py:35"
    steps = tuple(
        tl.TimelineStep(
            step=i,
            time_s=0.9 if i % 3 == 0 else 0.5,
            forward_s=0.2,
            backward_s=0.25,
            optimizer_s=0.05,
            collective_s=0.0,
            collective_calls=0,
            compile_s=0.4 if i % 3 == 0 else 0.0,
            tokens=128,
        )
        for i in range(6)
    )
    report = tl.TimelineReport(
        schema_version=tl.TIMELINE_SCHEMA_VERSION,
        spec="fixtures/timeline/step_counter.toml",
        framework="torchtitan",
        mode="as-is",
        strategy="block",
        backend="aot_eager",
        device="cpu",
        world_size=1,
        torch_version="2.13.0+cpu",
        recompile_limit=8,
        seq_lens=(64,),
        batch_size=2,
        steps=steps,
        frames=(tl.FrameTimeline(frame=frame, cache_size=3, compiles=3, recompile_steps=(3,)),),
        warmup_steps=1,
        findings=(
            tl.TimelineFinding(cause="counter", problem=True, steps=(3,), plain="a counter"),
        ),
        periods=(tl.TimelinePeriod(k=3, offset=0, source="events", amplitude_s=0.4),),
        verdict="every 3rd step recompiles",
    )
    path = tmp_path / "timeline.json"
    path.write_text(dumps(to_jsonable(report)))
    text = render_html([load_document(path)])
    assert "Timeline: fixtures/timeline/step_counter.toml" in text
    assert "every 3 step(s), offset 0" in text and "every 3rd step recompiles" in text
    step_chart = json.loads(re.search(r'id="chart-0">(.*?)</script>', text).group(1))
    assert step_chart["datasets"][0]["data"] == [s.forward_s for s in steps]


def test_plan_and_run_format_html() -> None:
    """``plan --format html`` (``cli.report.plan_printout`` through the format registry, the
    emitted config included) and ``run --format html`` (``render_run``); ``plan`` checks the
    format before any work."""
    from gbdoctor.cli.report import plan_printout
    from gbdoctor.plan.planner import load_plan
    from gbdoctor.report.formats import Printout, render
    from gbdoctor.report.run_formats import render_run

    def plan_html(plan, emitter):
        return render(Printout.PLAN, "html", plan_printout(plan, emitter=emitter))

    page = plan_html(load_plan(GOLDEN / "plan" / "deepspeed_zero2.json"), None)
    assert "Emitted config (deepspeed)" in page and "Plan: fixtures/deepspeed_zero2.toml" in page
    page = plan_html(load_plan(GOLDEN / "plan" / "llama4_debug.json"), "python")
    assert "Emitted config (python)" in page
    assert "Run: fixtures/llama4_debug.toml" in render_run(run_report(), "html")
    result = CliRunner().invoke(app, ["plan", str(FIXTURES / "llama4_debug.toml"), "-f", "yaml"])
    assert result.exit_code == 2 and "valid formats: table, html" in result.output


def test_a_pipeline_plan_page_has_its_stages() -> None:
    """A PP plan's page lists its stages (PP rank, layers, kinds, what else each holds, breaks,
    verified) under the text table's summary line; a plan without PP has no such section."""
    from dataclasses import replace

    from gbdoctor.cli.report import plan_printout
    from gbdoctor.plan.planner import load_plan
    from gbdoctor.records import StagePlan
    from gbdoctor.report.formats import Printout, render

    plan = load_plan(GOLDEN / "plan" / "llama4_debug.json")
    kinds = tuple(k.kind for k in plan.kinds)
    stages = (
        StagePlan(
            stage=0,
            pp_rank=0,
            layers=("layers.0", "layers.1"),
            kinds=kinds,
            modules=("tok_embeddings",),
            breaks_before=3,
            breaks_after=0,
            verified=True,
        ),
        StagePlan(
            stage=1,
            pp_rank=1,
            layers=("layers.2",),
            kinds=kinds[:1],
            modules=("norm", "output"),
            loss=True,
            verified=False,
        ),
    )
    page = render(Printout.PLAN, "html", plan_printout(replace(plan, stages=stages)))
    section = page[page.index("Pipeline stages") :]
    assert "pipeline stages differ (2 stages)" in section
    assert "layers.0-1" in section and "tok_embeddings" in section
    assert "norm, output, the loss" in section and "3 -&gt; 0" in section
    assert "not verified" in section
    plain = render(Printout.PLAN, "html", plan_printout(plan))
    assert "Pipeline stages" not in plain
