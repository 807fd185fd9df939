"""The ``run`` report as markdown: the comparison table, for READMEs and PR comments."""

from __future__ import annotations

from gbdoctor.records import ModeStatus, RunReport
from gbdoctor.report.price_rows import run_price_check
from gbdoctor.report.run_cells import (
    fmt_fixed,
    fmt_num,
    fmt_spread,
    fmt_status,
    fmt_tokens,
    header_fields,
    mode_details,
    mode_label,
    ratio_range,
    verdict_text,
)


def _with_verdict(ratio: float | None, spread: tuple[float, float] | None, verdict: str) -> str:
    text = ratio_range(ratio, spread)
    return f"{text} {verdict_text(verdict)}" if verdict and ratio is not None else text


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: RunReport) -> str:

    lines = [f"### gbdoctor run: `{report.model}`", ""]
    lines += [
        f"- {label}: {_md_cell(value)}" if label else f"  - {_md_cell(value)}"
        for label, value in header_fields(report)
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
        name = mode_label(m, report).replace(" *", " (best)")
        ok = m.status == ModeStatus.OK
        phases = (
            " / ".join(fmt_num(x) for x in (m.forward_s, m.backward_s, m.optimizer_s))
            if ok
            else "-"
        )
        cells = (
            name,
            fmt_status(m),
            fmt_tokens(m.tokens_per_s),
            fmt_spread(m),
            _with_verdict(m.speedup_vs_eager, m.speedup_vs_eager_range, m.verdict_vs_eager),
            _with_verdict(
                m.speedup_vs_best_baseline,
                m.speedup_vs_best_baseline_range,
                m.verdict_vs_best_baseline,
            ),
            phases,
            fmt_fixed(m.compile_time_s)
            + (
                f" ({fmt_fixed(m.compile_time_warm_s)})"
                if m.compile_time_warm_s is not None
                else ""
            ),
            fmt_fixed(m.peak_memory_mib, 0),
            str(m.graphs) if ok else "-",
            str(m.recompiles) if ok else "-",
            fmt_num(m.tflops_per_s),
            "-" if m.mfu is None else f"{m.mfu:.1%}",
        )
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    if report.plan_verdict:
        lines += ["", f"**plan:** {_md_cell(report.plan_verdict)}"]
    extra = [(m.mode, line) for m in report.modes for line in mode_details(m)]
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
