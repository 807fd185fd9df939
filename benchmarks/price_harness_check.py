"""Why would a price and ``run --price`` disagree? Train, in ONE set of alternating rounds:

* ``as set up`` and an identical copy of it, ``as set up (copy)``: their per-round difference is
  the noise floor of a paired difference on this machine (it is 0 in expectation);
* ``fix KIND`` exactly as ``gbdoctor price`` builds it (per block kind with breaks);
* ``plan`` exactly as ``gbdoctor run`` applies it (``plan_strategy``).

Prints each mode's per-round median step time and the paired per-round differences
(as set up - X) with their median and spread. When ``fix KIND`` and ``plan`` differ by no more
than the copy does, price and run measure the same change and any disagreement between them is
noise; otherwise the two strategies differ and the difference says by how much.

``--ranks shared`` trains every job on one set of ranks, as ``price`` does (``fresh``, the
default, spawns them per job, as ``run`` does): the two runs compare the harnesses' noise.

    python benchmarks/price_harness_check.py [SPEC] [--set K=V ...] [--strategy S] [--rounds N]
                                             [--ranks fresh|shared]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COPY = "as set up (copy)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec", nargs="?", default="fixtures/llama4_debug_ep2.toml")
    parser.add_argument("--set", dest="sets", action="append", default=None)
    parser.add_argument("--strategy", default="titan-v0.2.0")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument(
        "--ranks",
        choices=("fresh", "shared"),
        default="fresh",
        help="fresh: every job in newly spawned ranks (as `run` trains); shared: one set of "
        "ranks for every job (as `price` trains)",
    )
    parser.add_argument("--out", default=None, help="write the numbers as JSON here")
    args = parser.parse_args()
    sets = args.sets if args.sets is not None else ["activation_checkpoint.mode=none"]

    from gbdoctor.frameworks.registry import framework_for
    from gbdoctor.plan import plan_strategy, propose_plan
    from gbdoctor.price.driver import AS_SET_UP, _median_step, _modes, breaks_tolerated
    from gbdoctor.records import Clock
    from gbdoctor.run.measure import load_average
    from gbdoctor.run.rounds import CompileCache, train_rounds
    from gbdoctor.run.settings import prepare_training, run_settings
    from gbdoctor.scan import scan
    from gbdoctor.spec import load_spec, with_overrides

    spec = with_overrides(load_spec(args.spec), [*sets, f"gbdoctor.strategy={args.strategy}"])
    framework = framework_for(spec)
    started = time.perf_counter()
    report = scan(spec, framework=framework)
    plan = propose_plan(spec, framework=framework)
    as_set_up, _ = breaks_tolerated(framework.strategies[args.strategy])
    strategies = {m.name: m.strategy for m in _modes(report, plan, as_set_up)}
    strategies[COPY] = replace(as_set_up, name=COPY)
    strategies["plan"] = plan_strategy(plan, spec)
    settings = run_settings(
        spec, backend=args.backend, warmup=2, steps=args.steps, rounds=args.rounds
    )
    b, s = settings.batch_size, settings.seq_len
    run_spec, _ = prepare_training(spec, settings, framework, real=False)
    print(
        f"scan + plan {time.perf_counter() - started:.1f} s; modes {list(strategies)}", flush=True
    )
    rounds = train_rounds(
        run_spec,
        framework,
        strategies,
        settings,
        progress=lambda msg, done, total: print(f"  [{done}/{total}] {msg}", flush=True),
        cache=CompileCache.INDUCTOR,
        reuse_ranks=args.ranks == "shared",
    )
    if rounds.failures:
        sys.exit(f"failed: {rounds.failures}")
    medians, cpu = (
        {m: [_median_step(r, clock) for r in runs] for m, runs in rounds.runs.items()}
        for clock in (Clock.WALL, Clock.CPU)
    )
    out: dict[str, object] = {
        "spec": args.spec,
        "sets": sets,
        "strategy": args.strategy,
        "backend": args.backend,
        "rounds": args.rounds,
        "steps": args.steps,
        "ranks": args.ranks,
        "batch_x_seq": [b, s],
        "load_max": round(max(rounds.loads), 2),
        "load_after": round(load_average(), 2),
        "round_medians_ms": {m: [round(x, 1) for x in v] for m, v in medians.items()},
    }
    out["round_cpu_medians_ms"] = {m: [round(x, 1) for x in v] for m, v in cpu.items()}
    for clock, table in (("wall", medians), ("cpu", cpu)):
        diffs = {}
        for mode, values in table.items():
            if mode == AS_SET_UP:
                continue
            d = [a - x for a, x in zip(table[AS_SET_UP], values, strict=True)]
            diffs[f"{AS_SET_UP} - {mode}"] = {
                "median": round(statistics.median(d), 1),
                "spread": [round(min(d), 1), round(max(d), 1)],
                "rounds": [round(x, 1) for x in d],
            }
        out[f"paired_differences_{clock}_ms"] = diffs
        for mode, values in table.items():
            print(f"{clock} {mode:>22}: {[round(x, 1) for x in values]} ms")
        for name, d in diffs.items():
            print(
                f"{clock} {name:>40}: {d['median']:8.1f} ms [{d['spread'][0]} to {d['spread'][1]}]"
            )
    print(f"load max {out['load_max']} (cores {os.cpu_count()})")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
