"""The ``run`` report as a table (rich, plain text at a fixed width): one comparison row per
mode, a bar chart of tokens/s scaled to the fastest mode, then each mode's failures, recompiles
and notes."""

from __future__ import annotations

from typing import Any, Literal

from gbdoctor.records import ModeResult, ModeStatus, RunReport
from gbdoctor.report.price_rows import run_price_check
from gbdoctor.report.run_cells import (
    fmt_fixed,
    fmt_num,
    fmt_spread,
    fmt_tokens,
    header_fields,
    mode_details,
    mode_label,
    ratio_range,
    verdict_text,
)

BAR_WIDTH = 40

_EIGHTHS = " ▏▎▍▌▋▊▉"

LOSSES_SHOWN = 3
"""Losses per mode that the table shows (the records keep every step's loss)."""


def tokens_bar(value: float | None, best: float | None, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of block characters, ``width`` cells for ``best``, eighths resolution."""
    if value is None or not best or best <= 0:
        return ""
    eighths = max(0, round(value / best * width * 8))
    full, rest = divmod(min(eighths, width * 8), 8)
    return "█" * full + (_EIGHTHS[rest] if rest else "")


def render_table(report: RunReport, details: bool = True) -> str:
    """The throughput per mode, the plan's verdict and the findings; with ``details`` (a
    library caller's default; ``run --details``) also the setup, where the time goes, the
    tokens/s chart, the losses, each mode's notes and the price check."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from gbdoctor.report.table import plain_text, recording_console

    console = recording_console()
    console.print(Text("gbdoctor run", style="bold"))
    if details:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column(overflow="fold")
        for label, value in header_fields(report):
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
    columns: list[tuple[str, Literal["left", "right"]]] = [
        ("mode", "left"),
        ("status", "left"),
        ("tok/s", "right"),
        ("step s", "right"),
        ("x eager", "right"),
        ("", "left"),
        ("x best", "right"),
        ("", "left"),
    ]
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    for m in report.modes:
        style = (
            "red"
            if m.status != ModeStatus.OK
            else ("yellow" if m.recompiles or m.diverged else "green")
        )
        table.add_row(
            Text(mode_label(m, report), style=style),
            Text(_short_status(m)),
            fmt_tokens(m.tokens_per_s),
            fmt_spread(m),
            ratio_range(m.speedup_vs_eager, m.speedup_vs_eager_range),
            verdict_text(m.verdict_vs_eager),
            ratio_range(m.speedup_vs_best_baseline, m.speedup_vs_best_baseline_range),
            verdict_text(m.verdict_vs_best_baseline),
        )
    console.print(table)
    if report.best_baseline:
        console.print(f"* best baseline: {report.best_baseline}")
    if report.plan_verdict:
        console.print(Text(f"plan: {report.plan_verdict}", style="bold"))
    if details:
        _render_details(report, console)
    _render_findings(report, console)
    if details:
        for note in report.notes:
            console.print(Text(f"note: {note}"))
        if report.price_check is not None:
            console.print(Text(run_price_check(report.price_check)))
    else:
        console.print(
            Text(
                "Details: --details (-v) for the setup, where the time goes, tokens/s, losses "
                "and notes; --format json|markdown|html for everything.",
                style="dim",
            )
        )
    return plain_text(console)


def _render_details(report: RunReport, console: Any) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

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
            fmt_num(m.forward_s),
            fmt_num(m.backward_s),
            fmt_num(m.optimizer_s),
            _opt_share(m),
            fmt_fixed(m.compile_time_s),
            fmt_fixed(m.compile_time_warm_s),
            fmt_fixed(m.peak_memory_mib, 0),
            str(m.graphs) if ok else "-",
            str(m.recompiles) if ok else "-",
            fmt_num(m.tflops_per_s, 2),
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
            chart.add_row(m.mode, bar, fmt_tokens(m.tokens_per_s))
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
            losses.add_row(
                m.mode, *cells, fmt_num(m.loss_rel_diff, 2), "YES" if m.diverged else "no"
            )
        console.print(losses)

    for m in report.modes:
        lines = mode_details(m)
        if lines:
            console.print(Text(m.mode, style="bold"))
            for line in lines:
                console.print(Text("  " + line))


def _render_findings(report: RunReport, console: Any) -> None:
    from rich.text import Text

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


def _opt_share(mode: ModeResult) -> str:
    forward, backward, optimizer = mode.forward_s, mode.backward_s, mode.optimizer_s
    if forward is None or backward is None or optimizer is None:
        return "-"
    total = forward + backward + optimizer
    if not total:
        return "-"
    return f"{optimizer / total:.0%}"


def _short_status(mode: ModeResult) -> str:
    if mode.status == ModeStatus.UNAVAILABLE:
        return "UNAVAILABLE"
    if mode.status != ModeStatus.OK:
        return "FAILED"
    if mode.recompiles:
        return "RECOMPILES"
    return "DIVERGED" if mode.diverged else "ok"
