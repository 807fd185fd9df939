"""``gbdoctor run``: each mode trains in fresh processes; recompiles, failures and outputs.

The process-spawning tests use tiny custom models (``fixtures/models``), aot_eager (the default,
inductor, is for measurements) and 1-3 steps. The report built from synthetic per-rank
measurements is tested in ``test_run_report.py``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from hashlib import sha256

import pandas as pd
import pytest
from repo_paths import FIXTURES
from run_specs import custom_run_spec as _spec

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.torchtitan_v02.strategies import STRATEGIES
from gbdoctor.records import LOSS_RTOL, RUN_SCHEMA_VERSION
from gbdoctor.records.io import dumps
from gbdoctor.report.run_formats import CSV_COLUMNS, render_run, write_csv
from gbdoctor.run import (
    benchmark_shape,
    report_from_json,
    resolve_modes,
    run_modes,
    run_settings,
)
from gbdoctor.spec import load_spec

MODELS = FIXTURES / "models"


@pytest.fixture(scope="module")
def pooled_when_run():
    """For each rank job of ``clean_run``'s modes: whether a shared pool would have run it."""
    return []


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory, pooled_when_run):
    from gbdoctor.run.worker import run_mode_rank
    from gbdoctor.setup import dist

    def run_ranks(target, *args, **kwargs):
        if target is run_mode_rank:
            pooled_when_run.append(dist._shared_pools is not None)
        return real_run_ranks(target, *args, **kwargs)

    real_run_ranks = dist.run_ranks
    spec = _spec(tmp_path_factory.mktemp("run"), "planted.py", "clean")
    calls: list[tuple[str, int, int]] = []
    # Inside a shared_ranks scope (the session's, or this one under GBDOCTOR_TEST_FRESH_RANKS=1).
    with pytest.MonkeyPatch.context() as patch, dist.shared_ranks():
        patch.setattr(dist, "run_ranks", run_ranks)
        report = run_modes(
            spec,
            run_settings(spec, steps=2, warmup=1, rounds=2, backend="aot_eager"),
            modes=["block-fullgraph", "eager"],
            progress=lambda msg, done, total: calls.append((msg, done, total)),
        )
    return report, calls


def test_run_trains_each_mode_on_fresh_ranks_inside_shared_ranks(clean_run, pooled_when_run):
    """run reports each mode's compile time and peak RSS, a new process's (run/rounds.py): no
    job of its rounds goes to a caller's pool, the test session's included."""
    assert pooled_when_run == [False] * 4  # 2 rounds x 2 modes


# --------------------------------------------------------------------------- real runs


def test_runner_measures_eager_and_block_fullgraph(clean_run):
    report, calls = clean_run
    assert [m.mode for m in report.modes] == ["eager", "block-fullgraph"]  # canonical order
    assert report.findings == ()
    assert (report.backend, report.device, report.world_size) == ("aot_eager", "cpu", 1)
    assert report.tokens_per_step == 2 * 16 and report.rounds == 2
    assert report.optimizer == "AdamW (fused)"  # torchtitan's default; torch has a fused CPU kernel
    eager, block = report.modes
    for m in report.modes:
        assert m.status == "ok" and m.error is None
        # 2 rounds x 2 measured steps; the warm-up and losses are the first round's.
        assert len(m.step_times_s) == 4 and len(m.round_medians_s) == 2
        assert len(m.warmup_times_s) == 1 and len(m.losses) == 3
        ordered = sorted(m.step_times_s)
        assert m.step_time_median_s == pytest.approx(
            (ordered[1] + ordered[2]) / 2
        )  # pooled over rounds
        # The phases are parts of the step.
        assert 0 < m.forward_s and 0 < m.backward_s and 0 <= m.optimizer_s
        assert m.forward_s + m.backward_s + m.optimizer_s <= m.step_time_max_s
        assert (
            m.compile_time_warm_s is not None and m.tflops_per_s > 0 and m.mfu is None
        )  # no CPU peak
        assert m.tokens_per_s > 0
        assert m.tokens_per_s == pytest.approx(report.tokens_per_step / m.step_time_median_s)
        assert m.step_time_min_s <= m.step_time_median_s <= m.step_time_max_s
        assert m.compile_time_s >= 0 and m.peak_memory_mib > 0
        assert m.memory_metric == "cpu_peak_rss_process"
        assert m.recompiles == 0 and not m.diverged
    assert eager.graphs == 0 and eager.regions == 0 and eager.speedup_vs_eager == 1.0
    assert eager.speedup_vs_eager_range == (1.0, 1.0) and eager.verdict_vs_eager == ""
    lo, hi = block.speedup_vs_eager_range
    assert lo <= hi and block.verdict_vs_eager in ("faster", "slower", "within noise")
    assert (
        block.graphs >= 1
        and block.graphs_measured == 0
        and block.regions == block.fullgraph_regions == 2
    )
    assert report.best_baseline == "block-fullgraph" and block.speedup_vs_best_baseline == 1.0
    # The ratio is the median of the per-round ratios (here 2 rounds: their mean), so it lies
    # inside its own spread.
    per_round = [e / b for e, b in zip(eager.round_medians_s, block.round_medians_s)]
    assert block.speedup_vs_eager == pytest.approx(sum(per_round) / 2)
    assert lo <= block.speedup_vs_eager <= hi
    # Same seed, same data: compiled and eager losses agree within the documented tolerance.
    assert block.loss_rel_diff is not None and block.loss_rel_diff <= LOSS_RTOL
    assert block.losses == pytest.approx(eager.losses, rel=LOSS_RTOL)
    assert calls[-1][1:] == (4, 4) and any(
        "round 2/2: block-fullgraph" in msg for msg, _, _ in calls
    )
    # Alternating order: round 1 runs eager first, round 2 block-fullgraph first.
    order = [msg.split(": ")[1] for msg, _, _ in calls if msg.startswith("round")]
    assert order == ["eager", "block-fullgraph", "block-fullgraph", "eager"]


