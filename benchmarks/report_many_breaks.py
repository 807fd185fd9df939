"""``gbdoctor report`` on a scan JSON with very many distinct breaks (issue 45: 600k breaks,
187 MB, ran past 300 s toward a ~0.8 GB page). A script, not a test.

    python benchmarks/report_many_breaks.py [--breaks 600000] [--keep DIR]

Builds the JSON from ``fixtures/scans/llama4_before.json``: its first block holds ``--breaks``
distinct breaks (the fixture's first break, each at its own line and with its own message),
then runs the real CLI (``gbdoctor report FILE -o page.html``) in a subprocess and prints the
JSON's size, the wall time of the command, the page's size, and how many breaks the page shows
in full (``report/html/scan.BREAKS_SHOWN_PER_KIND`` per kind) against how many its JSON twin
keeps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCAN = ROOT / "fixtures" / "scans" / "llama4_before.json"


def many_breaks(count: int, out: Path) -> None:
    data = json.loads(SCAN.read_text())
    block = next(b for b in data["blocks"] if b["breaks"])
    template = block["breaks"][0]
    location = template.get("location") or {"file": "models/model.py", "line": 1}
    block["breaks"] = [
        {
            **template,
            "location": {**location, "line": i + 1},
            "explanation": f"{template.get('explanation', '')} #{i}",
        }
        for i in range(count)
    ]
    out.write_text(json.dumps(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--breaks", type=int, default=600_000)
    parser.add_argument("--keep", type=Path, help="write the JSON and the page here")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="gbdoctor-many-breaks-"))
    folder.mkdir(parents=True, exist_ok=True)
    scan, page = folder / "scan.json", folder / "page.html"
    many_breaks(args.breaks, scan)
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "gbdoctor", "report", str(scan), "-o", str(page)],
        check=True,
        cwd=folder,
    )
    elapsed = time.monotonic() - started
    text = page.read_text()
    shown = text.count('class="gbtype"')
    print(f"breaks in the JSON: {args.breaks} ({scan.stat().st_size / 2**20:.1f} MiB)")
    print(f"gbdoctor report: {elapsed:.1f} s wall")
    print(f"page: {page.stat().st_size / 2**20:.1f} MiB, breaks shown in full: {shown}")


if __name__ == "__main__":
    main()
