"""Benchmark for ``gbdoctor timeline``: the pattern fixtures with inductor, before and after the fix.

For each spec it runs :func:`gbdoctor.timeline.train.run_timeline` with ``fix=True`` (the timeline,
then again with the proposed ``torch._dynamo.config`` fixes) and prints every step's wall time
and compile time, the step's mark (R recompile, L limit hit, E eager fallback, B accumulation
boundary, C first compile), the periods with their amplitude, and the steady-state median with
its spread (min-max) before and after. For the DeepSpeed accumulation fixtures (no fix to
apply) it prints the boundary steps' phase split against the other steps.

    python benchmarks/timeline.py                                  # fixtures (2)-(4), inductor
    python benchmarks/timeline.py --specs fixtures/timeline/zero3_accumulation.toml --steps 24
    python benchmarks/timeline.py --backend aot_eager              # quicker, no C++ compiles
    python benchmarks/timeline.py --specs fixtures/timeline/alternating_seq.toml \
        --seq-lens 32,32,48 --steps 12 --set gbdoctor.timeout_s=3000   # a loaded machine

Not a test: the numbers depend on the machine and its load (the load average before and after is
printed). Fixture (3) needs ``--seq-lens 32,32,48``, which the default set passes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = (
    ("fixtures/timeline/task_cycle.toml", ()),
    ("fixtures/timeline/alternating_seq.toml", (32, 32, 48)),
    ("fixtures/timeline/step_counter.toml", ()),
)


def _spread(times: list[float]) -> str:
    if not times:
        return "-"
    return (
        f"median {statistics.median(times) * 1e3:.1f} ms "
        f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}, n={len(times)})"
    )


def _print_steps(title: str, steps) -> None:  # type: ignore[no-untyped-def]
    from gbdoctor.report.timeline import step_mark

    print(f"  {title}")
    print("    step  mark  time_ms  compile_ms  fwd_ms  bwd_ms  opt_ms  coll_ms")
    for s in steps:
        print(
            f"    {s.step:4d}  {step_mark(s):>4}  {s.time_s * 1e3:7.1f}  {s.compile_s * 1e3:10.1f}"
            f"  {s.forward_s * 1e3:6.1f}  {s.backward_s * 1e3:6.1f}  {s.optimizer_s * 1e3:6.1f}"
            f"  {s.collective_s * 1e3:7.1f}"
        )


def main() -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="*", default=None)
    parser.add_argument("--seq-lens", default="", help="for --specs: e.g. 32,32,48")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument(
        "--set", action="append", default=[], help="spec override, e.g. gbdoctor.timeout_s=3000"
    )
    args = parser.parse_args()
    os.environ.setdefault("DS_BUILD_OPS", "0")

    from gbdoctor.run.settings import Shape, run_settings
    from gbdoctor.spec import load_spec
    from gbdoctor.timeline.train import run_timeline

    if args.specs:
        lens = tuple(int(x) for x in args.seq_lens.split(",") if x)
        todo = [(spec, lens) for spec in args.specs]
    else:
        todo = [(spec, tuple(lens)) for spec, lens in DEFAULTS]
    print(f"load average before: {os.getloadavg()}")
    for spec_path, lens in todo:
        spec = load_spec(ROOT / spec_path, args.set)
        start = time.perf_counter()
        settings = run_settings(
            spec, steps=args.steps, seq_lens=lens, backend=args.backend, shape=Shape.CAPTURE
        )
        report = run_timeline(spec, settings, fix=True)
        wall = time.perf_counter() - start
        print(f"\n{spec_path} ({args.backend}, {args.steps} steps, {wall:.0f} s wall)")
        print(f"  verdict: {report.verdict}")
        for p in report.periods:
            amp = f", amplitude {p.amplitude_s * 1e3:.1f} ms" if p.amplitude_s is not None else ""
            conf = f", autocorrelation {p.confidence:.2f}" if p.confidence is not None else ""
            print(f"  period {p.k} offset {p.offset} ({p.source}){amp}{conf}")
        for f in report.findings:
            print(f"  {'PROBLEM' if f.problem else 'by design'}: {f.cause}: {f.summary}: {f.plain}")
        _print_steps("steps", report.steps)
        steady = [s.time_s for s in report.steps[report.warmup_steps :]]
        print(f"  steady state (from step {report.warmup_steps}): {_spread(steady)}")
        v = report.verification
        if v is not None:
            _print_steps("after the fixes " + str(v.applied), v.after_steps)
            after = [s.time_s for s in v.after_steps[report.warmup_steps :]]
            print(f"  steady state after: {_spread(after)}")
            print(
                f"  recompiles {v.before_recompiles} -> {v.after_recompiles}, eager steps "
                f"{v.before_eager_steps} -> {v.after_eager_steps}, limit hits "
                f"{v.before_limit_hits} -> {v.after_limit_hits}, gone: {v.gone}"
            )
            if steady and after:
                ratio = statistics.median(steady) / statistics.median(after)
                print(f"  steady median before / after: {ratio:.2f}x")
        boundary = [s for s in report.steps[report.warmup_steps :] if s.boundary]
        other = [s for s in report.steps[report.warmup_steps :] if s.boundary is False]
        if boundary and other:
            for label, get in (
                ("step", lambda s: s.time_s),
                ("optimizer", lambda s: s.optimizer_s),
                ("backward", lambda s: s.backward_s),
                ("collectives", lambda s: s.collective_s),
            ):
                print(
                    f"  {label}: boundary {_spread([get(s) for s in boundary])}; "
                    f"others {_spread([get(s) for s in other])}"
                )
    print(f"\nload average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
