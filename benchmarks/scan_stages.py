"""Where a scan's time goes (a benchmark, not a test): the README's command, stage by stage.

The stages are the ones the scan's progress reports (rank 0's, through its pipe to this
process): rank start (spawn, import torch, join the process group), setup (build the model,
apply the training setup), warm-up (one eager step), per block kind its capture, recompile
probe, dedupe proof and records with CUDA-graph readiness; then merging the ranks' records, and
the report (the default table). Each stage lasts until the next message. Run from the
repository root, once with the probe and once without:

    python benchmarks/scan_stages.py                   # the README's spec and overrides
    python benchmarks/scan_stages.py --repeat 2        # medians of 2 runs each

Quote the load average it prints: the numbers move with it (2 cores shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

from gbdoctor.report import render
from gbdoctor.scan import scan
from gbdoctor.spec import load_spec

SPEC = "fixtures/llama4_debug_ep2.toml"
OVERRIDES = ["activation_checkpoint.mode=none"]
STRATEGY = "titan-v0.2.0"
STAGES = (
    ("starting", "rank start"),
    ("setup:", "setup"),
    ("warm-up", "warm-up"),
    (": capture (", "capture"),
    ("recompile probe", "probe"),
    ("proving", "dedupe proof"),
    ("readiness", "records + readiness"),
    ("captured", "merge ranks"),
)


def stage_of(message: str) -> str:
    return next((name for needle, name in STAGES if needle in message), "other")


def timed_scan(recompiles: bool) -> dict[str, float]:
    """Seconds per stage of one scan, and the report's."""
    spec = load_spec(SPEC, OVERRIDES)
    marks: list[tuple[float, str]] = []
    start = time.perf_counter()
    report = scan(
        spec,
        strategy=STRATEGY,
        recompiles=recompiles,
        progress=lambda message, done, total: marks.append((time.perf_counter(), message)),
    )
    end = time.perf_counter()
    seconds: dict[str, float] = defaultdict(float)
    for (at, message), (until, _) in zip(marks, [*marks[1:], (end, "")]):
        seconds[stage_of(message)] += until - at
    seconds["before the first stage"] = marks[0][0] - start if marks else end - start
    before = time.perf_counter()
    render(report, "table", details=False)
    seconds["report"] = time.perf_counter() - before
    seconds["total"] = time.perf_counter() - start
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    runs = {probe: [timed_scan(probe) for _ in range(args.repeat)] for probe in (True, False)}
    names = [name for _, name in STAGES] + ["before the first stage", "report", "total"]
    print("| stage | with probe (s) | without probe (s) |")
    print("|---|---|---|")
    for name in names:
        cells = [
            f"{statistics.median(run.get(name, 0.0) for run in runs[probe]):.1f}"
            for probe in (True, False)
        ]
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
