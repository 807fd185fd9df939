"""Lay out a :class:`TimelineReport`: a rich table, a one-line strip per step, JSON, an SVG plot.

Computes nothing (``timeline.pattern`` does): every number shown is a field of the report.
``timeline_table`` and ``timeline_json`` are its renderers in :mod:`gbdoctor.report.formats`.
The SVG is written by hand (matplotlib is not a dependency); the HTML report can embed it or
draw its own from the JSON, which names every field it needs.
"""

from __future__ import annotations

import io
from xml.sax.saxutils import escape

from gbdoctor.records.io import dumps
from gbdoctor.records.timeline import TimelineGraph, TimelineReport, TimelineStep
from gbdoctor.report.formats import RenderOptions

STRIP_LEGEND = (
    "strip: R recompile, L recompile_limit hit, E eager fallback, B accumulation boundary, "
    "C first compile, . nothing"
)


def step_mark(step: TimelineStep) -> str:
    """One character for a step, the most telling first."""
    if any(c.limit_hit for c in step.compiles):
        return "L"
    if any(c.attempt > 0 for c in step.compiles):
        return "R"
    if step.eager_frames:
        return "E"
    if step.compiles:
        return "C"
    if step.boundary:
        return "B"
    return "."


def strip(report: TimelineReport) -> str:
    marks = "".join(step_mark(s) for s in report.steps)
    return f"steps 0-{len(report.steps) - 1}: {marks}"


def render_json(report: TimelineReport) -> str:
    return dumps(report)


def timeline_json(report: TimelineReport, options: RenderOptions) -> str:
    return render_json(report)


