"""Scan-report formatters: registry, goldens, essentials, escaping."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from scan_factory import (
    GOLDEN,
    SCAN_FIXTURES,
    UPDATE,
    data_dependent_break,
    make_block,
    make_break,
    make_report,
)

from gbdoctor.errors import SpecError
from gbdoctor.records import Event, Location
from gbdoctor.report import render
from gbdoctor.report.formats import Printout, RenderOptions, formats_of, renderer_for
from gbdoctor.report.github import command, escape_data, escape_property
from gbdoctor.report.table import recording_console, render_table

EXPECTED_FORMATS = {"table", "json", "markdown", "junit", "github", "html"}


def test_every_format_name_has_a_formatter() -> None:
    assert set(formats_of(Printout.SCAN)) == EXPECTED_FORMATS
    report = SCAN_FIXTURES["llama4_before"]()
    for name in formats_of(Printout.SCAN):
        renderer = renderer_for(Printout.SCAN, name)
        assert renderer(report, RenderOptions()) == render(report, name)


def test_unknown_format_is_bad_input() -> None:
    with pytest.raises(SpecError, match="unknown format 'yaml'") as err:
        render(SCAN_FIXTURES["llama4_before"](), "yaml")
    assert "table" in (err.value.hint or "")


# json: fixtures/scans are its goldens; html: tests/report/test_html*.py (it quotes the source
# files at report time, and inlines a 200 kB chart library).
@pytest.mark.parametrize("fmt", sorted(EXPECTED_FORMATS - {"json", "html"}))
def test_golden(fixture_name: str, fmt: str) -> None:
    text = render(SCAN_FIXTURES[fixture_name](), fmt)
    path = GOLDEN / f"{fixture_name}.{fmt}"
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), (
        f"regenerate with GBDOCTOR_UPDATE_FIXTURES=1 ({path})"
    )


@pytest.mark.parametrize("fmt", sorted(EXPECTED_FORMATS))
def test_renders_are_deterministic_and_plain(fixture_name: str, fmt: str) -> None:
    text = render(SCAN_FIXTURES[fixture_name](), fmt)
    assert text == render(SCAN_FIXTURES[fixture_name](), fmt)
    assert "\x1b" not in text
    assert text.endswith("\n")


ESSENTIALS = {
    "table": (
        "data-dependent",
        "fsdp-hook",
        "GB0036",
        "moe.py:142",
        "moe.py:88",
        "layers.1, 3",
        "capture_scalar_outputs=True",
        "titan-v0.2.0",
        "compile each block",
    ),
    "markdown": (
        "`data-dependent`",
        "`fsdp-hook`",
        "GB0036",
        "`moe.py:142`",
        "layers.1, 3",
        "| moe | layers.1, 3 | 4 | 3 | 0 | data-dependent, fsdp-hook |",
    ),
    "junit": (
        'type="data-dependent"',
        'type="fsdp-hook"',
        "gbdoctor/models/moe.py:142",
        'classname="moe"',
        'name="layers.3"',
        "fix: compile each block",
    ),
    "github": (
        "file=gbdoctor/models/moe.py,line=142,title=graph break%3A data-dependent GB0036::",
        "file=gbdoctor/models/moe.py,line=88,title=graph break%3A fsdp-hook GB0098::",
    ),
    "json": (
        '"cause": "data-dependent"',
        '"file": "gbdoctor/models/moe.py"',
        '"line": 142',
        '"totals": {',
    ),
}


@pytest.mark.parametrize("fmt", sorted(ESSENTIALS))
def test_essentials(fmt: str) -> None:
    text = render(SCAN_FIXTURES["llama4_after_new_break"](), fmt)
    for needle in ESSENTIALS[fmt]:
        assert needle in text, needle


def test_events_are_shown() -> None:
    report = SCAN_FIXTURES["llama4_region_eager"]()
    for fmt in ("table", "markdown", "junit", "github"):
        assert "region_eager" in render(report, fmt), fmt
    github = render(report, "github")
    assert "::error file=gbdoctor/models/moe.py,line=88,title=gbdoctor%3A region_eager::" in github


def test_junit_parses_one_testcase_per_block_with_failures() -> None:
    report = SCAN_FIXTURES["llama4_after_new_break"]()
    root = ET.fromstring(render(report, "junit"))
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [report.spec]
    cases = suites[0].findall("testcase")
    assert [(c.get("name"), c.get("classname")) for c in cases] == [
        (b.fqn, b.kind) for b in report.blocks
    ]
    assert suites[0].get("tests") == "4" and suites[0].get("failures") == "2"
    failures = [f for c in cases for f in c.findall("failure")]
    assert sorted(f.get("type") for f in failures) == ["data-dependent"] * 2 + ["fsdp-hook"] * 4
    assert list(failures[0].attrib) == ["type", "message"]  # deterministic attribute order


def test_junit_survives_control_characters() -> None:
    brk = make_break(gb_type="weird \x00\x1b gb_type")
    report = make_report((make_block("layers.0", "dense", breaks=(brk,)),))
    ET.fromstring(render(report, "junit"))


def test_github_escaping_rules() -> None:
    assert escape_data("50% a\r\nb:c,d") == "50%25 a%0D%0Ab:c,d"
    assert escape_property("50% a\r\nb:c,d") == "50%25 a%0D%0Ab%3Ac%2Cd"
    line = command(
        "warning", "x%\ny", title="t: a,b", location=Location(file="we,ird:dir/m.py", line=7)
    )
    assert line == "::warning file=we%2Cird%3Adir/m.py,line=7,title=t%3A a%2Cb::x%25%0Ay"
    assert command("error", "m") == "::error::m"


def test_github_one_command_per_line_and_no_location_break() -> None:
    brk = make_break("unsupported", gb_type="Unsupported method call", gb_id=None, file=None)
    report = make_report((make_block("layers.0", "dense", breaks=(brk,)),))
    lines = render(report, "github").splitlines()
    assert lines[0].startswith(
        "::warning title=graph break%3A unsupported::dense blocks (layers.0): "
    )
    assert all(line.startswith("::") for line in lines)


def _clean_report():
    return make_report(
        (make_block("layers.0", "dense"), make_block("layers.1", "dense", same_as="layers.0"))
    )


def test_all_clean_line() -> None:
    report = _clean_report()
    assert "All clean: 2 block(s), 2 graph(s), no graph breaks." in render(report, "table")
    assert "**All clean**" in render(report, "markdown")
    assert "all clean" in render(report, "github")
    assert ET.fromstring(render(report, "junit")).find(".//failure") is None


def test_error_blocks_are_reported_everywhere() -> None:
    report = make_report(
        (make_block("layers.0", "dense", error="RuntimeError: grouped_mm needs bf16"),)
    )
    table = render(report, "table")
    assert "RuntimeError: grouped_mm needs bf16" in table and "error" in table
    assert "grouped_mm needs bf16" in render(report, "markdown")
    failure = ET.fromstring(render(report, "junit")).find(".//failure")
    assert failure is not None and failure.get("type") == "error"
    assert render(report, "github").startswith("::error title=gbdoctor%3A block error::")


def test_markdown_escapes_pipes_and_html() -> None:
    brk = make_break("unsupported", gb_type="a | b <lambda>", gb_id=None)
    text = render(make_report((make_block("layers.0", "dense", breaks=(brk,)),)), "markdown")
    assert "a \\| b &lt;lambda>" in text


def test_table_does_not_interpret_markup() -> None:
    brk = make_break("unsupported", gb_type="[bold]not markup[/bold]", gb_id=None)
    text = render(make_report((make_block("layers.0", "dense", breaks=(brk,)),)), "table")
    assert "[bold]not" in text and "[/bold]" in text


def test_render_table_prints_to_the_given_console() -> None:
    console = recording_console()
    render_table(
        make_report((make_block("layers.0", "moe", breaks=(data_dependent_break(),)),)), console
    )
    assert "data-dependent" in console.export_text()


def test_events_without_location() -> None:
    event = Event(
        kind="frame_skipped",
        module="layers.0",
        detail="the compiled region ran without producing a graph",
    )
    report = make_report((make_block("layers.0", "dense", events=(event,), graph_count=0),))
    assert "frame_skipped" in render(report, "table")
    assert "::error title=gbdoctor%3A frame_skipped::" in render(report, "github")


@pytest.mark.parametrize(
    ("framework", "measurable"), [("torchtitan", True), ("torchtitan-installed", False)]
)
def test_plan_table_says_how_to_use_cudagraph_ready_kinds_per_framework(framework, measurable):
    """The python emitter takes cudagraphs=True for any plan; ``run --modes cudagraphs`` is named
    only where the plan's framework has that run mode."""
    from plan_factory import make_plan

    from gbdoctor.frameworks.registry import framework_named
    from gbdoctor.records import KindPlan
    from gbdoctor.report.plan_table import render_plan_table

    kind = KindPlan(
        kind="dense",
        layers=("layers.0",),
        mode="block",
        fullgraph=True,
        cudagraph_ready=True,
        cudagraphs="ready",
    )
    plan = make_plan(kind, framework=framework)
    text = " ".join(render_plan_table(plan).split())
    assert "`--emit-config python` code takes cudagraphs=True" in text
    assert ("--modes plan,cudagraphs" in text) is measurable
    assert ("cudagraphs" in framework_named(framework).run_modes.modes) is measurable