def test_recompiles_during_measured_steps_are_findings(tmp_path):
    spec = _spec(tmp_path, "recompiler.py", "tiny")
    # 1 warm-up + 3 measured steps: 4 compiles per frame, below recompile_limit (8).
    report = run_modes(
        spec,
        run_settings(spec, steps=3, warmup=1, rounds=1, backend="aot_eager"),
        modes=["block-fullgraph"],
    )
    (mode,) = report.modes
    assert mode.status == "ok"
    assert mode.recompiles >= 3  # at least one per measured step
    assert mode.graphs_measured >= 3
    assert not mode.recompile_limit_hit
    measured = [e for e in mode.recompile_events if e.measured]
    assert len(measured) == mode.recompiles
    assert {e.step for e in measured} == {1, 2, 3}
    assert all("owner_tag ==" in e.reason for e in measured)
    assert any(
        e.location and e.location.startswith(str(MODELS / "recompiler.py") + ":") for e in measured
    )
    assert any("recompile" in f and "owner_tag" in f for f in report.findings)
    text = render_run(report, "table")
    assert "RECOMPILES" in text and "owner_tag ==" in text


def test_a_failing_mode_is_recorded_and_the_others_run(tmp_path):
    spec = _spec(tmp_path, "planted.py", "graph_break")
    report = run_modes(
        spec,
        run_settings(spec, steps=1, warmup=1, rounds=2, backend="aot_eager"),
        modes=["eager", "block-fullgraph"],
    )
    eager, block = report.modes
    assert eager.status == "ok" and eager.tokens_per_s > 0
    assert block.status == "failed" and block.error_kind == "graph-break"
    assert "graph_break()" in block.error and "\n" not in block.error
    assert block.error.startswith("warm-up step 0: ")
    assert len(eager.round_medians_s) == 2  # the failed mode is not retried, the others are
    assert block.tokens_per_s is None and block.speedup_vs_eager is None
    assert report.best_baseline is None
    assert any(f.startswith("block-fullgraph failed (graph-break)") for f in report.findings)
    assert "FAILED" in render_run(report, "table")


def test_a_baseline_hitting_a_known_upstream_bug_runs_under_its_workaround():
    """The spec's per-op SAC with FSDP + EP fails eager's first step with pytorch/torchtitan#3427
    (real torch, real SAC replay): the run retries the baseline with the issue's config workaround
    and says so, instead of leaving every baseline FAILED."""
    spec = load_spec(FIXTURES / "llama4_debug_ep2.toml")
    assert spec.activation_checkpoint.mode == "selective"
    report = run_modes(
        spec,
        run_settings(
            spec, steps=1, warmup=1, rounds=1, backend="aot_eager", batch_size=1, seq_len=32
        ),
        modes=["eager"],
        make_plan=False,
    )
    (eager,) = report.modes
    assert eager.status == "ok" and eager.tokens_per_s > 0
    assert "activation_checkpoint.mode=full" in eager.workaround
    assert "pytorch/torchtitan/issues/3427" in eager.workaround
    text = render_run(report, "table")
    assert "eager (workaround)" in text and "3427" in text
    # A plan is keyed by the spec's own block kinds (their AC labels): it is never retried
    # under another AC mode, and an error that is no known bug is never retried at all.
    from gbdoctor.run.measure import known_bug_workaround

    error = eager.workaround.split("(", 1)[0]
    plan_like = replace(STRATEGIES["titan-v0.2.2"], per_kind=(("moe+sac", STRATEGIES["none"].moe),))
    bug = (
        "profiler._record_function_enter_new.default invocation index 3 encountered during "
        "backward but not found in storage"
    )
    assert known_bug_workaround(bug, STRATEGIES["none"]) is not None
    assert known_bug_workaround(bug, plan_like) is None
    assert known_bug_workaround(error, STRATEGIES["none"]) is None


