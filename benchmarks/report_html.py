"""The HTML report of a 48-layer simulated scan: its size and how fast headless Chromium renders
it (a script, not a test). Targets: < 2 MB and < 2 s.

    python benchmarks/report_html.py [--scan FILE.json] [--loads 7] [--keep DIR]

Without ``--scan`` it first scans Llama 4 Maverick (17Bx128E: 48 layers, dense and MoE
interleaved, selective AC on every 3rd layer, so four block kinds) on 64 simulated ranks with EP
8, as ``gbdoctor scan benchmarks/specs/llama4_17bx16e_ep8_w64.toml --simulate --set ...`` does
(not timed here). Then it measures:

- **size**: the page's bytes, and how much of it is the vendored Chart.js and the embedded JSON;
- **make**: ``render_html`` wall time (the source lines are read from this checkout);
- **load**: in one headless Chromium, the page opened ``--loads`` times; per load, the browser's
  own navigation timing (``loadEventEnd``: HTML parsed, styles, scripts and charts done) and the
  wall time of the WebDriver navigation, which returns after the load event; median and min..max.
- **cold**: a fresh Chromium process started, the page loaded once (what opening the file costs
  including the browser's start), wall time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "report"))  # the tests' WebDriver client

from html_browser import MISSING, Browser  # noqa: E402

SPEC = ROOT / "benchmarks" / "specs" / "llama4_17bx16e_ep8_w64.toml"
OVERRIDES = (
    "model.flavor=17bx128e",
    "activation_checkpoint.mode=selective",
    "activation_checkpoint.selective_ac_option=3",
)
TARGET_BYTES, TARGET_S = 2_000_000, 2.0


def make_scan(out: Path) -> None:
    sets = [arg for override in OVERRIDES for arg in ("--set", override)]
    command = [sys.executable, "-m", "gbdoctor", "scan", str(SPEC), "--simulate", *sets]
    subprocess.run([*command, "--format", "json", "-o", str(out)], check=True, cwd=ROOT)


def spread(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.3f} s "
        f"(min {min(values):.3f} .. max {max(values):.3f}, n={len(values)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scan", type=Path, help="a saved scan JSON instead of scanning")
    parser.add_argument("--loads", type=int, default=7)
    parser.add_argument("--keep", type=Path, help="write the scan and the page here")
    args = parser.parse_args()
    if MISSING is not None:
        sys.exit(MISSING)

    from gbdoctor.report.html import load_document, render_html
    from gbdoctor.report.html.page import _chart_js

    work = args.keep or Path(tempfile.mkdtemp(prefix="report_html_"))
    work.mkdir(parents=True, exist_ok=True)
    scan = args.scan or work / "scan48.json"
    if args.scan is None:
        print(f"scanning {SPEC.name} with {', '.join(OVERRIDES)} (simulated) ...", flush=True)
        make_scan(scan)
    doc = load_document(scan)
    blocks = doc.record.blocks  # type: ignore[union-attr]
    kinds = sorted({b.kind for b in blocks})
    print(f"scan: {len(blocks)} layers, kinds {', '.join(kinds)}, JSON {len(doc.json_text):,} B")

    makes = []
    for _ in range(5):
        start = time.perf_counter()
        text = render_html([doc], source_roots=[ROOT])
        makes.append(time.perf_counter() - start)
    page = work / "report48.html"
    page.write_text(text, encoding="utf-8")
    size = len(text.encode())
    chart_js = len(_chart_js().encode())
    print(
        f"size: {size:,} B = {size / 1e6:.3f} MB ({size / TARGET_BYTES:.0%} of the 2 MB target); "
        f"Chart.js {chart_js:,} B, embedded JSON {len(doc.json_text):,} B, "
        f"the rest {size - chart_js - len(doc.json_text):,} B"
    )
    print(f"make (render_html): {spread(makes)}")

    navigation, wall = [], []
    with Browser() as browser:
        for _ in range(args.loads):
            browser.open(ROOT / "README.md")  # leave the page, so the next load is a full one
            start = time.perf_counter()
            browser.open(page)
            wall.append(time.perf_counter() - start)
            assert browser.run("return document.body.dataset.ready") == "true"
            navigation.append(
                browser.run(
                    "return performance.getEntriesByType('navigation')[0].loadEventEnd / 1000"
                )
            )
        errors = browser.console()
        cells = browser.run("return document.querySelectorAll('.strip .cell').length")
        rows = browser.run("return document.querySelectorAll('.break-row').length")
    print(f"load (navigation timing, loadEventEnd): {spread(navigation)}")
    print(f"load (WebDriver navigation wall time): {spread(wall)}")
    start = time.perf_counter()
    with Browser() as browser:
        browser.open(page)
        assert browser.run("return document.body.dataset.ready") == "true"
    cold = time.perf_counter() - start
    print(f"cold (new Chromium process + load): {cold:.3f} s")
    print(f"page: {cells} strip cells, {rows} break rows, {len(errors)} console message(s)")
    worst = max(wall)
    print(
        f"targets: size {'ok' if size < TARGET_BYTES else 'MISSED'} "
        f"({size / TARGET_BYTES:.2f}x), render {'ok' if worst < TARGET_S else 'MISSED'} "
        f"(slowest load {worst:.3f} s = {worst / TARGET_S:.2f}x of 2 s)"
    )


if __name__ == "__main__":
    main()
