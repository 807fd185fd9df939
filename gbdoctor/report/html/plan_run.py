"""A plan and a run in HTML: before -> after per kind with the emitted config; throughput,
memory and compile time per mode with their spreads, and the loss curves, as charts."""

from __future__ import annotations

from gbdoctor.records import ModeResult, ModeStatus, Plan, RunReport, Verdict, span_of_layers
from gbdoctor.report.html.page import (
    KIND_COLORS,
    Chart,
    Page,
    Series,
    badge,
    fields,
    h,
    number,
    section,
    table,
    tag,
)
from gbdoctor.report.layout import one_line

__all__ = ["plan_article", "run_article"]

_BEFORE, _AFTER, _SPREAD = "#9aa5b1", "#2e7d32", "rgba(29,35,42,.75)"


def _list(items: tuple[str, ...]) -> str:
    return tag("ul", "".join(tag("li", h(item)) for item in items))


def _verified(ok: bool | None) -> str:
    if ok is None:
        return "-"
    return badge("verified", "good") if ok else badge("not verified", "bad")


def _stages(plan: Plan) -> str:
    """The plan per pipeline stage: whether the stages agree (the text table's line), then each
    stage's PP rank, layers, kinds, other modules, breaks and verification."""
    rows = [
        (
            h(f"{s.stage}"),
            h(f"{s.pp_rank}"),
            h(span_of_layers(s.layers)),
            h(", ".join(s.kinds) or "no block"),
            h(", ".join(s.modules + (("the loss",) if s.loss else ())) or "-"),
            h(f"{s.breaks_before} -> {s.breaks_after}"),
            _verified(s.verified),
        )
        for s in plan.stages
    ]
    summary = tag("p", h(plan.stage_lines()[0]))
    return summary + table(
        ("stage", "PP rank", "layers", "kinds", "also holds", "breaks", "verified"), rows
    )


def plan_article(page: Page, plan: Plan, doc: str, emitted: tuple[tuple[str, str], ...]) -> str:
    """The plan: its header, per kind before -> after (a chart and a table), the config."""
    head = fields(
        [
            ("spec", h(plan.spec)),
            ("model", h(plan.model)),
            ("torch", h(plan.torch_version)),
            ("framework", h(plan.framework)),
            ("baseline strategy", h(plan.baseline_strategy)),
            ("plan", _verified(plan.verified) + h(f" after {plan.rounds} round(s)")),
            ("simulated", h("yes (meta tensors, fake process group)" if plan.simulated else "no")),
            *(("Dynamo flag", h(f"{name} = {value}")) for name, value in plan.flags),
            *(("flag cost", h(cost)) for cost in plan.flag_costs),
            *(("note", h(note)) for note in plan.notes),
        ]
    )
    kinds = [k.kind for k in plan.kinds]
    charts = [
        Chart(
            "bar",
            "Graph breaks per block, before and after the plan",
            kinds,
            (
                Series("before", [k.breaks_before for k in plan.kinds], _BEFORE),
                Series("after", [k.breaks_after for k in plan.kinds], _AFTER),
            ),
            caption="(the verification scan's counts)",
            y_label="breaks per block",
        ),
        Chart(
            "bar",
            "Share of the block's ops in clean fullgraph regions",
            kinds,
            (
                Series("before", [k.fullgraph_share_before for k in plan.kinds], _BEFORE),
                Series("after", [k.fullgraph_share_after for k in plan.kinds], _AFTER),
            ),
            caption="(1 = the whole block is one fullgraph region)",
            y_label="share of ops",
        ),
    ]
    chart = tag("div", "".join(page.chart(c) for c in charts), class_="charts")
    rows = [
        (
            h(k.kind),
            h(f"{len(k.layers)}"),
            h(f"{k.mode}{' fullgraph' if k.fullgraph else ''}"),
            h(f"{k.breaks_before} -> {k.breaks_after}"),
            h(f"{k.events_before} -> {k.events_after}"),
            h(f"{k.fullgraph_share_before:.0%} -> {k.fullgraph_share_after:.0%}"),
            _verified(k.verified) + (tag("div", h(k.detail), class_="muted") if k.detail else ""),
            h(k.eager_summary() or "-"),
            h(k.cudagraphs or "-"),
            _list(k.reasons) if k.reasons else h(", ".join(k.actions) or "-"),
        )
        for k in plan.kinds
    ]
    body = table(
        (
            "kind",
            "layers",
            "compile",
            "breaks",
            "events",
            "fullgraph ops",
            "verified",
            "eager",
            "CUDA graphs",
            "why",
        ),
        rows,
    )
    parts = [
        head,
        section(f"{doc}-kinds", "Before -> after, per kind", chart + body),
    ]
    if plan.stages:
        parts.append(section(f"{doc}-stages", "Pipeline stages", _stages(plan)))
    extra = plan.framework_section()
    if extra is not None:
        described = [(label, h(value)) for label, value in extra.fields]
        remaining = [("remaining", h(item)) for item in extra.remaining]
        parts.append(section(f"{doc}-{extra.key}", extra.title, fields(described + remaining)))
    if plan.suggestions:
        parts.append(section(f"{doc}-suggestions", "Suggestions", _list(plan.suggestions)))
    for name, text in emitted:
        parts.append(
            section(
                f"{doc}-config-{name}",
                f"Emitted config ({name})",
                tag("pre", h(text), class_="config"),
            )
        )
    return "".join(parts)


def _mode_color(i: int) -> str:
    return KIND_COLORS[i % len(KIND_COLORS)]


