"""What the HTML report's tests share (``test_html.py``, ``test_html_browser.py``): the distinct
breaks a scan JSON holds, counted from the file itself, and a run's records as ``gbdoctor run``
writes them."""

from __future__ import annotations

import json

from gbdoctor.records import ModeResult, RunReport


def distinct_breaks(data: dict) -> int:
    """Breaks of the captured blocks (``same_as`` null), once per kind: the JSON's distinct
    breaks, counted from the file itself."""
    per_kind: dict[str, set[str]] = {}
    for block in data["blocks"]:
        if block["same_as"] is None:
            seen = per_kind.setdefault(block["kind"], set())
            seen.update(json.dumps(b, sort_keys=True) for b in block["breaks"])
    return sum(len(s) for s in per_kind.values())


def run_report() -> RunReport:
    """A run's records, as ``gbdoctor run`` writes them (two modes, two rounds)."""
    eager = ModeResult(
        mode="eager",
        strategy="none",
        status="ok",
        step_times_s=(0.5, 0.52, 0.49, 0.51),
        step_time_median_s=0.505,
        step_time_min_s=0.49,
        step_time_max_s=0.52,
        tokens_per_s=1014.0,
        peak_memory_mib=812.5,
        losses=(10.4, 10.1, 9.8),
    )
    plan = ModeResult(
        mode="plan",
        strategy="plan",
        status="ok",
        step_times_s=(0.41, 0.4, 0.43, 0.42),
        step_time_median_s=0.415,
        step_time_min_s=0.4,
        step_time_max_s=0.43,
        tokens_per_s=1234.0,
        peak_memory_mib=790.0,
        compile_time_s=12.5,
        compile_time_warm_s=3.25,
        losses=(10.4, 10.11, 9.79),
        speedup_vs_eager=1.217,
        speedup_vs_eager_range=(1.1, 1.3),
        verdict_vs_eager="faster",
        plan_verified=True,
    )
    return RunReport(
        spec="fixtures/llama4_debug.toml",
        model="llama4/debugmodel",
        torch_version="2.13.0+cpu",
        device="cpu",
        backend="aot_eager",
        world_size=2,
        batch_size=2,
        seq_len=64,
        warmup=1,
        steps=2,
        seed=0,
        tokens_per_step=256,
        ac_mode="none",
        ac_option="op",
        modes=(eager, plan),
        rounds=2,
    )
