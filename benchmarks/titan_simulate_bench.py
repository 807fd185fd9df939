"""Simulated scans of torchtitan 0.3's full-size configs: wall time and peak RSS (a script, not a test).

    python benchmarks/titan_simulate_bench.py [--only NAME] [--json FILE]

Each run is the command a user types, ``gbdoctor scan --torchtitan MODULE:CONFIG --simulate
--compile.enable [overrides]``, in a fresh process under ``/usr/bin/time -v`` (wall clock and
maximum resident set size of the whole process, imports included), against the targets: 60 s
and 4 GiB per config. Each row also says what the scan found (blocks per kind, graphs and
breaks of each kind's representative) or the one-line refusal, and the 1-minute load average
before it started (the machine is shared: times are upper bounds).

The overrides are only what each config needs to simulate here: ``--compile.enable`` (the
configs ship with block compile off or loss-only), ``--compile.components model,loss`` where the
config compiles the loss only, ``--training.disable_cuda_graphs`` where EP is added (torchtitan
refuses its CUDA-graph step with a CPU-synchronizing token dispatcher), and
``--parallelism.spmd_backend partial_dtensor`` where the run has more than one rank (torch 2.13's FSDP2 refuses torchtitan's default ``spmd_types`` there;
``docs/torchtitan.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTIAL = ("--parallelism.spmd_backend", "partial_dtensor")
MODEL_TOO = ("--compile.components", "model,loss")
TRAIN_SHAPE = ("--set", "gbdoctor.batch_size=4", "--set", "gbdoctor.seq_len=4096")
RUNS: dict[str, tuple[str, ...]] = {
    "llama3_8b": ("llama3:llama3_8b",),
    "llama3_8b-w8": ("llama3:llama3_8b", "--world-size", "8", *PARTIAL),
    "llama3_70b": ("llama3:llama3_70b", *PARTIAL),
    "llama3_405b": ("llama3:llama3_405b", *PARTIAL),
    "qwen3_32b": ("qwen3:qwen3_32b",),
    "qwen3_30b_a3b": ("qwen3:qwen3_30b_a3b",),
    "qwen3_30b_a3b-w8-ep8": (
        "qwen3:qwen3_30b_a3b",
        "--world-size",
        "8",
        "--parallelism.expert_parallel_degree",
        "8",
        "--training.disable_cuda_graphs",
        *PARTIAL,
    ),
    "deepseek_v3_16b": ("deepseek_v3:deepseek_v3_16b", *MODEL_TOO, *PARTIAL),
    "deepseek_v3_671b": ("deepseek_v3:deepseek_v3_671b", *MODEL_TOO, *PARTIAL),
    # At the config's training shape (4 x 4096) instead of the 2 x 64 capture shape.
    "deepseek_v3_16b-4x4096": (
        "deepseek_v3:deepseek_v3_16b",
        *MODEL_TOO,
        *PARTIAL,
        *TRAIN_SHAPE,
    ),
    "deepseek_v3_671b-4x4096": (
        "deepseek_v3:deepseek_v3_671b",
        *MODEL_TOO,
        *PARTIAL,
        *TRAIN_SHAPE,
    ),
    "gpt_oss_20b": ("gpt_oss:gpt_oss_20b",),
    "gpt_oss_120b": ("gpt_oss:gpt_oss_120b",),
    "muse_glimmer_30b": ("muse_glimmer:muse_glimmer_30b",),
}
TARGET_S, TARGET_GIB = 60.0, 4.0


def run_one(args: tuple[str, ...]) -> dict:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "scan.json"
        cmd = [
            "/usr/bin/time",
            "-v",
            sys.executable,
            "-m",
            "gbdoctor",
            "scan",
            "--torchtitan",
            *args[:1],
            "--simulate",
            "-f",
            "json",
            "-o",
            str(out),
            "--compile.enable",
            *args[1:],
        ]
        # gbdoctor takes its own options (--simulate, --world-size, -f, -o) wherever they
        # stand; the rest goes to torchtitan's ConfigManager.
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        report = json.loads(out.read_text()) if out.exists() else None
    stats = _time_v(proc.stderr)
    row = {
        "command": "gbdoctor " + " ".join(cmd[cmd.index("scan") :]).replace(str(out), "OUT"),
        "exit": proc.returncode,
        "wall_s": stats["wall_s"],
        "peak_rss_gib": round(stats["rss_kib"] / (1 << 20), 2),
        "load_1min_before": round(load, 2),
        "within_targets": stats["wall_s"] < TARGET_S and stats["rss_kib"] / (1 << 20) < TARGET_GIB,
    }
    if report is None:
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith(("Error:", "Hint:"))]
        row["refused"] = errors
    else:
        row.update(_found(report))
    return row


def _found(report: dict) -> dict:
    s = report["setup"]
    kinds: dict[str, dict] = {}
    for block in report["blocks"]:
        kind = kinds.setdefault(block["kind"], {"blocks": 0})
        kind["blocks"] += 1
        if block["same_as"] is None and "graphs" not in kind:
            kind.update(
                regions=len(block["regions"]),
                graphs=block["graph_count"],
                breaks=len(block["breaks"]),
                error=block["error"],
            )
    return {
        "layout": f"world {s['world_size']}, FSDP {s['dp_shard']}, TP {s['tp_degree']}, "
        f"EP {s['ep_degree']}, AC {s['ac_mode']}",
        "capture": f"{s['batch_size']} x {s['seq_len']}",
        "simulated": s["simulated"],
        "kinds": kinds,
    }


def _time_v(stderr: str) -> dict:
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    seconds = 0.0
    if wall:
        for part in wall.group(1).split(":"):
            seconds = seconds * 60 + float(part)
    return {"wall_s": round(seconds, 1), "rss_kib": int(rss.group(1)) if rss else 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(RUNS), action="append")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = {}
    for name, run in RUNS.items():
        if args.only and name not in args.only:
            continue
        row = run_one(run)
        results[name] = row
        found = "; ".join(
            f"{k}: {v['blocks']} blocks, {v.get('graphs')} graph(s), {v.get('breaks')} break(s)"
            for k, v in row.get("kinds", {}).items()
        ) or " / ".join(row.get("refused", []))
        print(
            f"{name:18} exit {row['exit']}  {row['wall_s']:6.1f} s  {row['peak_rss_gib']:.2f} GiB  "
            f"load {row['load_1min_before']:.1f}  {'ok' if row['within_targets'] else 'OVER'}  "
            f"{row.get('layout', '')}  {found}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