def timeline_table(report: TimelineReport, options: RenderOptions) -> str:
    """``--format table`` at its own fixed width (a step's phases need the columns);
    ``options.details``: the per-step table (``timeline --details``)."""
    return render_table(report, details=options.details)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def render_table(report: TimelineReport, *, width: int = 160, details: bool = True) -> str:
    """The run's setup, each step (``details``: a library caller's default, ``timeline
    --details``), the strip, the periods, the findings with their fixes and the verdict; without
    ``details`` the verdict comes right after the setup and the per-step table is left out."""
    from rich.console import Console
    from rich.table import Table

    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None)
    console.print(
        f"timeline of {report.spec}: {report.framework}, mode {report.mode} "
        f"(strategy {report.strategy}), backend {report.backend}, {report.device} x "
        f"{report.world_size}, torch {report.torch_version}, recompile_limit "
        f"{report.recompile_limit}, batch {report.batch_size} x seq "
        f"{'/'.join(map(str, report.seq_lens))}"
        + (
            f", gradient_accumulation_steps {report.accumulation_steps}"
            if report.accumulation_steps
            else ""
        ),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    if not details:
        # The answer first; the per-step table is the long part (one row per step).
        console.print(f"verdict: {report.verdict}", markup=False, highlight=False, soft_wrap=True)
    else:
        table = Table(show_edge=False)
        for col in ("step", "ms", "fwd", "bwd", "opt", "coll", "compile", "graphs", "cache", ""):
            table.add_column(col, justify="right" if col and col != "" else "left")
        for s in report.steps:
            events = []
            for c in s.compiles:
                if c.limit_hit:
                    events.append(f"LIMIT {c.frame}")
                elif c.attempt > 0:
                    events.append(f"recompile {c.frame}: {c.guard}")
            if any(c.attempt == 0 and not c.limit_hit for c in s.compiles):
                events.append(f"{sum(1 for c in s.compiles if c.attempt == 0)} first compile(s)")
            events += [f"eager {f}" for f in s.eager_frames]
            if s.boundary:
                events.append("accumulation boundary")
            table.add_row(
                str(s.step) + ("" if s.step >= report.warmup_steps else " w"),
                _ms(s.time_s),
                _ms(s.forward_s),
                _ms(s.backward_s),
                _ms(s.optimizer_s),
                _ms(s.collective_s) + (f" ({s.collective_calls})" if s.collective_calls else ""),
                _ms(s.compile_s),
                str(s.graph_runs),
                str(s.cache_entries),
                "; ".join(events)[:200],
            )
        console.print(table)
    console.print(
        strip(report) + f"   ({STRIP_LEGEND}; w: warm-up)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    for line in shape_lines(report):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    for p in report.periods:
        extra = []
        if p.amplitude_s is not None:
            extra.append(f"amplitude {_ms(p.amplitude_s)} ms")
        if p.confidence is not None:
            extra.append(f"autocorrelation {p.confidence:.2f}")
        console.print(
            f"period {p.k} (offset {p.offset}, from {p.source})"
            + (f": {', '.join(extra)}" if extra else ""),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    for f in report.findings:
        tag = "PROBLEM" if f.problem else "by design"
        console.print(
            f"[{tag}] {f.cause}: {f.summary or f.plain}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        if f.plain and f.summary:
            console.print(f"    {f.plain}", markup=False, highlight=False, soft_wrap=True)
        if f.fix is not None and (f.fix.config or f.fix.code):
            how = ", ".join(f"torch._dynamo.config.{k} = {v}" for k, v in f.fix.config)
            console.print(
                f"    fix: {how or f.fix.code}" + (f" ({f.fix.why})" if f.fix.why else ""),
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            if f.fix.config and f.fix.code:
                console.print(
                    f"    or in code: {f.fix.code}", markup=False, highlight=False, soft_wrap=True
                )
    if details:
        console.print(f"verdict: {report.verdict}", markup=False, highlight=False, soft_wrap=True)
    v = report.verification
    if v is not None:
        console.print(
            "with the fixes ("
            + ", ".join(f"{k}={val}" for k, val in v.applied)
            + f"): recompiles {v.before_recompiles} -> {v.after_recompiles}, limit hits "
            f"{v.before_limit_hits} -> {v.after_limit_hits}, eager steps {v.before_eager_steps} "
            f"-> {v.after_eager_steps}"
            + (
                ""
                if report.predicted
                else f", steady median {_ms(v.before_median_s or 0)} -> "
                f"{_ms(v.after_median_s or 0)} ms"
            )
            + "; "
            + ("pattern gone" if v.gone else "pattern NOT gone"),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        marks = "".join(step_mark(s) for s in v.after_steps)
        console.print(f"after the fixes: {marks}", markup=False, highlight=False, soft_wrap=True)
    for note in report.notes:
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    if not details:
        console.print(
            "Details: --details (-v) for the per-step table; --format json for everything.",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    return out.getvalue()


def shape_lines(report: TimelineReport) -> list[str]:
    """A ``--shapes`` run's graphs per frame: when each was compiled, what became dynamic and
    when, and how many distinct input shapes they ran at (one CUDA-graph recording each under
    ``mode="reduce-overhead"``); nothing without a stream."""
    if not report.shapes:
        return []
    how = "predicted from forwards at its distinct shapes" if report.predicted else "trained"
    lines = [f"shapes: {report.shapes} ({len(report.steps)} steps, {how})"]
    frames: dict[str, list[TimelineGraph]] = {}
    for g in report.graphs:
        frames.setdefault(g.frame, []).append(g)
    for frame, graphs in frames.items():
        dynamic = next((g for g in graphs if g.dynamic), None)
        became = (
            f"dynamic from step {dynamic.compiled_step}: {', '.join(dynamic.dynamic)}"
            if dynamic is not None
            else "every size static"
        )
        records = sum(len(g.shape_steps) for g in graphs)
        lines.append(
            f"  {frame}: {len(graphs)} graph(s), compiled in steps "
            f"{','.join(str(g.compiled_step) for g in graphs)}; {became}; {records} distinct "
            "input shape(s) = CUDA-graph recordings"
        )
    return lines


_COLORS = {
    "L": "#b00020",
    "R": "#e07000",
    "E": "#7b1fa2",
    "C": "#1565c0",
    "B": "#2e7d32",
    ".": "#9e9e9e",
}


def render_svg(report: TimelineReport) -> str:
    """Step times as bars (log scale would hide the pattern: linear, capped at the 90th
    percentile so a compile step does not flatten the rest), coloured by the step's mark."""
    steps = report.steps
    times = sorted(s.time_s for s in steps)
    cap = times[int(0.9 * (len(times) - 1))] * 1.5 if times else 1.0
    cap = cap or 1.0
    w, h, pad, bar = 40 + 22 * len(steps), 220, 30, 16
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 60}" '
        'font-family="sans-serif" font-size="10">',
        f'<text x="{pad}" y="14">{escape(report.spec)}: step time (ms), {escape(report.mode)}, '
        f"{escape(report.backend)}; bars capped at {cap * 1e3:.0f} ms</text>",
    ]
    for i, s in enumerate(steps):
        mark = step_mark(s)
        height = min(s.time_s, cap) / cap * h
        x, y = pad + 22 * i, 20 + h - height
        title = f"step {s.step}: {s.time_s * 1e3:.1f} ms ({mark})"
        parts.append(
            f'<rect x="{x}" y="{y:.1f}" width="{bar}" height="{height:.1f}" '
            f'fill="{_COLORS[mark]}"><title>{escape(title)}</title></rect>'
        )
        parts.append(f'<text x="{x + 4}" y="{h + 34}">{mark}</text>')
        parts.append(f'<text x="{x + 2}" y="{h + 48}">{s.step}</text>')
    parts.append(f'<text x="{pad}" y="{h + 60}">{escape(STRIP_LEGEND)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
