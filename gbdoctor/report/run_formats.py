"""Formatters for :class:`~gbdoctor.run.RunReport` (``gbdoctor run``).

``table`` (rich, plain text at a fixed width: one comparison row per mode, a bar chart of
tokens/s scaled to the fastest mode, then each mode's failures, recompiles and notes),
``json`` (the records; timings vary run to run, the structure does not), ``markdown`` (the
comparison table, for READMEs and PR comments) and :func:`write_csv` (one row per mode, via
pandas). Everything shown is computed by ``gbdoctor.run``; these only lay out its records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.records import ModeResult, ModeStatus, RunReport, Verdict
from gbdoctor.records.io import dumps
from gbdoctor.report.price_rows import run_price_check

__all__ = ["RUN_FORMAT_NAMES", "csv_rows", "render_run", "tokens_bar", "write_csv"]

RUN_FORMAT_NAMES: tuple[str, ...] = ("table", "json", "markdown", "html")
WIDTH = 120
BAR_WIDTH = 40
_EIGHTHS = " ▏▎▍▌▋▊▉"
LOSSES_SHOWN = 3
"""Losses per mode that the table shows (the records keep every step's loss)."""


def render_run(report: RunReport, fmt: str) -> str:
    """The report in ``fmt`` (``table``, ``json`` or ``markdown``); SpecError for other names."""
    if fmt == "json":
        return dumps(report)
    if fmt == "markdown":
        return render_markdown(report)
    if fmt == "table":
        return render_table(report)
    if fmt == "html":
        from gbdoctor.report.html import render_html, run_document

        return render_html([run_document(report)])
    raise SpecError(
        f"unknown format {fmt!r} for run",
        hint=f"valid formats: {', '.join(RUN_FORMAT_NAMES)} (and --csv FILE)",
    )


# --------------------------------------------------------------------------- text helpers


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _fixed(value: float | None, places: int = 2) -> str:
    return "-" if value is None else f"{value:.{places}f}"


def _tokens(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _spread(mode: ModeResult) -> str:
    if mode.step_time_median_s is None:
        return "-"
    return f"{mode.step_time_median_s:.3f} [{mode.step_time_min_s:.3f}-{mode.step_time_max_s:.3f}]"


def _losses(mode: ModeResult, n: int) -> str:
    return " ".join(f"{x:.4g}" for x in mode.losses[:n]) or "-"


def _status(mode: ModeResult) -> str:
    if mode.status == ModeStatus.UNAVAILABLE:
        return "UNAVAILABLE"
    if mode.status != ModeStatus.OK:
        return f"FAILED ({mode.error_kind})" if mode.error_kind else "FAILED"
    flags = []
    if mode.recompiles:
        flags.append("recompiles")
    if mode.diverged:
        flags.append("diverged")
    return "ok" + (f" ({', '.join(flags)})" if flags else "")


def tokens_bar(value: float | None, best: float | None, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of block characters, ``width`` cells for ``best``, eighths resolution."""
    if value is None or not best or best <= 0:
        return ""
    eighths = max(0, round(value / best * width * 8))
    full, rest = divmod(min(eighths, width * 8), 8)
    return "█" * full + (_EIGHTHS[rest] if rest else "")


def _header_fields(report: RunReport) -> list[tuple[str, str]]:
    fields = [
        ("spec", report.spec),
        (
            "model",
            report.model
            + (
                f", {report.flops_per_token / 1e6:.1f} MFLOPs/token (training, from the config)"
                if report.flops_per_token
                else ""
            ),
        ),
        (
            "setup",
            f"{report.device}, {report.world_size} rank(s), backend {report.backend}, "
            f"AC {report.ac_mode}/{report.ac_option}"
            + (f", {report.optimizer}" if report.optimizer else ""),
        ),
        (
            "device",
            report.device_name
            + (
                f", dense bf16 peak {report.peak_tflops:g} TFLOP/s per rank"
                if report.peak_tflops
                else ""
            ),
        ),
        (
            "shapes",
            f"local batch {report.batch_size} x seq {report.seq_len} "
            f"({report.tokens_per_step} tokens/step over all ranks)"
            + (f": {report.shape_note}" if report.shape_note else ""),
        ),
        (
            "steps",
            f"{report.rounds} round(s) x ({report.warmup} warm-up, excluded + {report.steps} measured) per mode, "
            f"each run in fresh processes, order alternating per round; seed {report.seed}",
        ),
        ("torch", report.torch_version),
    ]
    if report.plan_source:
        verified = "verified" if report.plan_verified else "NOT verified"
        fields.append(("plan", f"{report.plan_source}; {verified}"))
        fields += [("", line) for line in report.plan_kinds]
    return [(k, v) for k, v in fields if v]


def _mode_details(mode: ModeResult) -> list[str]:
    lines = []
    if mode.error:
        lines.append(f"error: {mode.error}")
    if mode.workaround:
        lines.append(mode.workaround)
    measured = [e for e in mode.recompile_events if e.measured]
    if measured:
        lines.append(f"{len(measured)} recompile(s) during the measured steps:")
        for e in measured:
            where = f" at {e.location}" if e.location else ""
            lines.append(f"  step {e.step}: {e.reason}{where} (in {e.function})")
            if e.hint:
                lines.append(f"    hint: {e.hint}")
    warm = sum(1 for e in mode.recompile_events if not e.measured)
    if warm and measured:
        lines.append(f"({warm} more recompile(s) during the warm-up steps)")
    if mode.recompile_limit_hit:
        lines.append("Dynamo hit recompile_limit: some frames ran eagerly afterwards")
    if mode.cudagraph_skips:
        lines.append(f"inductor skipped cudagraphs {len(mode.cudagraph_skips)} time(s):")
        lines += [f"  {reason}" for reason in mode.cudagraph_skips]
    if mode.diverged:
        rel = (
            f"relative difference {mode.loss_rel_diff:.2g}"
            if mode.loss_rel_diff is not None
            else "non-finite loss"
        )
        lines.append(f"losses diverge from eager ({rel})")
    lines.extend(mode.notes)
    return lines


# --------------------------------------------------------------------------- table


def render_table(report: RunReport) -> str:
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from gbdoctor.report.table import plain_text, recording_console

    console = recording_console()
    console.print(Text("gbdoctor run", style="bold"))
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for label, value in _header_fields(report):
        grid.add_row(label, Text(value))
    console.print(grid)

    table = Table(
        title=escape(
            "Throughput (step s: median [min-max] of every round's measured steps; ratios: "
            "median [min-max] of the per-round ratios)"
        ),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
    )
    for name, justify in [
        ("mode", "left"),
        ("status", "left"),
        ("tok/s", "right"),
        ("step s", "right"),
        ("x eager", "right"),
        ("", "left"),
        ("x best", "right"),
        ("", "left"),
    ]:
        table.add_column(name, justify=justify, no_wrap=True)
    for m in report.modes:
        style = (
            "red"
            if m.status != ModeStatus.OK
            else ("yellow" if m.recompiles or m.diverged else "green")
        )
        table.add_row(
            Text(_mode_name(m, report), style=style),
            Text(_short_status(m)),
            _tokens(m.tokens_per_s),
            _spread(m),
            _ratio_range(m.speedup_vs_eager, m.speedup_vs_eager_range),
            _verdict(m.verdict_vs_eager),
            _ratio_range(m.speedup_vs_best_baseline, m.speedup_vs_best_baseline_range),
            _verdict(m.verdict_vs_best_baseline),
        )
    console.print(table)
    if report.best_baseline:
        console.print(f"* best baseline: {report.best_baseline}")
    if report.plan_verdict:
        console.print(Text(f"plan: {report.plan_verdict}", style="bold"))

    split = Table(
        title="Where the time goes (medians in s: forward, backward, optimizer; compile s, first round "
        "and warm cache; compile never counts in tok/s)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
    )
    for name in (
        "mode",
        "fwd",
        "bwd",
        "opt",
        "opt%",
        "compile",
        "warm",
        "peak MiB",
        "graphs",
        "recomp",
        "TFLOP/s",
        "MFU",
    ):
        split.add_column(name, justify="left" if name == "mode" else "right", no_wrap=True)
    for m in report.modes:
        ok = m.status == ModeStatus.OK
        split.add_row(
            m.mode,
            _num(m.forward_s),
            _num(m.backward_s),
            _num(m.optimizer_s),
            _opt_share(m),
            _fixed(m.compile_time_s),
            _fixed(m.compile_time_warm_s),
            _fixed(m.peak_memory_mib, 0),
            str(m.graphs) if ok else "-",
            str(m.recompiles) if ok else "-",
            _num(m.tflops_per_s, 2),
            "-" if m.mfu is None else f"{m.mfu:.1%}",
        )
    console.print(split)

    rates = [m.tokens_per_s for m in report.modes if m.tokens_per_s]
    if rates:
        best = max(rates)
        console.print(Text("tokens/s (global)", style="bold"))
        chart = Table.grid(padding=(0, 1))
        chart.add_column()
        chart.add_column(no_wrap=True)
        chart.add_column(justify="right")
        for m in report.modes:
            bar = (
                tokens_bar(m.tokens_per_s, best)
                if m.tokens_per_s
                else (
                    f"({'unavailable' if m.status == 'unavailable' else 'failed'})"
                    if m.status != ModeStatus.OK
                    else ""
                )
            )
            chart.add_row(m.mode, bar, _tokens(m.tokens_per_s))
        console.print(chart)

    with_losses = [m for m in report.modes if m.losses]
    if with_losses:
        shown = min(LOSSES_SHOWN, max(len(m.losses) for m in with_losses))
        losses = Table(
            title=f"Losses of the first {shown} steps (warm-up included); divergence: step 0 vs eager, "
            f"relative tolerance {report.loss_rtol:g}",
            title_justify="left",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
        )
        losses.add_column("mode")
        for i in range(shown):
            losses.add_column(f"step {i}", justify="right")
        losses.add_column("rel diff", justify="right")
        losses.add_column("diverged")
        for m in with_losses:
            cells = [f"{x:.5g}" for x in m.losses[:shown]] + ["-"] * (shown - len(m.losses[:shown]))
            losses.add_row(m.mode, *cells, _num(m.loss_rel_diff, 2), "YES" if m.diverged else "no")
        console.print(losses)

    for m in report.modes:
        details = _mode_details(m)
        if details:
            console.print(Text(m.mode, style="bold"))
            for line in details:
                console.print(Text("  " + line))
    if report.findings:
        console.print(Text(f"Findings ({len(report.findings)})", style="bold red"))
        for f in report.findings:
            console.print(Text(f"  - {f}"))
    else:
        console.print(
            Text(
                "No findings: every mode that can run here ran, no recompiles in the measured "
                "steps, losses agree.",
                style="green",
            )
        )
    for note in report.notes:
        console.print(Text(f"note: {note}"))
    if report.price_check is not None:
        console.print(Text(run_price_check(report.price_check)))
    return plain_text(console)


def _mode_name(mode: ModeResult, report: RunReport) -> str:
    name = mode.mode + (" *" if mode.mode == report.best_baseline else "")
    name += " (workaround)" if mode.workaround else ""
    return name + (" (unverified)" if mode.plan_verified is False else "")


def _ratio_range(ratio: float | None, spread: tuple[float, float] | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" + (f" [{spread[0]:.2f}-{spread[1]:.2f}]" if spread else "")


def _verdict(verdict: str) -> str:
    return {Verdict.WITHIN_NOISE: "~ noise", Verdict.NO_SPREAD: "(1 round)"}.get(verdict, verdict)


def _opt_share(mode: ModeResult) -> str:
    parts = (mode.forward_s, mode.backward_s, mode.optimizer_s)
    if any(p is None for p in parts) or not sum(parts):
        return "-"
    return f"{mode.optimizer_s / sum(parts):.0%}"


def _short_status(mode: ModeResult) -> str:
    if mode.status == ModeStatus.UNAVAILABLE:
        return "UNAVAILABLE"
    if mode.status != ModeStatus.OK:
        return "FAILED"
    if mode.recompiles:
        return "RECOMPILES"
    return "DIVERGED" if mode.diverged else "ok"


def _with_verdict(ratio: float | None, spread: tuple[float, float] | None, verdict: str) -> str:
    text = _ratio_range(ratio, spread)
    return f"{text} {_verdict(verdict)}" if verdict and ratio is not None else text


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: RunReport) -> str:

    lines = [f"### gbdoctor run: `{report.model}`", ""]
    lines += [
        f"- {label}: {_md_cell(value)}" if label else f"  - {_md_cell(value)}"
        for label, value in _header_fields(report)
    ]
    lines.append("")
    head = (
        "mode",
        "status",
        "tokens/s",
        "step s median [min-max]",
        "vs eager [rounds min-max]",
        "vs best",
        "fwd / bwd / opt s",
        "compile s (warm)",
        "peak MiB",
        "graphs",
        "recompiles",
        "TFLOP/s",
        "MFU",
    )
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---" for _ in head) + "|")
    for m in report.modes:
        name = _mode_name(m, report).replace(" *", " (best)")
        ok = m.status == ModeStatus.OK
        phases = (
            " / ".join(_num(x) for x in (m.forward_s, m.backward_s, m.optimizer_s)) if ok else "-"
        )
        cells = (
            name,
            _status(m),
            _tokens(m.tokens_per_s),
            _spread(m),
            _with_verdict(m.speedup_vs_eager, m.speedup_vs_eager_range, m.verdict_vs_eager),
            _with_verdict(
                m.speedup_vs_best_baseline,
                m.speedup_vs_best_baseline_range,
                m.verdict_vs_best_baseline,
            ),
            phases,
            _fixed(m.compile_time_s)
            + (f" ({_fixed(m.compile_time_warm_s)})" if m.compile_time_warm_s is not None else ""),
            _fixed(m.peak_memory_mib, 0),
            str(m.graphs) if ok else "-",
            str(m.recompiles) if ok else "-",
            _num(m.tflops_per_s),
            "-" if m.mfu is None else f"{m.mfu:.1%}",
        )
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    if report.plan_verdict:
        lines += ["", f"**plan:** {_md_cell(report.plan_verdict)}"]
    extra = [(m.mode, line) for m in report.modes for line in _mode_details(m)]
    if extra or report.findings or report.notes:
        lines.append("")
    for mode, line in extra:
        lines.append(f"- {mode}: {_md_cell(line.strip())}")
    for f in report.findings:
        lines.append(f"- finding: {_md_cell(f)}")
    for note in report.notes:
        lines.append(f"- note: {_md_cell(note)}")
    if report.price_check is not None:
        lines += ["", run_price_check(report.price_check)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- csv


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

    from gbdoctor.records.io import write_atomic

    frame = pd.DataFrame(csv_rows(report), columns=list(CSV_COLUMNS))
    write_atomic(path, frame.to_csv(index=False), "CSV")