# The 0.5 s deadline is shorter than a rank's start (spawn, import torch), so the mode times out
# on fresh ranks; the session's warm ranks (tests/conftest.py) could finish it in time.
@pytest.mark.fresh_ranks
def test_a_timeout_is_a_failed_mode(tmp_path):
    spec = _spec(tmp_path, "planted.py", "clean", extra="timeout_s = 0.5\n")
    report = run_modes(
        spec, run_settings(spec, steps=1, warmup=1, rounds=1, backend="aot_eager"), modes=["eager"]
    )
    (mode,) = report.modes
    assert mode.status == "failed" and mode.error_kind == "timeout"
    assert "did not finish" in mode.error


@pytest.mark.fresh_ranks  # as above
def test_run_exits_3_when_a_mode_timed_out(tmp_path):
    """The table is still printed, but the comparison did not happen: exit 3, mode named."""
    from typer.testing import CliRunner

    from gbdoctor.cli import app

    spec = _spec(tmp_path, "planted.py", "clean", extra="timeout_s = 0.5\n")
    args = ["run", str(spec.path), "--modes", "eager", "--steps", "1", "--warmup", "1"]
    args += ["--rounds", "1", "--backend", "aot_eager", "--no-plan"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 3, result.output
    assert "Error: mode eager failed (timeout)" in result.output


def test_plan_mode_runs_the_plan_file_and_marks_an_unverified_plan(tmp_path):
    from gbdoctor.plan import KindPlan, Plan, dump_plan

    spec = _spec(tmp_path, "planted.py", "clean")
    # A plan for this model's two block kinds (layer-selective AC wraps every 2nd block), each
    # compiled whole with fullgraph. A plan must cover exactly the model's kinds (issue 18).
    kinds = tuple(
        KindPlan(kind=kind, layers=(layer,), mode="block", fullgraph=True)
        for kind, layer in (("dense", "layers.0"), ("dense+ac", "layers.1"))
    )
    plan = Plan(
        spec=spec.path,
        model="custom/clean",
        torch_version="x",
        baseline_strategy="titan-v0.2.0",
        flags=(),
        flag_costs=(),
        kinds=kinds,
        verified=False,
        rounds=1,
    )
    path = tmp_path / "plan.json"
    path.write_text(dump_plan(plan))
    seen = []
    report = run_modes(
        spec,
        run_settings(spec, steps=1, warmup=1, rounds=1, backend="aot_eager"),
        modes=["plan"],
        plan_path=str(path),
        on_plan=seen.append,
    )
    (mode,) = report.modes
    assert seen == [plan]
    assert (mode.mode, mode.strategy, mode.status) == ("plan", "plan", "ok")
    assert mode.fullgraph_regions == 2 and mode.graphs >= 1
    assert report.best_baseline is None and mode.speedup_vs_best_baseline is None
    # An unverified plan still runs, and says so.
    assert (
        report.plan_source == f"plan.json sha256:{sha256(path.read_bytes()).hexdigest()[:16]}"
        and report.plan_verified is False
        and mode.plan_verified is False
    )
    assert any("did NOT verify" in n for n in mode.notes)
    assert "plan (unverified)" in render_run(report, "table")


def test_run_makes_and_verifies_the_plan_itself(tmp_path):
    """No --plan: the planner (the same one as `gbdoctor plan`) runs first, its progress shows, and the
    plan mode runs what it proposed."""
    from gbdoctor.plan import plan_strategy

    spec = _spec(tmp_path, "planted.py", "graph_break")
    calls, plans = [], []
    report = run_modes(
        spec,
        run_settings(spec, steps=1, warmup=1, rounds=1, backend="aot_eager"),
        modes=["plan"],
        progress=lambda msg, done, total: calls.append(msg),
        on_plan=plans.append,
    )
    (plan,) = plans
    assert any(msg.startswith("plan: baseline scan") for msg in calls)
    assert any(msg.startswith("plan: strict verification") for msg in calls)
    assert (
        report.plan_source.startswith("made by this run") and report.plan_verified == plan.verified
    )
    # The planted explicit break is isolated: the plan leaves the breaking child eager, so fullgraph holds.
    (mode,) = report.modes
    assert mode.status == "ok" and mode.graphs >= 1
    strategy = plan_strategy(plan, spec)
    assert any(recipe.mode == "children" for _, recipe in strategy.per_kind)
    assert report.plan_kinds and all(":" in line for line in report.plan_kinds)


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_a_spec_error_before_any_process(tmp_path):
    spec = _spec(tmp_path, "planted.py", "clean")
    with pytest.raises(SpecError, match="--nproc 2 does not match the spec's world size 1"):
        run_settings(spec, steps=5, nproc=2)
    with pytest.raises(SpecError, match="unknown run mode"):
        run_modes(spec, run_settings(spec, steps=5), modes=["eager", "turbo"])
    with pytest.raises(SpecError, match="conflicts with --no-plan"):
        run_modes(spec, run_settings(spec, steps=5), modes=["plan"], make_plan=False)
    with pytest.raises(SpecError, match="conflicts with --no-plan"):
        run_modes(spec, run_settings(spec, steps=5), plan_path="plan.json", make_plan=False)
    with pytest.raises(SpecError, match="--rounds"):
        run_settings(spec, steps=5, rounds=0)
    with pytest.raises(SpecError, match="--warmup"):
        run_settings(spec, steps=5, warmup=0)
    with pytest.raises(SpecError, match="unknown compile backend"):
        run_settings(spec, steps=5, backend="no-such-backend")


def test_default_modes_include_the_plan_unless_no_plan():
    assert resolve_modes(None, plan=True) == [
        "eager",
        "titan-v0.2.0",
        "titan-v0.2.2",
        "block-fullgraph",
        "plan",
    ]
    assert resolve_modes(None, plan=False) == [
        "eager",
        "titan-v0.2.0",
        "titan-v0.2.2",
        "block-fullgraph",
    ]
    assert resolve_modes(["plan", "eager"], plan=True) == ["eager", "plan"]


def test_benchmark_shape(tmp_path):
    spec = _spec(tmp_path, "planted.py", "clean")  # [training] 2 x 16
    assert benchmark_shape(spec, "cuda", None, None)[:2] == (2, 16)
    assert benchmark_shape(spec, "cpu", None, None)[:2] == (2, 16)  # capped at [training]
    big = load_spec("fixtures/llama4_debug_ep2.toml")  # [training] 8 x 2048
    b, s, why = benchmark_shape(big, "cpu", None, None)
    assert (b, s) == (4, 256) and "dominate" in why
    assert benchmark_shape(big, "cuda", None, None)[:2] == (8, 2048)
    assert benchmark_shape(big, "cpu", 2, None)[:2] == (2, 256)


# --------------------------------------------------------------------------- parsing, report


def test_json_csv_table_and_markdown(clean_run, tmp_path):
    report, _ = clean_run
    text = render_run(report, "json")
    assert text == dumps(report) and text == render_run(
        report, "json"
    )  # byte-stable for one report
    data = json.loads(text)
    assert data["schema_version"] == RUN_SCHEMA_VERSION and [m["mode"] for m in data["modes"]] == [
        "eager",
        "block-fullgraph",
    ]
    assert {
        "tokens_per_s",
        "step_time_median_s",
        "compile_time_s",
        "peak_memory_mib",
        "graphs",
        "recompiles",
        "recompile_events",
        "losses",
        "speedup_vs_eager",
        "speedup_vs_eager_range",
        "verdict_vs_eager",
        "speedup_vs_best_baseline",
        "forward_s",
        "backward_s",
        "optimizer_s",
        "mfu",
        "workaround",
    } <= set(data["modes"][0])
    assert report_from_json(text) == report
    # A version-2 report (before ``workaround``) still reads.
    v2 = dict(data, schema_version=2)
    v2["modes"] = [{k: v for k, v in m.items() if k != "workaround"} for m in data["modes"]]
    assert report_from_json(json.dumps(v2)).modes[0].workaround == ""
    # A version-1 report (before rounds, spreads and the phase split) still reads.
    old = {k: v for k, v in data.items() if k not in {"rounds", "shape_note", "plan_kinds"}}
    old["schema_version"] = 1
    old["modes"] = [
        {
            k: v
            for k, v in m.items()
            if k not in {"round_medians_s", "forward_s", "verdict_vs_eager"}
        }
        for m in data["modes"]
    ]
    for mode in old["modes"]:  # nor did its recompile events have ``limit_hit``
        for event in mode["recompile_events"]:
            del event["limit_hit"]
    assert report_from_json(json.dumps(old)).modes[0].forward_s is None

    path = tmp_path / "out" / "run.csv"
    write_csv(report, path)
    frame = pd.read_csv(path)
    assert list(frame.columns) == list(CSV_COLUMNS)
    assert list(frame["mode"]) == ["eager", "block-fullgraph"] and (frame["tokens_per_s"] > 0).all()

    table = render_run(report, "table")
    assert "tokens/s" in table and "█" in table and "No findings" in table
    assert "| eager |" in render_run(report, "markdown")
    with pytest.raises(SpecError, match="unknown format"):
        render_run(report, "junit")