def _spread(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return "-"
    if low is None or high is None:
        return number(value)
    return f"{number(value)} ({number(low)}..{number(high)})"


def _verdict(mode: ModeResult) -> str:
    if mode.speedup_vs_eager is None:
        return "-"
    low_high = mode.speedup_vs_eager_range
    text = f"{mode.speedup_vs_eager:.2f}x" + (
        f" ({low_high[0]:.2f}..{low_high[1]:.2f})" if low_high is not None else ""
    )
    tones: dict[str, str] = {Verdict.FASTER: "good", Verdict.SLOWER: "bad"}
    tone = tones.get(mode.verdict_vs_eager, "info")
    return h(text + " ") + (badge(mode.verdict_vs_eager, tone) if mode.verdict_vs_eager else "")


def run_article(page: Page, report: RunReport, doc: str) -> str:
    """The run: header, one row per mode, charts of step time / throughput / memory / compile
    time (spreads as the min..max over steps or rounds the report records), loss curves."""
    head = fields(
        [
            ("spec", h(report.spec)),
            ("model", h(report.model)),
            ("torch", h(report.torch_version)),
            ("device", h(report.device_name or report.device)),
            ("backend", h(report.backend)),
            ("ranks", h(report.world_size)),
            ("batch x seq", h(f"{report.batch_size} x {report.seq_len} per rank")),
            (
                "steps",
                h(f"{report.warmup} warm-up + {report.steps} measured, {report.rounds} round(s)"),
            ),
            ("optimizer", h(report.optimizer or "-")),
            ("plan", h(report.plan_source or "none") + " " + _verified(report.plan_verified)),
            *(("plan kind", h(line)) for line in report.plan_kinds),
            ("plan verdict", h(report.plan_verdict or "-")),
            *(("shape", h(report.shape_note)) for _ in [0] if report.shape_note),
            *(("note", h(note)) for note in report.notes),
        ]
    )
    modes = report.modes
    rows = [
        (
            tag("b", h(m.mode)) + tag("div", h(m.strategy), class_="muted"),
            badge(m.status, "good" if m.status == ModeStatus.OK else "bad")
            + (tag("div", h(one_line(m.error)), class_="muted") if m.error else ""),
            h(_spread(m.step_time_median_s, m.step_time_min_s, m.step_time_max_s)),
            h(number(m.tokens_per_s)),
            _verdict(m),
            h(number(m.peak_memory_mib)),
            h(f"{number(m.compile_time_s)} / {number(m.compile_time_warm_s)}"),
            h(f"{m.graphs} / {m.graph_breaks} / {m.recompiles}"),
            h(number(m.loss_rel_diff)) + (badge("diverged", "bad") if m.diverged else ""),
        )
        for m in modes
    ]
    table_html = table(
        (
            "mode",
            "status",
            "step s (min..max)",
            "tokens/s",
            "vs eager",
            "peak MiB",
            "compile s cold / warm",
            "graphs / breaks / recompiles",
            "loss diff",
        ),
        rows,
        numeric=(2, 3, 5, 6, 7, 8),
    )
    names = [m.mode for m in modes]
    step = [m.step_time_median_s for m in modes]
    step_range = [
        [m.step_time_min_s, m.step_time_max_s]
        if m.step_time_min_s is not None and m.step_time_max_s is not None
        else None
        for m in modes
    ]
    speed_range = [
        list(m.speedup_vs_eager_range) if m.speedup_vs_eager_range else None for m in modes
    ]
    charts = [
        Chart(
            "bar",
            "Step time per mode",
            names,
            (
                Series("median", step, KIND_COLORS[0]),
                Series("min..max over measured steps", step_range, _SPREAD, range=True),  # type: ignore[arg-type]
            ),
            y_label="seconds",
            unit="s",
        ),
        Chart(
            "bar",
            "Speed-up vs eager",
            names,
            (
                Series("eager / mode", [m.speedup_vs_eager for m in modes], KIND_COLORS[2]),
                Series("min..max over rounds", speed_range, _SPREAD, range=True),  # type: ignore[arg-type]
            ),
            caption="(> 1 is faster; a range containing 1 is within noise)",
            unit="x",
        ),
        Chart(
            "bar",
            "Throughput",
            names,
            (Series("tokens/s", [m.tokens_per_s for m in modes], KIND_COLORS[1]),),
            unit="tokens/s",
        ),
        Chart(
            "bar",
            "Peak memory",
            names,
            (Series("peak", [m.peak_memory_mib for m in modes], KIND_COLORS[3]),),
            caption=f"({modes[0].memory_metric})" if modes and modes[0].memory_metric else "",
            unit="MiB",
        ),
        Chart(
            "bar",
            "Compile time",
            names,
            (
                Series(
                    "first round (cold cache)", [m.compile_time_s for m in modes], KIND_COLORS[4]
                ),
                Series(
                    "later rounds (warm cache)",
                    [m.compile_time_warm_s for m in modes],
                    KIND_COLORS[5],
                ),
            ),
            unit="s",
        ),
    ]
    steps = max((len(m.losses) for m in modes), default=0)
    if steps:
        charts.append(
            Chart(
                "line",
                "Loss per step",
                [str(i) for i in range(steps)],
                tuple(
                    Series(m.mode, list(m.losses), _mode_color(i), type="line")
                    for i, m in enumerate(modes)
                    if m.losses
                ),
                caption=f"(warm-up steps first; first-step tolerance vs eager {report.loss_rtol})",
                x_label="step",
                y_label="loss",
                begin_at_zero=False,
            )
        )
    figures = tag("div", "".join(page.chart(c) for c in charts), class_="charts")
    parts = [
        head,
        section(f"{doc}-modes", "Modes", table_html),
        section(f"{doc}-charts", "Charts", figures),
    ]
    if report.findings:
        parts.append(section(f"{doc}-findings", "Findings", _list(report.findings)))
    return "".join(parts)
