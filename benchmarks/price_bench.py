"""``gbdoctor price`` against ``gbdoctor run`` and a plain scan, on one spec, in one run.

    python benchmarks/price_bench.py [SPEC] [--set KEY=VALUE ...] [--strategy NAME] [--rounds N]

1. ``gbdoctor plan SPEC --emit-config json`` (the fixes; reused by the next two steps, so they
   price and run the same plan);
2. a plain ``gbdoctor scan`` (timed: the reference for pricing's cost);
3. ``gbdoctor price --plan PLAN`` twice (timed): cold, with an empty inductor cache
   (``TORCHINDUCTOR_CACHE_DIR`` is a fresh folder for the whole benchmark), then warm, reusing the
   kernels the first compiled (what a second price of the spec, or a price after training, costs);
4. ``gbdoctor run --plan PLAN --price PRICED --modes plan`` (run adds ``as-priced``: the strategy
   exactly as priced, against the plan, in the same rounds; its ``price_check`` is the comparison),
   with the same ``--rounds`` and ``--steps`` as the price.

Prints the prices of the breaks the plan removes, their sum, the measured step-time difference
between the strategy and the plan in ``run`` (per round, with the spread), the ratio of the two,
and pricing's wall time (cold and warm) over the plain scan's. ``--trace-compile`` prices once
more from an empty cache under torch's structured trace (``TORCH_TRACE``; untimed, so the timed
prices carry no tracing): per rank, the seconds spent in inductor's compile and, inside it, in the
C++ compiler (``compile_file``), the part of a cold price that no fewer processes or jobs remove.
Writes every number (and the priced scan) to
``benchmarks/results/price_<spec>.json``. Default spec: the llama4 EP=2 debug spec with
titan-v0.2.0 and AC off (1 fsdp-hook + 2 ep-dispatch breaks per MoE block).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def _gbdoctor(*args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gbdoctor", *args], check=True, cwd=REPO)
    return time.perf_counter() - start


COMPILE_PHASES = ("inductor_compile", "compile_file")
"""Events of torch's structured trace summed per rank: inductor's whole compile of a graph, and
the C++ compiler runs inside it."""


def compile_seconds(trace_dir: Path) -> dict[str, dict[str, float]]:
    """Per rank log of ``TORCH_TRACE``, the seconds of each of ``COMPILE_PHASES`` (the trace's
    chromium begin/end events; nested begins of one name are paired last-in first-out)."""
    out: dict[str, dict[str, float]] = {}
    for log in sorted(trace_dir.glob("*rank_*.log")):
        rank = "rank " + log.stem.split("rank_", 1)[1].split("_", 1)[0]
        lines = log.read_text(errors="replace").splitlines()
        open_at: dict[str, list[float]] = {}
        totals = dict.fromkeys(COMPILE_PHASES, 0.0)
        for i, line in enumerate(lines):
            if '"chromium_event"' not in line:
                continue
            payload = []
            for follow in lines[i + 1 :]:
                if not follow.startswith("\t"):
                    break
                payload.append(follow[1:])
            try:
                event = json.loads("".join(payload))
            except json.JSONDecodeError:
                continue
            name = event.get("name")
            if name not in totals:
                continue
            if event.get("ph") == "B":
                open_at.setdefault(name, []).append(event["ts"])
            elif event.get("ph") == "E" and open_at.get(name):
                totals[name] += (event["ts"] - open_at[name].pop()) / 1e6
        out[rank] = {name: round(seconds, 1) for name, seconds in totals.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", nargs="?", default="fixtures/llama4_debug_ep2.toml")
    parser.add_argument("--set", dest="sets", action="append", default=None)
    parser.add_argument("--strategy", default="titan-v0.2.0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--clock", default="wall", choices=("wall", "cpu"), help="price --clock (run reads it)"
    )
    parser.add_argument("--backend", default="inductor")
    parser.add_argument(
        "--trace-compile",
        action="store_true",
        help="price once more from an empty cache under TORCH_TRACE: inductor's compile seconds",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results file")
    args = parser.parse_args()
    sets = args.sets if args.sets is not None else ["activation_checkpoint.mode=none"]
    common = [args.spec, "--strategy", args.strategy, *[x for s in sets for x in ("--set", s)]]
    tmp = Path(tempfile.mkdtemp(prefix="gbdoctor-price-bench-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor-cache")
    plan, priced, ran = tmp / "plan.json", tmp / "priced.json", tmp / "run.json"
    overrides = [x for s in [*sets, f"gbdoctor.strategy={args.strategy}"] for x in ("--set", s)]
    _gbdoctor("plan", args.spec, *overrides, "--emit-config", "json", "-o", str(plan))
    scan_s = _gbdoctor("scan", *common, "-f", "json", "-o", str(tmp / "scan.json"))
    price_args = [
        "price",
        *common,
        "--plan",
        str(plan),
        "--backend",
        args.backend,
        "--rounds",
        str(args.rounds),
        "--steps",
        str(args.steps),
        "--clock",
        args.clock,
        "-f",
        "json",
    ]
    price_s = _gbdoctor(*price_args, "-o", str(priced))
    warm_price_s = _gbdoctor(*price_args, "-o", str(tmp / "priced_warm.json"))
    cold_compile = None
    if args.trace_compile:
        # Once more from an empty cache under the trace, so the timed prices carry no tracing.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor-cache-traced")
        os.environ["TORCH_TRACE"] = str(tmp / "trace")
        _gbdoctor(*price_args, "-o", str(tmp / "priced_traced.json"))
        del os.environ["TORCH_TRACE"]
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor-cache")
        cold_compile = compile_seconds(tmp / "trace")
    _gbdoctor(
        "run",
        args.spec,
        *[x for s in sets for x in ("--set", s)],
        "--plan",
        str(plan),
        "--price",
        str(priced),
        "--modes",
        "plan",
        "--backend",
        args.backend,
        "--rounds",
        str(args.rounds),
        "--steps",
        str(args.steps),
        "-f",
        "json",
        "-o",
        str(ran),
    )
    price = json.loads(priced.read_text())["price"]
    run = json.loads(ran.read_text())
    modes = {m["mode"]: m for m in run["modes"]}
    removed = [b for b in price["breaks"] if b["ms_per_step"] is not None]
    price_sum = sum(b["ms_per_step"] for b in removed)
    as_set_up, planned = modes["as-priced"], modes["plan"]
    medians = "round_cpu_medians_s" if args.clock == "cpu" else "round_medians_s"
    per_round = [(a - b) * 1e3 for a, b in zip(as_set_up[medians], planned[medians], strict=False)]
    measured = statistics.median(per_round)
    summary = {
        "spec": args.spec,
        "sets": sets,
        "strategy": args.strategy,
        "backend": args.backend,
        "rounds": args.rounds,
        "clock": args.clock,
        "torch": json.loads(priced.read_text())["torch_version"],
        "device": price["device"],
        "load_average_after": os.getloadavg()[0],
        "scan_s": round(scan_s, 1),
        "price_s": round(price_s, 1),
        "price_over_scan": round(price_s / scan_s, 2),
        "cold_price_compile_s": cold_compile,
        "warm_price_s": round(warm_price_s, 1),
        "warm_price_over_scan": round(warm_price_s / scan_s, 2),
        "steps": args.steps,
        "warm_price_kinds_ms": {
            k["kind"]: [k["ms_per_step"], k["spread_ms"]]
            for k in json.loads((tmp / "priced_warm.json").read_text())["price"]["kinds"]
        },
        "break_prices_ms": {f"{b['cause']} {b['location']}": b["ms_per_step"] for b in removed},
        "price_sum_ms": round(price_sum, 1),
        "price_kinds_ms": {k["kind"]: [k["ms_per_step"], k["spread_ms"]] for k in price["kinds"]},
        "run_step_diff_ms": round(measured, 1),
        "run_step_diff_rounds_ms": [round(x, 1) for x in per_round],
        "sum_over_run_diff": round(price_sum / measured, 2) if measured else None,
        "run_price_check": run["price_check"],
        "priced_scan": json.loads(priced.read_text()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    # The file name says what differs from the default spec: the AC mode, the device.
    named = [x for x in sets if x not in ("activation_checkpoint.mode=none", "gbdoctor.device=cpu")]
    sac = "".join("_" + x.split("=")[-1] for x in named)
    out = args.out / f"price_{Path(args.spec).stem}{sac}_{args.clock}.json"
    out.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    for key in (
        "torch",
        "clock",
        "load_average_after",
        "scan_s",
        "price_s",
        "price_over_scan",
        "cold_price_compile_s",
        "warm_price_s",
        "warm_price_over_scan",
        "price_kinds_ms",
        "warm_price_kinds_ms",
        "price_sum_ms",
        "run_step_diff_ms",
        "run_step_diff_rounds_ms",
        "sum_over_run_diff",
        "run_price_check",
        "break_prices_ms",
    ):
        print(f"{key}: {summary[key]}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
