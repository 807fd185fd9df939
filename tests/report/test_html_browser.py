"""The HTML report in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``;
skipped with the install command where they are missing; ``.ci/run`` installs them).

Reports of the bundled specs' scans (the golden JSON of ``tests/test_golden.py``), a plan, a
run and a gate load with no console message at all, show as many break rows as the JSON has
distinct breaks, one strip cell per layer, and clicking a layer shows its kind.
``GBDOCTOR_UPDATE_FIXTURES=1`` also rewrites the README's screenshot, docs/img/report.png.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from html_browser import MISSING, Browser
from html_cases import distinct_breaks, run_report
from repo_paths import FIXTURES, REPO

from gbdoctor.report.html import load_document, render_html, run_document

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(MISSING is not None, reason=MISSING or ""),
]

GOLDEN = FIXTURES / "golden"
SCANS = sorted((GOLDEN / "scan").glob("*.json"))
SCREENSHOT = REPO / "docs" / "img" / "report.png"
REAL_RUN = Path(__file__).with_name("test_html_run_llama4_debug.json")
"""``gbdoctor run fixtures/llama4_debug.toml --backend aot_eager --steps 3 --warmup 1 --rounds 2
--format json`` on a busy 2-core machine (its notes say so)."""
README_SCAN = (
    "fixtures/llama4_debug_ep2.toml",
    "--strategy",
    "titan-v0.2.0",
    "--set",
    "activation_checkpoint.mode=none",
    "--format",
    "json",
)
"""The scan the README quotes (its markdown excerpt), which the screenshot shows."""


@pytest.fixture(scope="module")
def browser():
    with Browser() as b:
        yield b


def _open(browser: Browser, text: str, path: Path) -> None:
    path.write_text(text, encoding="utf-8")
    browser.console()  # drop what an earlier page left
    browser.open(path)
    assert browser.run("return document.body.dataset.ready") == "true", "report.js did not finish"


def _no_console_messages(browser: Browser) -> None:
    assert browser.console() == []


@pytest.mark.parametrize("path", SCANS, ids=lambda p: p.stem)
def test_bundled_scan_reports(browser: Browser, path: Path, tmp_path: Path) -> None:
    data = json.loads(path.read_text())
    _open(browser, render_html([load_document(path)], source_roots=[REPO]), tmp_path / "r.html")
    _no_console_messages(browser)
    rows = browser.run("return document.querySelectorAll('.break-row').length")
    assert rows == distinct_breaks(data)
    fqns = browser.run(
        "return [...document.querySelectorAll('.strip .cell')].map(c => c.dataset.fqn)"
    )
    assert fqns == [b["fqn"] for b in data["blocks"]]
    # Clicking the first layer of each kind shows that kind's card, and only it.
    for kind in dict.fromkeys(b["kind"] for b in data["blocks"]):
        index = next(i for i, b in enumerate(data["blocks"]) if b["kind"] == kind)
        browser.click(f".strip .cell:nth-child({index + 1})")
        shown = browser.run(
            "return [...document.querySelectorAll('.kind-card')]"
            ".filter(c => c.offsetParent !== null).map(c => c.querySelector('.kind-name').textContent)"
        )
        assert shown == [kind]
    _no_console_messages(browser)


def test_plan_run_and_gate_in_one_page(browser: Browser, tmp_path: Path) -> None:
    docs = [
        load_document(GOLDEN / "scan" / "llama4_debug_ep2.json"),
        load_document(GOLDEN / "plan" / "llama4_debug.json"),
        load_document(REAL_RUN),
        run_document(run_report()),
        load_document(GOLDEN / "gate" / "debug_specs_and_custom.json"),
    ]
    _open(browser, render_html(docs, source_roots=[REPO]), tmp_path / "all.html")
    _no_console_messages(browser)
    canvases = browser.run("return document.querySelectorAll('canvas[data-chart]').length")
    drawn = browser.run(
        "return [...document.querySelectorAll('canvas[data-chart]')]"
        ".filter(c => Chart.getChart(c) !== undefined).length"
    )
    assert canvases == drawn > 0
    articles = browser.run("return [...document.querySelectorAll('article')].map(a => a.className)")
    assert articles == [
        "doc doc-scan",
        "doc doc-plan",
        "doc doc-run",
        "doc doc-run",
        "doc doc-gate",
    ]


def test_printed_page_shows_every_kind_and_no_navigation(browser: Browser, tmp_path: Path) -> None:
    path = GOLDEN / "scan" / "deepseek_v3_debug_ep2.json"
    kinds = {b["kind"] for b in json.loads(path.read_text())["blocks"]}
    _open(browser, render_html([load_document(path)], source_roots=[REPO]), tmp_path / "p.html")
    visible_cards = (
        "return [...document.querySelectorAll('.kind-card')]"
        ".filter(c => c.offsetParent !== null).map(c => c.dataset.kind)"
    )
    assert browser.run(visible_cards) == []  # on screen: none until a layer is clicked
    browser.media("print")
    try:
        assert set(browser.run(visible_cards)) == kinds
        assert browser.run("return document.querySelector('header nav').offsetParent") is None
        pdf = browser.print_pdf()
    finally:
        browser.media("screen")
    assert pdf.startswith(b"%PDF") and pdf.count(b"/Type /Page") >= 1
    _no_console_messages(browser)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_screenshot(browser: Browser, tmp_path: Path) -> None:
    """The README's picture, a scan of fixtures/llama4_debug_ep2.toml with a MoE layer clicked:
    the README's own scan command when rewriting it (a scan of about a minute), else the golden
    scan of the spec."""
    update = os.environ.get("GBDOCTOR_UPDATE_FIXTURES") == "1"
    path = GOLDEN / "scan" / "llama4_debug_ep2.json"
    if update:
        path = tmp_path / "scan.json"
        subprocess.run(
            [sys.executable, "-m", "gbdoctor", "scan", *README_SCAN, "-o", str(path)],
            check=True,
            cwd=REPO,
        )
    _open(browser, render_html([load_document(path)], source_roots=[REPO]), tmp_path / "s.html")
    browser.click(".strip .cell:nth-child(2)")
    browser.run("document.getElementById('d0').scrollIntoView()")
    browser.resize(1200, 1000)
    shot = tmp_path / "report.png"
    browser.screenshot(shot)
    assert list(_png_size(shot)) == browser.run("return [window.innerWidth, window.innerHeight]")
    if update:
        SCREENSHOT.parent.mkdir(exist_ok=True)
        SCREENSHOT.write_bytes(shot.read_bytes())
    assert SCREENSHOT.is_file(), "make it with GBDOCTOR_UPDATE_FIXTURES=1"
