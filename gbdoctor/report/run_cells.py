"""The cells and lines the ``run`` report's table and markdown both show: numbers, tokens/s, ratio
spreads and verdicts, a mode's status and name, the header fields and each mode's details."""

from __future__ import annotations

from collections import Counter

from gbdoctor.records import ModeResult, ModeStatus, RunReport, Verdict


def fmt_num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def fmt_fixed(value: float | None, places: int = 2) -> str:
    return "-" if value is None else f"{value:.{places}f}"


def fmt_tokens(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def fmt_spread(mode: ModeResult) -> str:
    if mode.step_time_median_s is None:
        return "-"
    return f"{mode.step_time_median_s:.3f} [{mode.step_time_min_s:.3f}-{mode.step_time_max_s:.3f}]"


def fmt_status(mode: ModeResult) -> str:
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


def header_fields(report: RunReport) -> list[tuple[str, str]]:
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


def mode_details(mode: ModeResult) -> list[str]:
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
    if mode.cudagraph_rerecords:
        lines.append(f"inductor re-recorded cudagraphs {len(mode.cudagraph_rerecords)} time(s):")
        lines += [f"  {n} x {why}" for why, n in sorted(Counter(mode.cudagraph_rerecords).items())]
    if mode.diverged:
        rel = (
            f"relative difference {mode.loss_rel_diff:.2g}"
            if mode.loss_rel_diff is not None
            else "non-finite loss"
        )
        lines.append(f"losses diverge from eager ({rel})")
    lines.extend(mode.notes)
    return lines


def mode_label(mode: ModeResult, report: RunReport) -> str:
    name = mode.mode + (" *" if mode.mode == report.best_baseline else "")
    name += " (workaround)" if mode.workaround else ""
    return name + (" (unverified)" if mode.plan_verified is False else "")


def ratio_range(ratio: float | None, spread: tuple[float, float] | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" + (f" [{spread[0]:.2f}-{spread[1]:.2f}]" if spread else "")


_VERDICT_TEXT: dict[str, str] = {Verdict.WITHIN_NOISE: "~ noise", Verdict.NO_SPREAD: "(1 round)"}


def verdict_text(verdict: str) -> str:
    return _VERDICT_TEXT.get(verdict, verdict)
