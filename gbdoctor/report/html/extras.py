"""Sections of results that newer parts of gbdoctor add: the price of each break (a scan's
``price``, ``gbdoctor price``) and a training run step by step (``gbdoctor timeline``).

Their records are read by attribute (no import of their modules), so the page renders them when
a result carries them and this module stays importable while they are absent.
"""

from __future__ import annotations

from typing import Any

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

__all__ = ["break_price", "price_section", "timeline_article"]

_SPREAD = "rgba(29,35,42,.75)"


def _ms(value: float | None, spread: Any) -> str:
    if value is None:
        return "-"
    text = f"{number(value)} ms"
    return text + (f" ({number(spread[0])}..{number(spread[1])})" if spread else "")


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def break_price(price: Any, kind: str, brk: Any) -> str | None:
    """The price line of one distinct break (matched as the price records name it), or None."""
    location = str(brk.location) if brk.location is not None else ""
    for entry in price.breaks:
        if (entry.kind, entry.cause, entry.gb_type, entry.module, entry.location) == (
            kind,
            brk.cause,
            brk.gb_type,
            brk.module,
            location,
        ):
            free = badge("free here", "good") if entry.free else ""
            return h(
                f"{_ms(entry.ms_per_step, entry.spread_ms)} per step, {_share(entry.share)} "
                f"of the step ({entry.split})"
            ) + (" " + free if free else "")
    return None


def price_section(page: Page, price: Any, doc: str) -> str:
    """What each kind's breaks cost a step: a chart with spreads, and how it was measured."""
    kinds = list(price.kinds)
    chart = page.chart(
        Chart(
            "bar",
            "Price of each kind's breaks per training step",
            [k.kind for k in kinds],
            (
                Series("ms per step", [k.ms_per_step for k in kinds], KIND_COLORS[6]),
                Series(
                    "min..max over rounds",
                    [list(k.spread_ms) if k.spread_ms else None for k in kinds],
                    _SPREAD,
                    range=True,
                ),
            ),
            caption="(step as set up minus the step with the kind fixed)",
            unit="ms",
        )
    )
    rows = [
        (
            h(k.kind),
            h(k.layers),
            h(k.recipe),
            h(_ms(k.ms_per_step, k.spread_ms)),
            h(_share(k.share)),
            badge("free here", "good") if k.free else h(k.detail or ""),
        )
        for k in kinds
    ]
    how = fields(
        [
            (
                "measured",
                h(
                    f"{price.backend} on {price.device_name or price.device}, "
                    f"{price.world_size} rank(s), batch {price.batch_size} x seq {price.seq_len}, "
                    f"{price.warmup} warm-up + {price.steps} steps, {price.rounds} round(s)"
                ),
            ),
            ("step as set up", h(_ms(price.step_ms, price.step_spread_ms))),
            ("every fix at once", h(_ms(price.plan_ms, price.plan_spread_ms))),
            *(("note", h(note)) for note in price.notes),
        ]
    )
    body = chart + table(
        ("kind", "layers", "compared with", "price per step", "share", ""), rows, numeric=(1, 3, 4)
    )
    return section(f"{doc}-price", "Price of the breaks", how + body)


def timeline_article(page: Page, report: Any, doc: str) -> str:
    """A training run step by step: the phases of every step (compile time included) as a
    stacked chart, the periods found, the causes with their fixes, the frames."""
    head = fields(
        [
            ("spec", h(report.spec)),
            ("framework", h(report.framework)),
            ("mode", h(f"{report.mode} ({report.strategy}, {report.backend})")),
            ("device", h(f"{report.device}, {report.world_size} rank(s)")),
            ("torch", h(report.torch_version)),
            ("seq lengths", h(", ".join(map(str, report.seq_lens)))),
            ("recompile limit", h(report.recompile_limit)),
            ("warm-up steps", h(report.warmup_steps)),
            ("verdict", tag("b", h(report.verdict or "-"))),
            *(("note", h(note)) for note in report.notes),
        ]
    )
    steps = list(report.steps)
    labels = [str(s.step) for s in steps]
    phases = (
        ("forward", "forward_s", KIND_COLORS[0]),
        ("backward", "backward_s", KIND_COLORS[1]),
        ("optimizer", "optimizer_s", KIND_COLORS[2]),
    )
    chart = page.chart(
        Chart(
            "bar",
            "Step time, phase by phase",
            labels,
            (
                *(
                    Series(name, [getattr(s, key) for s in steps], color)
                    for name, key, color in phases
                ),
                Series("step", [s.time_s for s in steps], "#1d232a", type="line"),
                Series("compile", [s.compile_s for s in steps], KIND_COLORS[6], type="line"),
            ),
            caption="(slowest rank; compile: the Dynamo compile time the step recorded)",
            x_label="step",
            y_label="seconds",
            unit="s",
            stacked=True,
        )
    )
    periods = [
        (
            h(f"every {p.k} step(s), offset {p.offset}"),
            h(p.source),
            h("-" if p.amplitude_s is None else f"{number(p.amplitude_s)} s"),
            h(number(p.confidence)),
        )
        for p in report.periods
    ]
    findings = [
        (
            badge(f.cause, "bad" if f.problem else "info"),
            h(f.plain or f.summary),
            h(", ".join(map(str, f.steps))),
            tag("code", h(f.frame)) if f.frame else "-",
            h(_fix(f.fix)),
        )
        for f in report.findings
    ]
    frames = [
        (
            tag("code", h(fr.frame)),
            h(fr.compiles),
            h(fr.cache_size),
            h(", ".join(map(str, fr.recompile_steps)) or "-"),
            h("-" if fr.limit_hit_step is None else fr.limit_hit_step),
        )
        for fr in report.frames
    ]
    parts = [head, section(f"{doc}-steps", "Steps", chart)]
    if periods:
        parts.append(
            section(
                f"{doc}-periods",
                "Periods",
                table(("slow steps", "found from", "amplitude", "confidence"), periods),
            )
        )
    if findings:
        parts.append(
            section(
                f"{doc}-causes",
                "Why steps are slow",
                table(("cause", "in plain words", "steps", "frame", "fix"), findings),
            )
        )
    if frames:
        parts.append(
            section(
                f"{doc}-frames",
                "Compiled frames",
                table(
                    ("frame", "compiles", "cache entries", "recompiled at", "limit hit at"), frames
                ),
            )
        )
    check = report.verification
    if check is not None:
        parts.append(
            section(
                f"{doc}-verification",
                "With the fixes applied",
                (badge("gone", "good") if check.gone else badge("still there", "bad"))
                + table(
                    ("", "before", "after"),
                    [
                        (h("recompiles"), h(check.before_recompiles), h(check.after_recompiles)),
                        (h("limit hits"), h(check.before_limit_hits), h(check.after_limit_hits)),
                        (h("eager steps"), h(check.before_eager_steps), h(check.after_eager_steps)),
                        (
                            h("median step"),
                            h(number(check.before_median_s)),
                            h(number(check.after_median_s)),
                        ),
                    ],
                    numeric=(1, 2),
                ),
            )
        )
    return "".join(parts)


def _fix(fix: Any) -> str:
    if fix is None:
        return "-"
    config = ", ".join(f"{name} = {value}" for name, value in fix.config)
    return "; ".join(part for part in (fix.code, config, fix.why) if part)
