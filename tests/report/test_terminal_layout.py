"""The terminal report a person reads (issue 46): the answer first, in one screen of 100
columns, details on request, and no name only Dynamo would write, in any format.

Rendered from the committed golden scans (``fixtures/golden/scan/``: real CLI output, pinned by
``tests/test_golden.py``), so these tests run no scan. ``llama4_debug_ep2_readme`` is the README's
own command with the recompile probe on.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from repo_paths import FIXTURES
from scan_factory import GOLDEN, UPDATE, make_block, make_report

from gbdoctor.causes.generated_names import has_generated_name, user_function, user_names
from gbdoctor.causes.guards import guard_in_words
from gbdoctor.records import CudaGraphFinding, CudaGraphReadiness, Recompile
from gbdoctor.report import render
from gbdoctor.report.formats import Printout, formats_of
from gbdoctor.report.json import load_scan_json
from gbdoctor.report.layout import fit_path, location_label, one_line
from gbdoctor.report.table_details import MODULE_WIDTH, WHERE_WIDTH
from gbdoctor.summary import summarize, with_user_names

GOLDEN_SCANS = sorted((FIXTURES / "golden" / "scan").glob("*.json"))
README_SCAN = FIXTURES / "golden" / "scan" / "llama4_debug_ep2_readme.json"
GENERATED = ("torch_dynamo_resume", "___stack", "l_self_")
COLUMNS = 100


def _lines(text: str) -> list[str]:
    return text.splitlines()


@pytest.fixture(scope="module")
def readme_scan():
    return load_scan_json(README_SCAN)


def test_the_readme_command_fits_one_screen_with_the_breaks_first(readme_scan) -> None:
    text = render(readme_scan, "table", details=False, width=COLUMNS)
    lines = _lines(text)
    assert len(lines) <= 40, text
    assert all(len(line) <= COLUMNS for line in lines), text
    assert lines[0].startswith("gbdoctor scan: 9 graph break(s)"), lines[0]
    breaks = text.index("Graph breaks (9 over all layers")
    assert breaks < text.index("Recompiles (probe)") < text.index("CUDA graphs (optional)")
    assert "Details: --details" in lines[-1] or "Details: --details" in lines[-2]
    # The details stay behind the flag.
    assert "Recompiles when a block runs again" not in text
    assert "readiness per block kind" not in text
    # Every distinct break is there with its location and fix, each fix once.
    summary = summarize(readme_scan)
    for row in summary.kinds:
        for brk in row.break_records:
            assert location_label(brk.location, WHERE_WIDTH) in text
    flat = one_line(text)
    assert flat.count("fix ep-dispatch") == 1 and flat.count("fix fsdp-hook") == 1


def test_the_default_layout_is_pinned(readme_scan) -> None:
    text = render(readme_scan, "table", details=False, width=COLUMNS)
    path = GOLDEN / "llama4_debug_ep2_readme.table"
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), (
        f"regenerate with GBDOCTOR_UPDATE_FIXTURES=1 ({path})"
    )


def test_details_print_every_finding_and_each_explanation_once(readme_scan) -> None:
    report = with_user_names(readme_scan)
    text = render(report, "table", details=True, width=COLUMNS)
    assert all(len(line) <= COLUMNS for line in _lines(text)), text
    # Wide enough that no table cell wraps (a wrapped cell interleaves with its neighbours).
    flat = one_line(render(report, "table", details=True, width=1000))
    summary = summarize(report)
    for row in summary.kinds:
        assert row.cudagraphs is not None
        assert one_line(row.cudagraphs.summary) in flat
        for group in row.cudagraph_notable:
            assert one_line(group.reason) in flat, group.reason
            # Once per kind, however many graphs share it (FSDP2's release: 4 in a moe block).
            assert flat.count(
                f"{group.finding.kind} ({group.finding.effect}): {one_line(group.reason)}"
            ) <= len(summary.kinds)
            for subject in group.subjects:
                assert subject in flat
        for rec in row.recompiles:
            assert one_line(rec.reason) in flat, rec.reason
    released = "a parameter whose memory the setup frees after each step"
    assert flat.count(released) == 2  # once per kind; the table printed it 5 times
    assert "Totals: 9 break(s)" in flat


@pytest.mark.parametrize("path", GOLDEN_SCANS, ids=lambda p: p.stem)
def test_every_column_fits_100_columns_and_no_path_is_cut(path: Path) -> None:
    report = load_scan_json(path)
    summary = summarize(report)
    for details in (False, True):
        text = render(report, "table", details=details, width=COLUMNS)
        lines = _lines(text)
        assert all(len(line) <= COLUMNS for line in lines), (details, text)
        for row in summary.kinds:
            for brk in row.break_records:
                where = location_label(brk.location, WHERE_WIDTH)
                module = fit_path(brk.module, MODULE_WIDTH, sep=".")
                assert any(where in line and module in line for line in lines), (where, module)


@pytest.mark.parametrize("path", GOLDEN_SCANS, ids=lambda p: p.stem)
def test_no_generated_name_in_any_format_of_any_golden(path: Path) -> None:
    report = load_scan_json(path)
    assert not any(name in path.read_text(encoding="utf-8") for name in GENERATED), path
    for fmt in formats_of(Printout.SCAN):
        for details in (False, True):
            text = render(report, fmt, details=details)
            found = [name for name in GENERATED if name in text]
            assert not found, (fmt, found)


def _report_with_generated_names():
    block = make_block("layers.0", "dense")
    recompile = Recompile(
        step=1,
        measured=True,
        function="torch_dynamo_resume_in_forward_at_257 at gbdoctor/models/moe.py:257",
        reason="tensor '___stack0' size mismatch at index 1. expected 64, actual 32",
    )
    finding = CudaGraphFinding(
        kind="released-static-input",
        effect="blocks",
        region="layers.0",
        graph="forward 0",
        node="primals_1",
        target="primals_1",
        detail="l_self_modules_feed_forward_modules_w3_parameters_weight_: released",
        location=None,
    )
    ready = CudaGraphReadiness(
        status="blocked", summary="blocked by released-static-input (1)", findings=(finding,)
    )
    block = replace(block, recompiles=(recompile,), cudagraphs=ready)
    report = make_report((block,))
    return replace(report, setup=replace(report.setup, probed_recompiles=True))


def test_the_check_can_fail_and_every_format_maps_the_names() -> None:
    report = _report_with_generated_names()
    raw = str(report)
    assert all(name in raw for name in GENERATED)  # the record keeps Dynamo's words
    for fmt in formats_of(Printout.SCAN):
        text = render(report, fmt)
        assert not [name for name in GENERATED if name in text], fmt
    table = render(report, "table", details=True, width=1000)
    assert "self.feed_forward.w3.weight" in table
    assert "value 0 carried across the break" in table
    assert "gbdoctor/models/moe.py:257" in table  # the recompile's location, from its code


def test_names_guards_and_paths_in_plain_words() -> None:
    assert user_function("torch_dynamo_resume_in_torch_dynamo_resume_in_f_at_3_at_9") == "f"
    assert user_names(
        "l_args_0_ and l_self_dict_modules__checkpoint_wrapped_module_modules_w1_parameters_weight_"
    ) == ("args[0] and self.w1.weight")
    assert not has_generated_name("self.w1.weight == 3")
    assert guard_in_words("tensor 'x' size mismatch at index 1. expected 64, actual 32") == (
        "the size of x (dim 1) changed: 64 -> 32"
    )
    assert guard_in_words("self.input_splits[0] == 63") == (
        "the value of self.input_splits[0] changed (was 63)"
    )
    assert guard_in_words("something new") == "something new"
    assert fit_path("gbdoctor/models/decoder.py:47", 24) == "\u2026/models/decoder.py:47"
    assert fit_path("gbdoctor/models/decoder.py:47", 40) == "gbdoctor/models/decoder.py:47"
    assert fit_path("layers.0.self_attn.q_proj", 18, sep=".") == "\u2026self_attn.q_proj"
    assert len(fit_path("a/very_long_file_name_indeed.py:1", 12)) == 12
