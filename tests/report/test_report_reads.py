"""What a report may read and what a hostile scan JSON cannot do to its page (issue 45).

- Source lines come only from the roots the person running the command chose (``--source-root``,
  the working directory, the results' folders, the scans' spec roots inside those) and the
  installed packages: a location that is absolute, escapes with ``..``, is a symlink out of a
  root, a procfs/device/FIFO entry or not a Python file is shown as text without source. The leak
  test plants a canary in the environment and a readable file outside the roots.
- The JSON embedded in the page escapes ``<``, ``>``, ``&``, U+2028 and U+2029, so no string can
  end or comment out the page's scripts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import in_process
from repo_paths import FIXTURES, REPO

SCAN = FIXTURES / "scans" / "llama4_before.json"
CANARY = "GBDOCTOR_LEAK_CANARY_5f3a9c"


def gbdoctor(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter: the leak test's canary must be in the environment the process
    started with, which is what ``/proc/self/environ`` shows (``os.environ`` changed in this
    process is not)."""
    return subprocess.run(
        [sys.executable, "-m", "gbdoctor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )


def _hostile_locations(outside: Path, work: Path) -> list[str]:
    """Break locations naming files a report must never show."""
    (work / "models").mkdir()
    (work / "models" / "link.py").symlink_to(outside)
    (work / ".hidden").mkdir()
    (work / ".hidden" / "secret.py").write_text(f"TOKEN = '{CANARY}-hidden'\n")
    return [
        "/proc/self/environ",
        "/etc/passwd",
        str(outside),
        "../" * 12 + str(outside).lstrip("/"),
        "proc/self/environ",
        "etc/passwd",
        "models/link.py",
        ".hidden/secret.py",
        "<site-packages>/../../../../../../../../../../../etc/passwd",
    ]


def _crafted_scan(path: Path, files: list[str]) -> None:
    data = json.loads(SCAN.read_text())
    breaks = [b for block in data["blocks"] for b in block["breaks"] if b.get("location")]
    assert len(breaks) >= 1
    template = breaks[0]
    block = next(block for block in data["blocks"] if template in block["breaks"])
    block["breaks"] = [
        {**template, "location": {**template["location"], "file": f, "line": 1}} for f in files
    ]
    path.write_text(json.dumps(data))


def test_a_crafted_scan_json_leaks_no_local_file_into_any_report(tmp_path: Path) -> None:
    outside = tmp_path / "outside" / "secret.txt"
    outside.parent.mkdir()
    outside.write_text(f"{CANARY}-file\n")
    work = tmp_path / "work"
    work.mkdir()
    scan = work / "scan.json"
    _crafted_scan(scan, _hostile_locations(outside, work))
    passwd_first = Path("/etc/passwd").read_text().splitlines()[0]
    env = {CANARY: f"{CANARY}-env"}

    report = gbdoctor("report", str(scan), "-o", str(work / "report.html"), cwd=work, **env)
    assert report.returncode == 0, report.stderr
    baseline = work / "baseline.json"
    update = gbdoctor("gate", "--scan", str(scan), "--baseline", str(baseline),
                      "--update-baseline", cwd=work, **env)  # fmt: skip
    assert update.returncode == 0, update.stderr
    pages = {"report": work / "report.html", "gate": work / "gate.html"}
    gate = gbdoctor("gate", "--scan", str(scan), "--baseline", str(baseline), "--html",
                    str(pages["gate"]), "--format", "markdown", "-o", str(work / "gate.md"),
                    cwd=work, **env)  # fmt: skip
    assert gate.returncode == 0, gate.stderr
    outputs = {**pages, "markdown": work / "gate.md"}
    for name, path in outputs.items():
        text = path.read_text()
        assert CANARY not in text, name
        assert passwd_first not in text, name
        # Every hostile location is still named, as text: the reader sees where the break was.
        if name != "markdown":
            assert "/proc/self/environ" in text and "models/link.py" in text, name
            assert '<pre class="src">' not in text, name


def test_a_location_inside_the_roots_still_shows_its_source(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    (work / "models" / "net.py").write_text("import torch\n\nx = 'the line of the break'\n")
    scan = work / "scan.json"
    _crafted_scan(scan, ["models/net.py", "torch/nn/modules/module.py"])
    data = json.loads(scan.read_text())
    for block in data["blocks"]:
        for brk in block["breaks"]:
            if brk["location"]["file"] == "models/net.py":
                brk["location"]["line"] = 3
    scan.write_text(json.dumps(data))
    out = tmp_path / "page.html"
    result = in_process("report", str(scan), "-o", str(out), cwd=work)  # tests/cli_runs.py
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "the line of the break" in text
    # The installed packages are a root: torch's own file shows its first line.
    import torch.nn.modules.module as module

    first = Path(module.__file__).read_text().splitlines()[0]
    assert text.count('<pre class="src">') == 2 and first.strip()[:20] in text


@pytest.mark.parametrize("hostile", ["<!--<script>", "</script><script>alert(1)</script>",
                                     "a\u2028b\u2029c & <b>"])  # fmt: skip
def test_no_string_in_the_embedded_json_can_stop_the_page_script(
    tmp_path: Path, hostile: str
) -> None:
    from gbdoctor.report.html import load_document, render_html

    data = json.loads(SCAN.read_text())
    brk = next(b for block in data["blocks"] for b in block["breaks"])
    brk["explanation"] = hostile
    data["spec"] = hostile
    path = tmp_path / "scan.json"
    path.write_text(json.dumps(data))
    text = render_html([load_document(path)])
    scripts = re.findall(r'<script type="application/json" id="([\w-]+)">(.*?)</script>', text)
    assert scripts  # the JSON twin, and any chart data
    for ident, body in scripts:
        for raw in "<>&\u2028\u2029":
            assert raw not in body, f"{raw!r} inside the script element {ident}"
    # The JSON twin still reads back as the same document; the scripts after it are intact.
    twin = next(body for ident, body in scripts if ident.startswith("twin"))
    assert json.loads(twin)["spec"] == hostile
    assert text.count("<script>") == 2 and text.endswith("</script></body></html>\n")


def test_a_kind_with_very_many_breaks_shows_the_first_ones_and_keeps_all_in_the_json(
    tmp_path: Path,
) -> None:
    from gbdoctor.report.html import load_document, render_html
    from gbdoctor.report.html.scan import BREAKS_SHOWN_PER_KIND

    count = BREAKS_SHOWN_PER_KIND + 250
    data = json.loads(SCAN.read_text())
    block = next(block for block in data["blocks"] if block["breaks"])
    template = block["breaks"][0]
    block["breaks"] = [
        {**template, "location": {**template["location"], "line": i + 1}, "explanation": f"b{i}"}
        for i in range(count)
    ]
    path = tmp_path / "scan.json"
    path.write_text(json.dumps(data))
    text = render_html([load_document(path)])
    assert text.count('class="gbtype"') == BREAKS_SHOWN_PER_KIND
    assert f"and 250 more distinct break(s) of {block['kind']}" in text
    twin = re.search(r'<script type="application/json" id="twin-\d+">(.*?)</script>', text)
    assert twin is not None
    kept = next(b for b in json.loads(twin.group(1))["blocks"] if b["breaks"])["breaks"]
    assert len(kept) == count
