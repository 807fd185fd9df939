"""Pipeline parallelism at production size: ``scan``, ``plan`` and ``gate`` on torchtitan
v0.2.2's unmodified ``llama4_17bx128e.toml`` (TP 8 x PP 4, 48 layers, 128 experts) with no
flags (a script, not a test).

    python benchmarks/pp_bench.py [--only scan|plan|gate] [--json FILE]

Each command runs as the CLI a user runs (``python -m gbdoctor ...``, a fresh interpreter, so
imports count and the peak RSS is the command's own), from the repository root. Printed per
command: exit code, wall time, CPU time (user + system: on a shared machine wall time counts
the neighbours), peak RSS (``ru_maxrss`` of the child) and against the targets (60 s and
4 GiB); for ``scan`` also each stage's layers and kinds from its JSON. ``gate`` runs twice: ``--update-baseline`` (writes a baseline keyed by stage) and the
check against it; ``plan`` prints its plan per stage. Each row records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = "fixtures/torchtitan_v0.2.2/llama4_17bx128e.toml"
TARGET_S, TARGET_GIB = 60.0, 4.0


def run(args: list[str]) -> dict:
    """Run ``python -m gbdoctor ARGS`` and measure it (wall time, the child's peak RSS)."""
    cmd = [sys.executable, "-m", "gbdoctor", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy()
    )
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    # Popen already reaped the child: its rusage is in RUSAGE_CHILDREN (max over children).
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_kib = usage.ru_maxrss
    return {
        "command": "gbdoctor " + " ".join(args),
        # The 1-minute load average when the command ended: on shared cores wall time is
        # meaningless without it.
        "load": round(os.getloadavg()[0], 1),
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        # On a loaded machine wall time measures the neighbours; CPU time is the command's own.
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_gib": round(peak_kib / 2**20, 2),
        "stdout": out.decode(errors="replace"),
        "stderr_tail": err.decode(errors="replace")[-400:],
    }


def stages(scan_json: str) -> list[str]:
    data = json.loads(scan_json)
    rows: dict[int, dict[str, list[str]]] = {}
    for block in data["blocks"]:
        rows.setdefault(block["stage"], {}).setdefault(block["kind"], []).append(block["fqn"])
    return [
        f"stage {s}: "
        + "; ".join(f"{kind} x{len(fqns)}" for kind, fqns in kinds.items())
        + f" (layers {min(int(f.split('.')[-1]) for fs in kinds.values() for f in fs)}-"
        + f"{max(int(f.split('.')[-1]) for fs in kinds.values() for f in fs)})"
        for s, kinds in sorted(rows.items())
    ]


def plan_stages(table: str) -> list[str]:
    """The plan's per-stage lines (``all N pipeline stages agree ...`` or one per stage)."""
    lines = table.splitlines()
    start = next((i for i, line in enumerate(lines) if "pipeline stages" in line), None)
    if start is None:
        return []
    out = [lines[start]]
    out += [line for line in lines[start + 1 :] if line.startswith("  stage ")]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("scan", "plan", "gate"))
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        baseline = str(Path(tmp) / "baseline.json")
        commands = {
            "scan": [["scan", SPEC, "--format", "json"]],
            "plan": [["plan", SPEC]],
            "gate": [
                ["gate", SPEC, "--baseline", baseline, "--update-baseline"],
                ["gate", SPEC, "--baseline", baseline],
            ],
        }
        for name, runs in commands.items():
            if opts.only and name != opts.only:
                continue
            for args in runs:
                # RUSAGE_CHILDREN is a maximum over every child so far: one child per process.
                if results:
                    r = _in_fresh_parent(args)
                else:
                    r = run(args)
                if name == "scan" and r["exit"] == 0:
                    r["stages"] = stages(r["stdout"])
                if name == "plan":
                    r["stages"] = plan_stages(r["stdout"])
                ok = r["wall_s"] <= TARGET_S and r["peak_rss_gib"] <= TARGET_GIB
                r["within_targets"] = ok
                print(
                    f"{r['command']}: exit {r['exit']}, {r['wall_s']} s wall, {r['cpu_s']} s CPU, "
                    f"peak RSS {r['peak_rss_gib']} GiB, load {r['load']}"
                    f" ({'within' if ok else 'OVER'} {TARGET_S:.0f} s / {TARGET_GIB:.0f} GiB)"
                )
                for line in r.get("stages", []):
                    print("   ", line)
                if r["exit"] not in (0, 1):
                    print("    stderr:", r["stderr_tail"].strip().splitlines()[-1:])
                r.pop("stdout")
                results.append(r)
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _in_fresh_parent(args: list[str]) -> dict:
    """``run(args)`` from a fresh parent, so that RUSAGE_CHILDREN holds this child alone."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import pp_bench; "
        "print(json.dumps(pp_bench.run(json.loads(sys.argv[2]))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), json.dumps(args)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout)


if __name__ == "__main__":
    sys.exit(main())
