"""The ``run`` report as CSV (``run --csv FILE``): one flat row per mode, via pandas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gbdoctor.records import RunReport

CSV_COLUMNS: tuple[str, ...] = (
    "spec",
    "model",
    "device",
    "backend",
    "world_size",
    "batch_size",
    "seq_len",
    "warmup",
    "steps",
    "tokens_per_step",
    "mode",
    "strategy",
    "status",
    "error_kind",
    "error",
    "tokens_per_s",
    "step_time_median_s",
    "step_time_min_s",
    "step_time_max_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "compile_time_s",
    "compile_time_warm_s",
    "dynamo_compile_s",
    "tflops_per_s",
    "mfu",
    "rounds",
    "peak_memory_mib",
    "memory_metric",
    "graphs",
    "graphs_measured",
    "graph_breaks",
    "regions",
    "fullgraph_regions",
    "recompiles",
    "recompile_limit_hit",
    "first_recompile_reason",
    "speedup_vs_eager",
    "speedup_vs_eager_min",
    "speedup_vs_eager_max",
    "verdict_vs_eager",
    "speedup_vs_best_baseline",
    "speedup_vs_best_baseline_min",
    "speedup_vs_best_baseline_max",
    "verdict_vs_best_baseline",
    "best_baseline",
    "loss_first",
    "loss_rel_diff",
    "diverged",
    "same_regions_as",
    "workaround",
)


def csv_rows(report: RunReport) -> list[dict[str, Any]]:
    """One flat row per mode (report-level columns repeated), columns as :data:`CSV_COLUMNS`."""
    rows = []
    for m in report.modes:
        first = next((e for e in m.recompile_events if e.measured), None)
        row = {
            "spec": report.spec,
            "model": report.model,
            "device": report.device,
            "backend": report.backend,
            "world_size": report.world_size,
            "batch_size": report.batch_size,
            "seq_len": report.seq_len,
            "warmup": report.warmup,
            "steps": report.steps,
            "tokens_per_step": report.tokens_per_step,
            "best_baseline": report.best_baseline,
            "first_recompile_reason": first.reason if first else None,
            "loss_first": m.losses[0] if m.losses else None,
            "rounds": report.rounds,
        }
        for name, spread in (
            ("speedup_vs_eager", m.speedup_vs_eager_range),
            ("speedup_vs_best_baseline", m.speedup_vs_best_baseline_range),
        ):
            row[f"{name}_min"], row[f"{name}_max"] = spread if spread else (None, None)
        for name in CSV_COLUMNS:
            if name not in row:
                row[name] = getattr(m, name)
        rows.append({name: row[name] for name in CSV_COLUMNS})
    return rows


def write_csv(report: RunReport, path: str | Path) -> None:
    """Write :func:`csv_rows` to ``path`` with pandas, atomically (parent folders created)."""
    import pandas as pd

    from gbdoctor.records.atomic_write import write_atomic

    frame = pd.DataFrame(csv_rows(report), columns=list(CSV_COLUMNS))
    write_atomic(path, frame.to_csv(index=False), "CSV")
