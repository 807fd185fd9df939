"""Benchmark record for ``gbdoctor run``: every mode on the bundled debug specs.

Runs :func:`gbdoctor.run.run_modes` on each spec (default: the llama3, llama4 and deepseek_v3
debug specs at their ``[gbdoctor]`` shapes), writes ``benchmarks/results/run_<host>.json`` (the
machine description plus every RunReport) and prints a markdown table to stdout.

    python benchmarks/run_bench.py                       # 3 warm-up + 5 measured steps
    python benchmarks/run_bench.py --steps 10 --backend inductor --specs fixtures/llama3_debug.toml

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
DEFAULT_SPECS = (
    "fixtures/llama3_debug.toml",
    "fixtures/llama4_debug.toml",
    "fixtures/deepseek_v3_debug.toml",
)


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
    if hasattr(os, "getloadavg"):
        info["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    return info


def _fmt(value: object, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return (
        format(value, spec)
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else str(value)
    )


def markdown(info: dict[str, object], settings: dict[str, object], reports: list) -> str:
    from gbdoctor.report.run_formats import csv_rows

    lines = [
        f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, Python {info['python']}"
        + (f", GPU {info['cuda']}" if info.get("cuda") else ""),
        f"Load average before/after (1, 5, 15 min): {info.get('loadavg_before')} / {info.get('loadavg_after')}",
        f"Settings: {settings['warmup']} warm-up + {settings['steps']} measured steps, backend "
        f"{settings['backend']}, each mode in fresh processes; wall time {settings['wall_s']:.0f} s",
        "",
        "| spec | mode | status | tokens/s | step s median [min-max] | compile s | peak MiB | graphs | "
        "recompiles | x eager | x best |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for report in reports:
        name = Path(report.spec).name
        for row in csv_rows(report):
            status = row["status"] if row["status"] == "ok" else f"failed ({row['error_kind']})"
            if row["status"] == "ok" and row["recompiles"]:
                status = "ok, RECOMPILES"
            if row["diverged"]:
                status += ", DIVERGED"
            median = row["step_time_median_s"]
            step = (
                "-"
                if median is None
                else (f"{median:.3f} [{row['step_time_min_s']:.3f}-{row['step_time_max_s']:.3f}]")
            )
            best = " (best)" if row["mode"] == report.best_baseline else ""
            lines.append(
                f"| {name} | {row['mode']}{best} | {status} | {_fmt(row['tokens_per_s'], ',.0f')} | {step} | "
                f"{_fmt(row['compile_time_s'], '.2f')} | {_fmt(row['peak_memory_mib'], '.0f')} | "
                f"{row['graphs'] if row['status'] == 'ok' else '-'} | "
                f"{row['recompiles'] if row['status'] == 'ok' else '-'} | "
                f"{_fmt(row['speedup_vs_eager'], '.2f')} | {_fmt(row['speedup_vs_best_baseline'], '.2f')} |"
            )
            if row["error"]:
                notes.append(f"- {name} / {row['mode']}: {row['error']}")
        for mode in report.modes:
            for note in mode.notes:
                notes.append(f"- {name} / {mode.mode}: {note}")
    if notes:
        lines += [""] + notes
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="+", default=list(DEFAULT_SPECS))
    parser.add_argument(
        "--set", nargs="*", default=[], dest="overrides", help="spec overrides section.key=value"
    )
    parser.add_argument("--modes", nargs="*", default=None)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--backend", default=None, help="default: aot_eager on CPU, inductor on CUDA"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    from gbdoctor.records.io import to_jsonable
    from gbdoctor.run import run_modes
    from gbdoctor.spec import load_spec

    info = machine()
    started = time.perf_counter()
    reports = []
    for path in args.specs:
        spec = load_spec(ROOT / path if not Path(path).is_absolute() else path, args.overrides)
        print(f"[run_bench] {path}", file=sys.stderr, flush=True)
        report = run_modes(
            spec,
            modes=args.modes,
            steps=args.steps,
            warmup=args.warmup,
            backend=args.backend,
            progress=lambda msg, done, total: print(
                f"[run_bench]   {msg} ({done}/{total})", file=sys.stderr, flush=True
            ),
        )
        reports.append(report)
    if hasattr(os, "getloadavg"):
        info["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    settings = {
        "steps": args.steps,
        "warmup": args.warmup,
        "backend": reports[0].backend if reports else args.backend,
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
