"""``gbdoctor run``'s report from per-rank measurements, without training: speedups with their
spread, loss divergence, duplicated modes, noise and busy-machine notes, the recompile log
parser, the CPU dtype choice and the tokens bar (``tests/run/test_run.py`` trains for real)."""

from __future__ import annotations

import math

import pytest
from repo_paths import FIXTURES
from run_specs import custom_run_spec as _spec

from gbdoctor.capture.recompiles import parse_recompile
from gbdoctor.frameworks.torchtitan_v02.strategies import STRATEGIES
from gbdoctor.records import RunContext, RunReport
from gbdoctor.report.run_formats import render_run, tokens_bar
from gbdoctor.run import RankRun, build_report, cpu_param_dtype, ratio_with_spread
from gbdoctor.setup.compile import shown_flags
from gbdoctor.spec import load_spec

RECOMPILE_LOG = """Recompiling function forward in /src/model.py:86
    triggered by the following guard failure(s):
    - 0/0: self.tag == 'a'                             # h = h * len(self.tag)  # src/model.py:89 in forward
    - User stack trace:
    -   File "/src/model.py", line 89, in forward
    -     h = h * len(self.tag)
    - 0/1: self.tag == 'b'          # h = h * len(self.tag)  # src/model.py:89 in forward (HINT: make it a tensor)
    - User stack trace:
    -   File "/src/model.py", line 89, in forward
    -     h = h * len(self.tag)"""


def test_cpu_without_bf16_matmuls_trains_in_float32():
    spec = load_spec(FIXTURES / "llama4_debug_ep2.toml")
    assert spec.training.mixed_precision_param == "bfloat16"
    cpu, note = cpu_param_dtype(spec, "cpu", cpu_has_bf16=False)
    assert cpu.training.mixed_precision_param == "float32" and "bf16 matmul" in note
    for device, has_bf16 in (("cpu", True), ("cuda", False)):
        same, note = cpu_param_dtype(spec, device, cpu_has_bf16=has_bf16)
        assert same is spec and note == ""


def test_parse_recompile_takes_the_newest_entry():
    rec = parse_recompile(RECOMPILE_LOG, step=4, measured=True)
    assert rec.function == "forward at /src/model.py:86"
    assert rec.reason == "self.tag == 'b'"
    assert rec.location == "/src/model.py:89"
    assert rec.hint == "make it a tensor"
    assert rec.failed_entries == 2 and rec.step == 4 and rec.measured
    odd = parse_recompile(
        "Recompiling function f in x.py:1\n    something else", step=0, measured=False
    )
    assert odd.reason == "something else" and odd.location is None


def _settings(**fields):
    """The settings a run of the ``_spec`` shape (2 x 16, one rank) trains with, ``fields`` set."""
    from gbdoctor.records import Clock, RunSettings

    base = {"device": "cpu", "backend": "aot_eager", "warmup": 1, "steps": 1, "rounds": 1}
    base |= {"batch_size": 2, "seq_len": 16, "seq_lens": (16,), "clock": Clock.WALL, "ranks": 1}
    return RunSettings(**(base | fields))


def _rank(times, losses, *, regions=(), warm=(2.0,), graphs=0, flags=()):
    """One rank's measurements; ``flags``: the Dynamo settings its setup ran under."""
    return RankRun(
        rank=0,
        warmup_times=list(warm),
        step_times=list(times),
        losses=list(losses),
        peak_memory_mib=100.0,
        memory_metric="cpu_peak_rss_process",
        graphs=graphs,
        graphs_measured=0,
        graph_breaks=0,
        dynamo_compile_s=0.5,
        recompiles=[],
        recompile_limit_hit=False,
        phase_times=[(t * 0.3, t * 0.5, t * 0.1) for t in times],
        layout=(("layers.0", tuple(regions), tuple(regions)),),
        dynamo_config=shown_flags(flags),
    )


def _trained(mode, strategy, times, losses, **rank):
    """``mode`` trained one round on one rank, under its strategy's Dynamo settings (a generic
    setup's are its strategy's)."""
    return (mode, strategy, [[_rank(times, losses, flags=strategy.flags, **rank)]], None, "")


