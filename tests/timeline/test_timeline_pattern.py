"""``gbdoctor timeline``'s analysis on its own: guards in words, periods, marks (no training).

The trained fixtures are in ``tests/timeline/test_timeline.py``."""

from __future__ import annotations

import pytest
from repo_paths import FIXTURES

from gbdoctor.records.enums import GuardKind
from gbdoctor.records.io import dumps, from_dict
from gbdoctor.records.timeline import StepCompile, TimelineReport, TimelineStep
from gbdoctor.report.timeline import render_svg, render_table, step_mark, strip
from gbdoctor.timeline.pattern import (
    classify_guard,
    event_period,
    findings,
    time_period,
    warmup_steps,
)


@pytest.mark.parametrize(
    ("reason", "hint", "kind", "words"),
    [
        (
            "self.calls == 3",
            "torch.compile considers integer attributes of the nn.Module to be static",
            GuardKind.INT_ATTRIBUTE,
            "`self.calls` is an int attribute guarded as the constant 3",
        ),
        (
            "self._modules['layers']._modules['0'].calls == 0",
            "",
            GuardKind.INT_ATTRIBUTE,
            "guarded as the constant 0",
        ),
        ("self.task == 'task-3'", "", GuardKind.CONSTANT, "is a str guarded as the constant"),
        (
            "tensor 'x' size mismatch at index 1. expected 64, actual 96",
            "",
            GuardKind.TENSOR_SIZE,
            "`x` changed size in dim 1 (64 -> 96)",
        ),
        ("len(L['args']) == 2", "", GuardKind.LENGTH, "the length of `L['args']`"),
        ("___check_obj_id(self.fn)", "", GuardKind.IDENTITY, "`self.fn` is guarded"),
        ("something else entirely", "", GuardKind.OTHER, "failed"),
    ],
)
def test_guards_in_plain_words(reason: str, hint: str, kind: str, words: str) -> None:
    got_kind, plain = classify_guard(reason, hint)
    assert got_kind == kind
    assert words in plain


def _flags(n: int, on: set[int]) -> list[bool]:
    return [i in on for i in range(n)]


def test_event_period() -> None:
    # every third step, offset 2 (an accumulation boundary with k = 3)
    assert event_period(_flags(24, {2, 5, 8, 11, 14, 17, 20, 23}), 0) == (3, (2,))
    # every step until a limit stops it: the pattern while it lasts
    assert event_period(_flags(14, set(range(1, 8))), 0) == (1, (0,))
    # two steps in ten (the last two variants of a cycle of ten, past the limit)
    assert event_period(_flags(24, {8, 9, 18, 19}), 0) == (10, (8, 9))
    # one event, or no repetition: no period
    assert event_period(_flags(12, {2}), 0) is None
    assert event_period(_flags(12, {2, 5, 6}), 0) is None


def test_time_period_finds_the_lag_and_ignores_noise() -> None:
    times = [0.1, 0.1, 0.3] * 6
    lag, ac = time_period(times) or (0, 0.0)
    assert lag == 3 and ac > 0.9
    assert time_period([0.2] * 12) is None
    assert time_period([0.1, 0.2, 0.3]) is None


def _step(
    i: int,
    *,
    compiles: tuple[StepCompile, ...] = (),
    boundary: bool | None = None,
    time_s: float = 0.1,
    eager: tuple[str, ...] = (),
) -> TimelineStep:
    return TimelineStep(
        step=i, time_s=time_s, forward_s=time_s / 2, backward_s=time_s / 3, optimizer_s=0.0,
        collective_s=0.0, collective_calls=0, compile_s=0.0, tokens=128, boundary=boundary,
        compiles=compiles, eager_frames=eager,
    )  # fmt: skip


