"""Gate-result formatters: registry, verdicts, annotations at the new break's file:line."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest
from scan_factory import GOLDEN, UPDATE, llama4_after_new_break, llama4_before

from gbdoctor.errors import SpecError
from gbdoctor.gate import baseline_from_reports, check_gate
from gbdoctor.report import render_gate
from gbdoctor.report.formats import Printout, formats_of


def failing():
    return check_gate([llama4_after_new_break()], baseline_from_reports([llama4_before()]))


def passing():
    old = replace(llama4_after_new_break(), torch_version="2.12.0")
    return check_gate([llama4_before()], baseline_from_reports([old]))


def test_every_gate_format_name_has_a_formatter() -> None:
    assert set(formats_of(Printout.GATE)) == {
        "table",
        "json",
        "markdown",
        "junit",
        "github",
        "html",
    }
    for name in formats_of(Printout.GATE):
        assert render_gate(failing(), name).endswith("\n")
    with pytest.raises(SpecError, match="unknown format"):
        render_gate(failing(), "yaml")


@pytest.mark.parametrize(
    "fmt", sorted(set(formats_of(Printout.GATE)) - {"html"})
)  # html: test_html*.py
@pytest.mark.parametrize("case", ["failing", "passing"])
def test_gate_golden(fmt: str, case: str) -> None:
    text = render_gate({"failing": failing, "passing": passing}[case](), fmt)
    assert "\x1b" not in text
    path = GOLDEN / f"gate_{case}.{fmt}"
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), (
        f"regenerate with GBDOCTOR_UPDATE_FIXTURES=1 ({path})"
    )


def test_table_names_verdict_kind_cause_and_location() -> None:
    text = render_gate(failing(), "table")
    for needle in ("FAILED", "regression", "moe", "data-dependent", "moe.py:142"):
        assert needle in text
    assert "PASSED" in render_gate(passing(), "table")


def test_github_annotates_the_new_break() -> None:
    lines = render_gate(failing(), "github").splitlines()
    assert lines[0].startswith(
        "::error file=gbdoctor/models/moe.py,line=142,"
        "title=gbdoctor gate%3A moe%3A new cause data-dependent (breaks 0 -> 1)::"
    )
    assert lines[-1].startswith("::error title=gbdoctor gate::FAILED")
    ok = render_gate(passing(), "github").splitlines()
    assert not any(line.startswith("::error") for line in ok)
    assert any(line.startswith("::warning title=gbdoctor gate%3A torch version") for line in ok)


def test_junit_has_a_failure_for_the_regression_only() -> None:
    root = ET.fromstring(render_gate(failing(), "junit"))
    failures = root.findall(".//failure")
    assert [f.get("message") for f in failures] == ["new cause data-dependent (breaks 0 -> 1)"]
    moe = root.find(".//testcase[@name='moe']")
    assert moe is not None and moe.find("system-out") is not None  # the graph-count info
    assert root.get("failures") == "1"
    assert ET.fromstring(render_gate(passing(), "junit")).find(".//failure") is None


def test_json_is_stable_and_has_the_verdict() -> None:
    text = render_gate(failing(), "json")
    assert text == render_gate(failing(), "json")
    data = json.loads(text)
    assert data["passed"] is False and data["exit_code"] == 1
    assert data["counts"]["regression"] == 1
    assert data["findings"][0]["locations"] == [
        {"file": "gbdoctor/models/moe.py", "function": "forward", "line": 142}
    ]


def test_markdown_marks_failing_rows() -> None:
    text = render_gate(failing(), "markdown")
    assert text.startswith("## gbdoctor gate: FAILED")
    assert (
        "| fail | regression | fixtures/llama4_debug_ep2.toml | moe | new cause data-dependent"
        in text
    )
    assert "--update-baseline" in text


@pytest.mark.parametrize("fmt", ["table", "markdown", "github", "junit"])
def test_diff_renders_the_same_result_under_its_own_name(fmt: str) -> None:
    """``gbdoctor diff`` applies the gate's rules but is not the gate: every header, annotation
    and suite name says ``gbdoctor diff``; the findings are the gate's, unchanged."""
    gate_text = render_gate(failing(), fmt)
    diff_text = render_gate(failing(), fmt, title="gbdoctor diff")
    assert "gbdoctor diff" in diff_text and "gbdoctor gate" not in diff_text.replace(
        "gbdoctor gate SPEC", ""
    )
    assert diff_text == gate_text.replace("gbdoctor gate", "gbdoctor diff").replace(
        "gbdoctor diff SPEC", "gbdoctor gate SPEC"
    )


def test_diff_cli_header_names_diff(tmp_path) -> None:
    from typer.testing import CliRunner

    from gbdoctor.cli import app
    from gbdoctor.report import render

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(render(llama4_before(), "json"))
    new.write_text(render(llama4_before(), "json"))
    result = CliRunner().invoke(app, ["diff", str(old), str(new)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("gbdoctor diff: PASSED")


def test_the_gate_table_counts_its_informational_findings_unless_details() -> None:
    result = failing()
    info = [f for f in result.findings if f.severity == "info" and not result.fails(f)]
    assert info, "the fixture has an informational finding (the check can fail)"
    full = render_gate(result, "table")
    short = render_gate(result, "table", details=False)
    assert all(f.what in " ".join(full.split()) for f in info)
    assert not any(f.what in " ".join(short.split()) for f in info)
    assert f"{len(info)} informational change(s): --details (-v)" in short
    # What fails the gate and the verdict stay.
    assert "FAILED" in short and result.headline in " ".join(short.split())
    for f in result.findings:
        if result.fails(f):
            assert f.severity in short