def test_build_report_speedups_divergence_and_duplicates(tmp_path):
    spec = _spec(tmp_path, "planted.py", "clean")
    losses = [5.0, 4.9, 4.8]
    raw = [
        _trained("eager", STRATEGIES["none"], [1.0, 1.2, 0.8], losses),
        _trained(
            "titan-v0.2.0",
            STRATEGIES["titan-v0.2.0"],
            [0.5, 0.5, 0.6],
            [5.2, 4.9, 4.8],
            regions=("layers.0",),
        ),
        _trained(
            "block-fullgraph", STRATEGIES["block"], [0.4, 0.4, 0.45], losses, regions=("layers.0",)
        ),
        (
            "titan-v0.2.2",
            STRATEGIES["titan-v0.2.2"],
            None,
            ("warm-up step 0: boom", "runtime"),
            "",
        ),
    ]
    report = build_report(
        spec,
        raw,
        _settings(steps=3),
        RunContext(torch_version="x"),
    )
    by = {m.mode: m for m in report.modes}
    assert report.best_baseline == "block-fullgraph"
    assert by["eager"].step_time_median_s == 1.0 and by["eager"].tokens_per_s == pytest.approx(32.0)
    assert by["block-fullgraph"].speedup_vs_eager == pytest.approx(2.5)
    assert by["titan-v0.2.0"].speedup_vs_best_baseline == pytest.approx(0.8)
    assert by["eager"].compile_time_s == pytest.approx(1.0)  # warm-up 2.0 - 1 x median 1.0
    # 5.2 vs 5.0 is a 4% difference on step 0: over the 2% tolerance.
    assert by["titan-v0.2.0"].diverged and by["titan-v0.2.0"].loss_rel_diff == pytest.approx(0.04)
    assert not by["block-fullgraph"].diverged
    # Same compiled regions: the later mode names the earlier one and the differing Dynamo flags.
    assert by["block-fullgraph"].same_regions_as == "titan-v0.2.0"
    assert any("capture_scalar_outputs" in n for n in by["block-fullgraph"].notes)
    assert by["titan-v0.2.2"].status == "failed" and by["titan-v0.2.2"].speedup_vs_eager is None
    assert any("diverge" in f for f in report.findings)
    assert any(f.startswith("titan-v0.2.2 failed (runtime)") for f in report.findings)
    assert (
        by["block-fullgraph"].verdict_vs_eager == "no spread"
    )  # one round: never called a speedup
    assert any("single round" in n for n in report.notes)
    assert by["block-fullgraph"].forward_s == pytest.approx(0.4 * 0.3)
    nan = build_report(
        spec,
        [("eager", STRATEGIES["none"], [[_rank([1.0], [math.nan])]], None, "")],
        _settings(steps=1),
        RunContext(torch_version="x"),
    )
    assert nan.modes[0].diverged


# --------------------------------------------------------------------------- outputs


def test_tokens_bar_is_scaled_to_the_best():
    assert tokens_bar(100.0, 100.0, width=10) == "█" * 10
    assert tokens_bar(50.0, 100.0, width=10) == "█" * 5
    assert tokens_bar(55.0, 100.0, width=10) == "█" * 5 + "▌"
    assert tokens_bar(None, 100.0) == "" and tokens_bar(1.0, None) == ""
    assert isinstance(RunReport.has_findings, property)


def test_recorder_flags_the_recompile_limit_warning():
    import logging

    from gbdoctor.capture.recompiles import LIMIT_LOGGER, RECOMPILES_LOGGER, RecompileWatch

    recorder = RecompileWatch()
    recorder.tag(step=5, measured=True)
    warn = logging.LogRecord(
        LIMIT_LOGGER,
        logging.WARNING,
        __file__,
        1,
        "torch._dynamo hit config.recompile_limit (8)\n   function: 'forward'",
        None,
        None,
    )
    other = logging.LogRecord(
        LIMIT_LOGGER, logging.WARNING, __file__, 1, "something else", None, None
    )
    recompile = logging.LogRecord(
        RECOMPILES_LOGGER, logging.DEBUG, __file__, 1, RECOMPILE_LOG, None, None
    )
    recorder.emit(other)
    assert not recorder.limit_hit and recorder.records == []
    recorder.emit(warn)
    recorder.emit(recompile)
    assert recorder.limit_hit
    # The limit hit is a record of its own (DeepSpeed scans report it beside the recompiles).
    assert [(r.step, r.measured, r.reason, r.limit_hit) for r in recorder.records] == [
        (5, True, "unknown", True),
        (5, True, "self.tag == 'b'", False),
    ]
    assert recorder.records[0].hint == "hit config.recompile_limit (8)"


