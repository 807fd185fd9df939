"""``gbdoctor price``'s arithmetic and what the other commands do with prices, on synthetic
reports (no training): the rows and totals, ``diff`` on a price rise, ``plan``'s predicted gains,
``run --price``'s check and its clock, and a scan without breaks priced without training. The
priced command end to end is ``test_price.py``'s.
"""

from __future__ import annotations

import pytest
from repo_paths import FIXTURES

from gbdoctor.records import BreakPrice, Counterfactual, KindPrice, PriceReport, PriceSplit
from gbdoctor.report.json import load_scan_json
from gbdoctor.report.price_rows import break_rows, cause_totals, price_check, run_price_check


def _price(**fields):
    """A synthetic PriceReport: the measurement fields every unit test shares, then ``fields``."""
    return PriceReport(
        **{
            "backend": "inductor",
            "device": "cpu",
            "device_name": "cpu",
            "world_size": 1,
            "rounds": 2,
            "warmup": 1,
            "steps": 1,
            "batch_size": 1,
            "seq_len": 1,
            "step_ms": 100.0,
            "step_spread_ms": (90.0, 110.0),
            **fields,
        }
    )


def test_rows_rank_the_most_expensive_break_first_and_the_check_adds_up():
    def brk(ms, cause):
        return BreakPrice(
            kind="moe",
            cause=cause,
            gb_type="t",
            gb_id=None,
            location="m.py:1",
            module="m",
            ms_per_step=ms,
            spread_ms=None if ms is None else (ms, ms),
            share=None if ms is None else ms / 100,
            split=PriceSplit.EAGER_TIME,
        )

    price = _price(
        kinds=(
            KindPrice(
                kind="moe",
                layers=2,
                counterfactual=Counterfactual.PLAN_FIX,
                recipe="r",
                ms_per_step=30.0,
                spread_ms=(20.0, 40.0),
                share=0.3,
            ),
            KindPrice(
                kind="dense",
                layers=2,
                counterfactual=Counterfactual.EAGER,
                recipe="eager",
                ms_per_step=-5.0,
                spread_ms=(-9.0, 1.0),
                share=-0.05,
                free=True,
            ),
        ),
        breaks=(brk(1.0, "a"), brk(None, "b"), brk(29.0, "c")),
        plan_ms=24.0,
        plan_spread_ms=(20.0, 28.0),
    )
    assert [row[1] for row in break_rows(price)] == ["c", "a", "b"]
    assert "add up to 25.0 ms/step" in price_check(price) and "gained 24.0" in price_check(price)
    assert cause_totals(price) == "Price by cause: c 29.0 ms/step, a 1.0 ms/step."


def test_diff_fails_on_a_price_rise_beyond_threshold_and_spreads_only():
    from dataclasses import replace

    from gbdoctor.gate.prices import price_findings
    from gbdoctor.records import ScanReport, SetupInfo, Severity

    def scan(ms, spread, device="cpu"):
        kind = KindPrice(
            kind="moe",
            layers=3,
            counterfactual=Counterfactual.PLAN_FIX,
            recipe="r",
            ms_per_step=ms,
            spread_ms=spread,
        )
        price = _price(device=device, world_size=2, kinds=(kind,), breaks=())
        setup = SetupInfo(
            strategy="block",
            device=device,
            world_size=2,
            ep_degree=1,
            dp_shard=2,
            ac_mode="none",
            ac_option="",
            fsdp=True,
        )
        return ScanReport(
            spec="s.toml", model="m", torch_version="2.13.0", setup=setup, blocks=(), price=price
        )

    def severity(old, new):
        (finding,) = price_findings(old, new, "s.toml", 20.0)
        return finding.severity, finding.what

    base = scan(10.0, (9.0, 11.0))
    assert severity(base, scan(30.0, (28.0, 32.0)))[0] == Severity.REGRESSION
    # Above the threshold but the spreads overlap: noise, not a regression.
    sev, what = severity(base, scan(12.5, (10.5, 14.0)))
    assert sev == Severity.INFO and "within the spread" in what
    assert severity(scan(30.0, (28.0, 32.0)), base)[0] == Severity.IMPROVEMENT
    sev, what = severity(base, scan(30.0, (28.0, 32.0), device="cuda"))
    assert sev == Severity.WARNING and "cpu and on cuda" in what
    sev, what = severity(base, replace(base, price=None))
    assert sev == Severity.WARNING and "only one" in what


