"""Wall time, CPU time and peak RSS of `gbdoctor scan` and `gbdoctor inspect` on the 8 unmodified
torchtitan v0.2.2 configs, with no flags, as a user runs them.

    python benchmarks/production_bench.py [--commands scan,inspect] [--configs NAME,...]
                                          [--timeout 900] [--output FILE.md]

Each command runs in a fresh process (``python -m gbdoctor CMD CONFIG``); its resource usage is
read with ``os.wait4`` (the process and the rank processes it spawned and reaped: peak RSS is
the largest of them, CPU time their sum). The machine's 1-minute load average is recorded before
each command: on a shared machine wall time grows with the load, CPU time much less so. Exit
code 2 (a config refused on purpose) records the one-line error. Prints a markdown table; the
ratio line compares the deepest full-size configs with their debug flavors (same command, same
run of this script).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "fixtures" / "torchtitan_v0.2.2"
DEEPEST = {
    "deepseek_v3_671b.toml": "deepseek_v3_debug_model.toml",
    "llama3_8b.toml": "llama3_debug_model.toml",
}
"""Full-size config -> its debug flavor (61 and 32 layers vs 6)."""


def run_one(command: str, config: Path, timeout: float) -> dict:
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gbdoctor", command, str(config)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    killed = []

    def kill() -> None:
        killed.append(True)
        os.killpg(proc.pid, 9)

    timer = threading.Timer(timeout, kill)
    timer.start()
    stderr = proc.stderr.read()  # until the process (and its ranks) close stderr
    _, status, usage = os.wait4(proc.pid, 0)  # reaps it: usage is this command's alone
    timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    errors = [ln for ln in stderr.splitlines() if ln.startswith("Error: ")]
    return {
        "rc": f"killed at {timeout:.0f} s" if killed else proc.returncode,
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss_gib": usage.ru_maxrss / 2**20,
        "load": load,
        "error": errors[0] if errors else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", default="scan,inspect")
    parser.add_argument(
        "--configs", default=",".join(sorted(p.name for p in CONFIGS.glob("*.toml")))
    )
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    rows = []
    results: dict[tuple[str, str], dict] = {}
    for config in args.configs.split(","):
        for command in args.commands.split(","):
            r = run_one(command, CONFIGS / config, args.timeout)
            results[(command, config)] = r
            cpu = f"{r['cpu']:.1f}" if "cpu" in r else "-"
            rss = f"{r['rss_gib']:.2f}" if "rss_gib" in r else "-"
            row = f"| {config} | {command} | {r['rc']} | {r['wall']:.1f} | {cpu} | {rss} | {r['load']:.1f} | {r.get('error', '')[:90]} |"
            rows.append(row)
            print(row, flush=True)
    lines = [
        f"gbdoctor production configs, {platform.machine()} {os.cpu_count()} CPU(s), python {platform.python_version()}",
        "",
        "| config | command | exit | wall s | CPU s | peak RSS GiB | load (1 min) | error line |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    for full, debug in DEEPEST.items():
        for command in args.commands.split(","):
            a, b = results.get((command, full)), results.get((command, debug))
            if a and b and "cpu" in a and "cpu" in b and b["cpu"] > 0:
                lines.append(
                    f"- {command} {full} / {debug}: wall {a['wall'] / b['wall']:.2f}x, "
                    f"CPU {a['cpu'] / b['cpu']:.2f}x"
                )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