def _rounds_mode(mode, strategy, round_times):
    return (
        mode,
        STRATEGIES[strategy],
        [[_rank(times, [5.0] * len(times))] for times in round_times],
        None,
        "",
    )


def test_ratios_carry_their_round_spread_and_noise_is_never_a_speedup(tmp_path):
    spec = _spec(tmp_path, "planted.py", "clean")
    raw = [
        _rounds_mode("eager", "none", [[1.0, 1.0], [1.2, 1.2], [0.9, 0.9]]),
        # Faster in every round: 1/0.5, 1.2/0.7, 0.9/0.6 -> all above 1.
        _rounds_mode("titan-v0.2.0", "titan-v0.2.0", [[0.5, 0.5], [0.7, 0.7], [0.6, 0.6]]),
        # Faster overall but slower in round 2: within noise, not a speedup.
        _rounds_mode("titan-v0.2.2", "titan-v0.2.2", [[0.8, 0.8], [1.3, 1.3], [0.7, 0.7]]),
        # The plan: slower than the best baseline in every round.
        _rounds_mode("plan", "block", [[0.6, 0.6], [0.8, 0.8], [0.7, 0.7]]),
    ]
    report = build_report(
        spec,
        raw,
        _settings(backend="inductor", steps=2, rounds=3),
        RunContext(torch_version="x", plan_source="plan.json", plan_verified=True),
    )
    by = {m.mode: m for m in report.modes}
    v020, v022, plan = by["titan-v0.2.0"], by["titan-v0.2.2"], by["plan"]
    assert v020.round_medians_s == (0.5, 0.7, 0.6)
    # The median of the per-round ratios (2.0, 1.71, 1.5), inside its own spread.
    assert v020.speedup_vs_eager == pytest.approx(1.2 / 0.7)
    assert v020.speedup_vs_eager_range == pytest.approx((0.9 / 0.6, 1.0 / 0.5))
    assert v020.verdict_vs_eager == "faster"
    assert (
        v022.speedup_vs_eager > 1
        and v022.speedup_vs_eager_range[0] < 1 < v022.speedup_vs_eager_range[1]
    )
    assert v022.verdict_vs_eager == "within noise"
    assert report.best_baseline == "titan-v0.2.0"
    assert (
        plan.verdict_vs_best_baseline == "slower"
        and "slower than the best baseline" in report.plan_verdict
    )
    table = render_run(report, "table")
    assert "~ noise" in table and "faster" in table and "[1.50-2.00]" in table
    ratio, spread, verdict = ratio_with_spread(by["eager"], by["eager"])
    assert (ratio, spread, verdict) == (1.0, (1.0, 1.0), "")


def test_busy_machine_and_noisy_steps_are_noted(tmp_path):
    spec = _spec(tmp_path, "planted.py", "clean")
    raw = [("eager", STRATEGIES["none"], [[_rank([1.0, 3.5, 1.1], [5.0, 4.9, 4.8])]], None, "")]
    report = build_report(
        spec,
        raw,
        _settings(steps=3),
        RunContext(torch_version="x", load=(6.0, 2)),
    )
    assert any("machine was busy" in n for n in report.notes)
    assert any("vary 3.5x" in n for n in report.modes[0].notes)
    quiet = build_report(
        spec,
        raw,
        _settings(steps=3),
        RunContext(torch_version="x", load=(0.5, 2)),
    )
    assert not any("busy" in n for n in quiet.notes)