def test_findings_for_a_counter_then_limit() -> None:
    frame = "forward at m.py:3"
    steps = [_step(0, compiles=(StepCompile(frame=frame, attempt=0, compile_s=1.0),))]
    for i in range(1, 8):
        guard = f"self.calls == {i - 1}"
        kind, plain = classify_guard(guard, "integer attributes of the nn.Module")
        c = StepCompile(
            frame=frame, attempt=i, compile_s=0.5, guard=guard, guard_kind=kind, plain=plain
        )
        steps.append(_step(i, compiles=(c,)))
    hit = StepCompile(frame=frame, attempt=8, compile_s=0.0, guard="self.calls == 7",
                      guard_kind=GuardKind.INT_ATTRIBUTE, limit_hit=True)  # fmt: skip
    steps.append(_step(8, compiles=(hit,), eager=(frame,)))
    steps += [_step(i, eager=(frame,)) for i in range(9, 12)]
    warm = warmup_steps(steps)
    assert warm == 1
    found, periods = findings(steps, warm, 8)
    recompile, eager = found
    assert recompile.cause == "recompile" and recompile.period == 1
    assert "it changes every step" in recompile.plain
    assert recompile.fix is not None and recompile.fix.kind == "unspec-int"
    assert dict(recompile.fix.config) == {"allow_unspec_int_on_nn_module": "True"}
    assert eager.cause == "eager-fallback" and eager.steps == tuple(range(8, 12))
    assert any(p.k == 1 and p.source == "events" for p in periods)


def test_accumulation_boundary_is_by_design() -> None:
    steps = [_step(i, boundary=i % 3 == 2, time_s=0.3 if i % 3 == 2 else 0.1) for i in range(12)]
    found, periods = findings(steps, 1, 8)
    (boundary,) = found
    assert boundary.cause == "accumulation-boundary" and not boundary.problem
    assert boundary.period == 3 and "no recompile there" in boundary.plain
    (events, times) = periods
    assert (events.k, events.offset, events.source) == (3, 2, "events")
    assert events.amplitude_s == pytest.approx(0.2)
    assert times.k == 3 and times.source == "step-times"


def _report(steps: list[TimelineStep]) -> TimelineReport:
    found, periods = findings(steps, 1, 8)
    return TimelineReport(
        schema_version=1, spec="s.toml", framework="torchtitan", mode="as-is", strategy="block",
        backend="aot_eager", device="cpu", world_size=1, torch_version="2.13.0",
        recompile_limit=8, seq_lens=(64,), batch_size=2, steps=tuple(steps), frames=(),
        warmup_steps=1, findings=tuple(found), periods=tuple(periods),
    )  # fmt: skip


def test_render_and_json_round_trip() -> None:
    frame = "forward at m.py:3"
    c = StepCompile(frame=frame, attempt=1, compile_s=0.5, guard="self.x == 1")
    steps = [_step(0, compiles=(StepCompile(frame=frame, attempt=0, compile_s=1.0),))]
    steps += [_step(1, compiles=(c,)), _step(2, boundary=True), _step(3, eager=(frame,))]
    report = _report(steps)
    assert [step_mark(s) for s in report.steps] == ["C", "R", "B", "E"]
    assert strip(report).endswith("CRBE")
    table = render_table(report)
    assert "recompile forward at m.py:3: self.x == 1" in table and "verdict:" in table
    assert render_svg(report).startswith("<svg") and "step 1" in render_svg(report)
    text = dumps(report)
    assert '"schema_version": 1' in text
    import json

    assert dumps(from_dict(TimelineReport, json.loads(text))) == text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--seq-lens", "a,b"], "--seq-lens 'a,b' is not a comma-separated list"),
        (["--mode", "fast"], "unknown timeline mode 'fast'"),
        (["--dynamo-config", "recompile_limit"], "is not NAME=VALUE"),
        (["--steps", "1"], "--steps must be at least 2"),
        (["--mode", "plan"], "mode 'plan' needs --plan FILE"),
        (["--format", "csv"], "unknown --format 'csv'"),
    ],
)
def test_bad_timeline_options_exit_2_with_one_line(args: list[str], needle: str) -> None:
    from typer.testing import CliRunner

    from gbdoctor.cli.root import app

    spec = str(FIXTURES / "timeline" / "task_cycle.toml")
    result = CliRunner().invoke(app, ["timeline", spec, *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output


def test_the_default_table_says_the_verdict_first_and_leaves_the_steps_to_details() -> None:
    frame = "forward at m.py:3"
    c = StepCompile(frame=frame, attempt=1, compile_s=0.5, guard="self.x == 1")
    report = _report([_step(0), _step(1, compiles=(c,)), _step(2)])
    full = render_table(report)
    short = render_table(report, details=False)
    assert "recompile forward at m.py:3: self.x == 1" in full  # a step row
    assert "recompile forward at m.py:3: self.x == 1" not in short
    assert short.splitlines()[1].startswith("verdict:")
    assert full.splitlines()[1] != short.splitlines()[1]
    assert "Details: --details (-v)" in short and strip(report) in short