def test_plan_shows_each_kinds_predicted_gain_from_a_priced_scan():
    from plan_factory import make_plan

    from gbdoctor.records import KindPlan
    from gbdoctor.report.plan_table import predicted_gains, render_plan_table

    plan = make_plan(
        KindPlan(kind="moe", layers=("layers.1",), mode="children", fullgraph=True),
        KindPlan(kind="dense", layers=("layers.0",), mode="block", fullgraph=True),
    )
    price = _price(
        world_size=2,
        kinds=(
            KindPrice(
                kind="moe",
                layers=1,
                counterfactual=Counterfactual.PLAN_FIX,
                recipe="r",
                ms_per_step=30.0,
                spread_ms=(20.0, 40.0),
                share=0.3,
            ),
        ),
        breaks=(),
    )
    moe, dense = predicted_gains(plan, price)
    assert moe.startswith("  moe: predicted gain 30.0 [20.0 to 40.0] ms/step, 30.0% of the step")
    assert "plan-fix on cpu (inductor)" in moe
    assert dense.startswith("  dense: predicted gain: no price")
    assert moe in render_plan_table(plan, price)


def test_plan_refuses_a_price_file_without_prices():
    from typer.testing import CliRunner

    from gbdoctor.cli import app

    result = CliRunner().invoke(
        app,
        [
            "plan",
            str(FIXTURES / "llama4_debug.toml"),
            "--price",
            str(FIXTURES / "scans" / "llama4_before.json"),
        ],
    )
    assert result.exit_code == 2
    assert "a scan without prices" in result.output


def _priced_kinds(*prices: tuple[float, tuple[float, float]]):
    return tuple(
        KindPrice(
            kind=f"k{i}",
            layers=1,
            counterfactual=Counterfactual.PLAN_FIX,
            recipe="r",
            ms_per_step=ms,
            spread_ms=spread,
        )
        for i, (ms, spread) in enumerate(prices)
    )


def _run_of(base_rounds_s, plan_rounds_s, cpu_rounds_s=((), ()), **fields):
    from gbdoctor.records import ModeResult, RunReport

    def mode(name, rounds, cpu_rounds):
        return ModeResult(
            mode=name,
            strategy=name,
            status="ok",
            round_medians_s=rounds,
            round_cpu_medians_s=cpu_rounds,
        )

    return RunReport(
        **{
            "spec": "s.toml",
            "model": "m",
            "torch_version": "2.13.0",
            "device": "cpu",
            "backend": "inductor",
            "world_size": 1,
            "batch_size": 1,
            "seq_len": 1,
            "warmup": 1,
            "steps": 1,
            "seed": 0,
            "tokens_per_step": 1,
            "ac_mode": "none",
            "ac_option": "",
            "modes": (
                mode("as-priced", base_rounds_s, cpu_rounds_s[0]),
                mode("plan", plan_rounds_s, cpu_rounds_s[1]),
            ),
            **fields,
        }
    )


def _scan_priced(price):
    from dataclasses import replace

    base = load_scan_json(FIXTURES / "scans" / "llama4_before.json")
    return replace(base, setup=replace(base.setup, strategy="titan-v0.2.0"), price=price)


