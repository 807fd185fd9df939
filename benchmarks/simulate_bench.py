"""Simulated scans of production-size specs: wall time and peak memory (a script, not a test).

    python benchmarks/simulate_bench.py [--only NAME] [--json FILE]

Each configuration runs in a fresh interpreter (so its peak RSS is its own), through the same
library call ``gbdoctor scan SPEC --simulate`` makes, and reports:

- ``scan``: wall time of ``scan(spec)`` (setup + warm-up step + captures), and its phases;
- ``process``: the whole process, imports included (what a user waits for);
- peak RSS (``ru_maxrss`` of the process) against the targets: 60 s and 4 GiB per config.

Specs live in ``benchmarks/specs/`` (torchtitan's presets with the layout gbdoctor supports).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "benchmarks" / "specs"
CONFIGS = {
    "llama4-17bx16e-w64-ep8": SPECS / "llama4_17bx16e_ep8_w64.toml",
    "deepseek_v3-671B-w256-ep32": SPECS / "deepseek_v3_671b_ep32_w256.toml",
}
TARGET_S, TARGET_GIB = 60.0, 4.0


def child(spec_path: str) -> dict:
    """Run one simulated scan in this (fresh) process and measure it."""
    t_start = time.perf_counter()
    import resource

    import gbdoctor.scan as scan_mod
    from gbdoctor.scan import rank as rank_mod
    from gbdoctor.spec import load_spec
    from gbdoctor.summary import summarize

    t_imported = time.perf_counter()
    phases: dict[str, float] = {}

    def timed(name, fn):  # instrumentation only: the scan code itself is untouched
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t

        return wrapper

    # Patched where scan_rank looks them up (gbdoctor.scan.rank's globals).
    rank_mod.build_and_setup = timed(
        "build+setup (meta) + fake materialize", rank_mod.build_and_setup
    )
    rank_mod.run_warm_up = timed("eager warm-up step", rank_mod.run_warm_up)
    rank_mod.capture_block = timed("block captures", rank_mod.capture_block)

    spec = load_spec(spec_path, ["gbdoctor.simulate=true"])
    t0 = time.perf_counter()
    report = scan_mod.scan(spec)
    scan_s = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    summary = summarize(report)
    p = spec.parallelism
    return {
        "spec": os.path.relpath(spec_path, ROOT),
        "model": report.model,
        "layout": f"world {p.world_size}, FSDP {p.dp_shard}, EP {p.expert_parallel_degree}, AC "
        + _ac(spec.activation_checkpoint),
        "capture_input": f"batch {spec.capture_batch_size} x seq {spec.capture_seq_len}",
        "params": _param_count(spec),
        "blocks": len(report.blocks),
        "captured_kinds": sum(1 for b in report.blocks if b.same_as is None),
        "breaks": summary.breaks,
        "events": sum(len(b.events) for b in report.blocks),
        "errors": sum(1 for b in report.blocks if b.error),
        "simulated": report.setup.simulated,
        "imports_s": round(t_imported - t_start, 2),
        "scan_s": round(scan_s, 2),
        "process_s": round(time.perf_counter() - t_start, 2),
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "notes": list(report.notes),
    }


def _ac(ac) -> str:
    return f"selective ({ac.selective_ac_option})" if ac.mode == "selective" else ac.mode


def _param_count(spec) -> int:
    from gbdoctor.models import build_model

    return sum(p.numel() for p in build_model(spec.model, device="meta").parameters())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CONFIGS))
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return 0

    results = {}
    for name, spec in CONFIGS.items():
        if args.only and name != args.only:
            continue
        print(f"== {name}: {spec.relative_to(ROOT)}", flush=True)
        t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--child", str(spec)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if proc.returncode != 0:
            print(proc.stderr[-4000:])
            return 1
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        res["wall_incl_interpreter_s"] = round(time.perf_counter() - t, 2)
        results[name] = res
        ok_t = "ok" if res["scan_s"] < TARGET_S else "OVER"
        ok_m = "ok" if res["peak_rss_mib"] < TARGET_GIB * 1024 else "OVER"
        print(
            f"   model {res['model']} ({res['params'] / 1e9:.0f}B params), {res['layout']}, "
            f"input {res['capture_input']}"
        )
        print(
            f"   {res['blocks']} blocks, {res['captured_kinds']} kind(s) captured; {res['breaks']} break(s), "
            f"{res['events']} event(s), {res['errors']} error(s); simulated={res['simulated']}"
        )
        print(
            f"   scan wall {res['scan_s']:.1f} s [{ok_t} vs {TARGET_S:.0f} s]; whole process "
            f"{res['process_s']:.1f} s (imports {res['imports_s']:.1f} s)"
        )
        print(f"   peak RSS {res['peak_rss_mib']:.0f} MiB [{ok_m} vs {TARGET_GIB:.0f} GiB]")
        for phase, s in sorted(res["phases_s"].items(), key=lambda kv: -kv[1]):
            print(f"     {phase:40s} {s:6.1f} s")
    print(
        f"machine: {os.cpu_count()} CPU core(s); load average {os.getloadavg()[0]:.2f} at the end"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
