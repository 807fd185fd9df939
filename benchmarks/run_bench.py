"""Benchmark record for ``gbdoctor run``: every mode, the plan included, on the bundled specs.

Runs :func:`gbdoctor.run.run_modes` on each spec with the same defaults as ``gbdoctor run SPEC``
(inductor, the plan made and verified first, 2 rounds in alternating order, the CPU benchmark
shape), writes ``benchmarks/results/run_<host>.json`` (the machine description with ``uptime``
before and after, plus every RunReport) and prints each report's markdown table to stdout.

    python benchmarks/run_bench.py                                   # llama4 EP=2 debug spec
    python benchmarks/run_bench.py --specs fixtures/llama3_debug.toml --rounds 3 --backend aot_eager
    python benchmarks/run_bench.py --from-report run.json            # record a `gbdoctor run --format json`

Not a test: numbers depend on the machine and on whatever else it is running (the load average
before and after is recorded). Nothing here favours any mode; every mode gets the same spec, seed,
data, warm-up and step count, each in its own fresh processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPECS = ("fixtures/llama4_debug_ep2.toml",)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, object]:
    import torch

    info: dict[str, object] = {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    info["uptime_before"] = uptime()
    return info


def uptime() -> str:
    """``uptime``'s line (load averages over 1, 5, 15 minutes): the machine's load next to the numbers."""
    import subprocess

    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"loadavg {os.getloadavg()}" if hasattr(os, "getloadavg") else "unknown"


def markdown(info: dict[str, object], settings: dict[str, object], reports: list) -> str:
    """The machine, its load, and each report's own markdown table (``report.run_formats``)."""
    from gbdoctor.report.run_formats import render_run

    lines = [
        f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, Python {info['python']}"
        + (f", GPU {info['cuda']}" if info.get("cuda") else ", no GPU"),
        f"uptime before: `{info.get('uptime_before')}`",
        f"uptime after: `{info.get('uptime_after')}`",
        f"Wall time {settings['wall_s']:.0f} s; settings {json.dumps({k: v for k, v in settings.items() if k != 'wall_s'})}",
        "",
    ]
    for report in reports:
        lines.append(render_run(report, "markdown"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="+", default=list(DEFAULT_SPECS))
    parser.add_argument(
        "--set", nargs="*", default=[], dest="overrides", help="spec overrides section.key=value"
    )
    parser.add_argument("--modes", nargs="*", default=None)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--no-plan", action="store_true")
    parser.add_argument(
        "--from-report",
        type=Path,
        default=None,
        help="record an existing `gbdoctor run --format json` report instead of running",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    from gbdoctor.records.io import to_jsonable
    from gbdoctor.run import report_from_json, run_modes, run_settings
    from gbdoctor.spec import load_spec

    info = machine()
    started = time.perf_counter()
    reports = []
    if args.from_report is not None:
        reports.append(report_from_json(args.from_report.read_text()))
        info["uptime_before"] = "see the report's notes (recorded by `gbdoctor run`)"
    for path in [] if args.from_report is not None else args.specs:
        spec = load_spec(ROOT / path if not Path(path).is_absolute() else path, args.overrides)
        print(f"[run_bench] {path}", file=sys.stderr, flush=True)
        training = run_settings(
            spec, steps=args.steps, warmup=args.warmup, rounds=args.rounds, backend=args.backend
        )
        report = run_modes(
            spec,
            training,
            modes=args.modes,
            make_plan=not args.no_plan,
            progress=lambda msg, done, total: print(
                f"[run_bench]   {msg} ({done}/{total})", file=sys.stderr, flush=True
            ),
        )
        reports.append(report)
    info["uptime_after"] = uptime()
    settings = {
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "backend": args.backend,
        "overrides": args.overrides,
        "wall_s": time.perf_counter() - started,
    }
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", str(info["host"]))
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"run_{host}.json"
    out.write_text(
        json.dumps(
            {"machine": info, "settings": settings, "reports": to_jsonable(reports)},
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    print(f"[run_bench] wrote {out}", file=sys.stderr)
    sys.stdout.write(markdown(info, settings, reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