def test_run_sets_the_predicted_gain_beside_the_measured_one():
    """The kinds' prices add up to the prediction (spread: the sums of their ends); the measured
    gain is the median of the per-round differences, paired within each round."""
    from gbdoctor.price.check import price_check

    priced = _scan_priced(
        _price(kinds=_priced_kinds((20.0, (10.0, 30.0)), (5.0, (4.0, 6.0))), breaks=())
    )
    check = price_check(_run_of((0.130, 0.125, 0.140), (0.100, 0.105, 0.110)), priced)
    assert (check.predicted_ms, check.predicted_spread_ms) == (25.0, (14.0, 36.0))
    assert (check.measured_ms, check.measured_spread_ms) == (30.0, (20.0, 30.0))
    assert check.ratio == pytest.approx(25 / 30, abs=0.01) and check.consistent
    far = price_check(_run_of((0.200, 0.200), (0.100, 0.100)), priced)  # 100 ms measured
    assert far.measured_ms == 100.0 and far.consistent is False
    # As set up ran at 200 ms here, 100 ms when priced: a drift as large as the disagreement.
    assert "ran 200.0 ms per step here and 100.0 ms when priced (+100.0 ms)" in far.detail
    assert "NOT consistent" in run_price_check(far) and far.detail in run_price_check(far)
    steady = price_check(_run_of((0.100, 0.100), (0.0, 0.0)), priced)  # same speed as priced
    assert steady.consistent is False and steady.detail == ""
    differs = price_check(_run_of((0.2,), (0.1,), batch_size=8), priced)
    assert differs.measured_ms is None and "batch 8 here, 1 when priced" in differs.detail
    assert "--batch-size 1 --seq-len 1" in differs.detail


def test_prices_in_cpu_time_are_checked_against_the_runs_cpu_time():
    """A price measured with ``--clock cpu`` is set beside the run's CPU-time rounds, never its
    wall-clock ones (which a busy machine moves by more than the price)."""
    from dataclasses import replace

    from gbdoctor.price.check import price_check
    from gbdoctor.records import Clock

    kinds = _priced_kinds((20.0, (10.0, 30.0)), (5.0, (4.0, 6.0)))
    priced = _scan_priced(replace(_price(kinds=kinds, breaks=()), clock=Clock.CPU))
    wall, cpu = ((0.900, 0.400), (0.500, 0.800)), ((0.130, 0.125), (0.100, 0.105))
    check = price_check(_run_of(*wall, cpu_rounds_s=cpu), priced)
    assert check.clock == Clock.CPU and (check.measured_ms, check.consistent) == (25.0, True)
    assert "Price check (CPU time):" in run_price_check(check)
    in_wall = price_check(
        _run_of(*wall, cpu_rounds_s=cpu), _scan_priced(_price(kinds=kinds, breaks=()))
    )
    assert in_wall.clock == Clock.WALL and in_wall.measured_ms == 0.0


def test_price_in_cpu_time_is_refused_off_cpu(monkeypatch):
    """``--clock cpu`` measures the host's work: on a CUDA device it is bad input (exit 2),
    refused when the settings are built, before the scan."""
    from gbdoctor.errors import SpecError
    from gbdoctor.records import Clock
    from gbdoctor.run.settings import run_settings
    from gbdoctor.setup import dist

    monkeypatch.setattr(dist, "resolve_device", lambda device: "cuda")
    from gbdoctor.spec import load_spec

    spec = load_spec(FIXTURES / "llama3_debug.toml")
    with pytest.raises(SpecError, match="--clock cpu measures the host's work, not the cuda"):
        run_settings(spec, steps=3, clock=Clock.CPU)
    assert run_settings(spec, steps=3, clock=Clock.WALL).device == "cuda"


def test_a_scan_without_breaks_is_priced_without_training():
    """Nothing to price: no mode trains, and the empty price still records its clock."""
    from dataclasses import replace

    from plan_factory import make_plan

    from gbdoctor.price.driver import price_scan
    from gbdoctor.records import Clock
    from gbdoctor.run.settings import run_settings
    from gbdoctor.spec import load_spec

    scan = load_scan_json(FIXTURES / "scans" / "llama4_before.json")
    clean = replace(
        scan,
        setup=replace(scan.setup, strategy="titan-v0.2.0"),
        blocks=tuple(replace(b, breaks=()) for b in scan.blocks),
    )
    spec = load_spec(FIXTURES / "llama4_debug.toml")
    settings = run_settings(spec, steps=3, clock=Clock.CPU)
    priced = price_scan(spec, clean, make_plan(), settings).price
    assert priced is not None and priced.clock == Clock.CPU and priced.kinds == ()
    assert "no block kind has a graph break: nothing to price" in priced.notes
