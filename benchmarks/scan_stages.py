"""Where a scan's time goes (a benchmark, not a test): the README's command, stage by stage.

The stages are the ones the scan's progress reports (rank 0's, through its pipe to this
process): rank start (spawn, import torch, join the process group), setup (build the model,
apply the training setup), warm-up (one eager step), per block kind its capture, recompile
probe, dedupe proof and records with CUDA-graph readiness; then merging the ranks' records, and
the report (the default table). Each stage lasts until the next message. Run from the
repository root, once with the probe and once without:

    python benchmarks/scan_stages.py                   # the README's spec and overrides
    python benchmarks/scan_stages.py --repeat 2        # medians of 2 runs each

Quote the load average it prints: the numbers move with it (2 cores shared). Beside each
stage's wall seconds it prints the CPU seconds this process and its ranks spent in it (read from
``/proc`` at each progress message; Linux): on a shared machine wall time grows with
the other jobs, CPU time much less, so compare stages and runs by it.
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


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process, its reaped children and its live ranks."""
    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # After the command name (in parentheses): state, ppid, ..., utime, stime.
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # gone between the listing and the read
                continue
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    family = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, (ppid, _) in stats.items() if ppid in family} - family
        family |= found
        grew = bool(found)
    return total + sum(stats[pid][1] for pid in family - {os.getpid()})


def timed_scan(recompiles: bool) -> tuple[dict[str, float], dict[str, float]]:
    """(wall seconds, CPU seconds) per stage of one scan, and the report's."""
    spec = load_spec(SPEC, OVERRIDES)
    marks: list[tuple[float, float, str]] = []
    start, start_cpu = time.perf_counter(), cpu_seconds()
    report = scan(
        spec,
        strategy=STRATEGY,
        recompiles=recompiles,
        progress=lambda message, done, total: marks.append(
            (time.perf_counter(), cpu_seconds(), message)
        ),
    )
    end, end_cpu = time.perf_counter(), cpu_seconds()
    wall: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    for (at, at_cpu, message), (until, until_cpu, _) in zip(
        marks, [*marks[1:], (end, end_cpu, "")]
    ):
        wall[stage_of(message)] += until - at
        cpu[stage_of(message)] += until_cpu - at_cpu
    first, first_cpu = (marks[0][0], marks[0][1]) if marks else (end, end_cpu)
    wall["before the first stage"] = first - start
    cpu["before the first stage"] = first_cpu - start_cpu
    before, before_cpu = time.perf_counter(), cpu_seconds()
    render(report, "table", details=False)
    wall["report"] = time.perf_counter() - before
    cpu["report"] = cpu_seconds() - before_cpu
    wall["total"] = time.perf_counter() - start
    cpu["total"] = cpu_seconds() - start_cpu
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--probe-only", action="store_true", help="only the scan with the probe (the default)"
    )
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    modes = (True,) if args.probe_only else (True, False)
    runs = {probe: [timed_scan(probe) for _ in range(args.repeat)] for probe in modes}
    names = [name for _, name in STAGES] + ["before the first stage", "report", "total"]
    headers = {True: "with probe", False: "without probe"}
    print(
        "| stage | "
        + " | ".join(f"{headers[p]}: wall s | {headers[p]}: CPU s" for p in modes)
        + " |"
    )
    print("|---|" + "---|---|" * len(modes))
    for name in names:
        cells = [
            f"{statistics.median(run[kind].get(name, 0.0) for run in runs[probe]):.1f}"
            for probe in modes
            for kind in (0, 1)
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
