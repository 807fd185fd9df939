"""``gbdoctor timeline`` on the fixtures that reproduce each pattern for real (aot_eager, CPU).

Each test trains its fixture twice (as written, then with the proposed fixes: ``fix=True``), so
each takes tens of seconds: one run per pattern is the point of the feature (the names of the
fixtures appear only here; detection reads Dynamo's records). Step times are not asserted
(benchmarks/timeline.py measures them with inductor); events, guards, periods and fixes are.
"""

from __future__ import annotations

import json

import pytest
from repo_paths import FIXTURES

from gbdoctor.records.io import dumps, from_dict
from gbdoctor.records.timeline import TimelineReport
from gbdoctor.report.timeline import render_table, step_mark
from gbdoctor.run.settings import Shape, run_settings
from gbdoctor.spec import load_spec
from gbdoctor.timeline.train import run_timeline

TIMELINE = FIXTURES / "timeline"
pytestmark = pytest.mark.slow  # each test trains its fixture in spawned ranks, twice


def _timeline(name: str, fix: bool = True, steps: int = 24, seq_lens=()) -> TimelineReport:
    spec = load_spec(TIMELINE / name)
    settings = run_settings(
        spec, steps=steps, seq_lens=seq_lens, backend="aot_eager", shape=Shape.CAPTURE
    )
    return run_timeline(spec, settings, fix=fix)


def _without_timings(report: TimelineReport) -> dict:
    """The JSON with every timing field (seconds, and what is derived from them) removed."""

    def strip(value):
        if isinstance(value, dict):
            return {
                k: strip(v)
                for k, v in value.items()
                if not k.endswith("_s") and k not in ("confidence", "steps_times")
            }
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    data = json.loads(dumps(report))
    data["periods"] = [p for p in data["periods"] if p["source"] == "events"]
    return strip(data)


@pytest.fixture(scope="module")
def task_cycle() -> TimelineReport:
    return _timeline("task_cycle.toml", steps=22)


def test_bounded_variants_past_the_limit_run_eagerly_every_ten_steps(task_cycle) -> None:
    report = task_cycle
    eager = [f for f in report.findings if f.cause == "eager-fallback"]
    assert eager, report.findings
    block = next(f for f in eager if "task_cycle.py" in f.frame)
    # Ten task names, eight cached graphs: tasks 8 and 9 of every round run eagerly.
    assert block.steps == (8, 9, 18, 19) and block.period == 10
    recompile = next(
        f for f in report.findings if f.cause == "recompile" and f.frame == block.frame
    )
    assert recompile.guard.startswith("self.task == ") and recompile.guard_kind == "constant"
    assert "`self.task` is a str guarded as the constant" in recompile.plain
    assert recompile.fix is not None and recompile.fix.kind == "wider-cache"
    limit = int(dict(recompile.fix.config)["recompile_limit"])
    assert limit >= 10
    frame = next(f for f in report.frames if f.frame == block.frame)
    assert frame.cache_size == report.recompile_limit == 8 and frame.limit_hit_step == 8
    assert "".join(step_mark(s) for s in report.steps)[:11] == "CRRRRRRRLE."
    # With the wider cache every task has its graph: no limit hit, no eager step.
    v = report.verification
    assert v is not None and v.gone, v
    assert (v.before_eager_steps, v.after_eager_steps) == (4, 0)
    assert (v.before_limit_hits > 0, v.after_limit_hits) == (True, 0)
    assert not any(s.eager_frames for s in v.after_steps[10:])


def test_report_renders_and_round_trips(task_cycle) -> None:
    table = render_table(task_cycle)
    assert "[PROBLEM] eager-fallback" in table and "torch._dynamo.config.recompile_limit" in table
    text = dumps(task_cycle)
    assert dumps(from_dict(TimelineReport, json.loads(text))) == text


def test_alternating_sequence_length() -> None:
    report = _timeline("alternating_seq.toml", steps=9, seq_lens=(32, 32, 48))
    size = next(f for f in report.findings if f.cause == "input-size")
    assert size.steps == (2, 5, 8) and size.period == 3 and not size.problem
    recompiles = [f for f in report.findings if f.cause == "recompile"]
    assert recompiles, report.findings
    first = recompiles[0]
    assert first.guard_kind == "tensor-size" and "changed size in dim 1 (32 -> 48)" in first.plain
    assert first.steps == (2,)  # automatic dynamic shapes: one recompile, then a dynamic graph
    assert first.fix is not None and first.fix.kind == "dynamic-shapes"
    v = report.verification
    assert v is not None and v.after_recompiles == 0 and v.gone, v
    again = _timeline("alternating_seq.toml", fix=False, steps=9, seq_lens=(32, 32, 48))
    first_run = _without_timings(report)
    del first_run["verification"]
    assert _without_timings(again) == {
        **first_run,
        "verification": None,
    }  # byte-stable apart from timings


@pytest.mark.extra("deepspeed")
def test_per_step_counter_on_a_module_recompiles_every_step() -> None:
    report = _timeline("step_counter.toml", steps=11)
    recompile = next(f for f in report.findings if f.cause == "recompile")
    assert recompile.steps == tuple(range(1, 8)) and recompile.period == 1
    assert recompile.guard_kind == "int-attribute" and recompile.guard.endswith(".calls == 0")
    assert "is an int attribute guarded as the constant 0; it changes every step" in recompile.plain
    assert recompile.fix is not None and recompile.fix.kind == "unspec-int"
    eager = next(f for f in report.findings if f.cause == "eager-fallback")
    assert eager.steps == (8, 9, 10)
    v = report.verification
    assert v is not None and v.gone and v.after_recompiles <= 1 and v.after_eager_steps == 0, v
