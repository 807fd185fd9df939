"""``gbdoctor price``: what each distinct break costs a step.

The attribution pieces run on real Dynamo and the real profiler in-process (a module with one
costly and one cheap break, where which is which is known by construction); the command runs
end to end on a tiny custom model with aot_eager. Timings are never asserted (a loaded machine
moves them); the structure, the attribution and the arithmetic are.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from hashlib import sha256

import pytest
import torch
from repo_paths import FIXTURES

from gbdoctor.capture.profile import eager_us_by_frame, eager_us_of, watch_break_frames
from gbdoctor.records import (
    RUN_SCHEMA_VERSION,
    SCHEMA_VERSION,
    Counterfactual,
    Location,
    PriceSplit,
)
from gbdoctor.report.json import load_scan_json
from gbdoctor.report.price_rows import run_price_check
from gbdoctor.report.run_formats import render_run
from gbdoctor.run import report_from_json

MODEL = FIXTURES / "models" / "priced.py"


def _source_line(text: str) -> int:
    lines = MODEL.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(text))


def test_each_break_names_its_frame_and_the_eager_time_follows_the_work():
    """Dynamo's break log gives each break its frame; the profiler's regions give each frame
    the time run outside compiled graphs: the break that runs 24 eager matmuls gets far more
    than the one that runs nothing."""
    import importlib.util

    torch._dynamo.reset()
    spec = importlib.util.spec_from_file_location("priced_fixture", MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build()
    for layer in model.layers.values():
        layer.compile(backend="aot_eager")
    tokens = torch.randint(0, module.VOCAB, (4, 32))

    def step():
        model(tokens).sum().backward()

    with watch_break_frames() as frames:
        step()
        step()
    costly = frames.frames_at(
        Location(file="models/priced.py", line=_source_line("return eager_mix("))
    )
    cheap = frames.frames_at(
        Location(file="models/priced.py", line=_source_line("torch._dynamo.graph_break()"))
    )
    assert len(costly) == 1 and len(cheap) == 1 and costly != cheap
    # Each frame's least time of three profiled steps: a wall-clock time, and on a loaded
    # machine one step's cheap region can take a preemption (51.7 ms against 5 x 11.1 ms once,
    # at load 11); the least of three is the work's own time.
    runs = [eager_us_of(step, "cpu", set(frames.frames)) for _ in range(3)]
    eager = {frame: min(run.get(frame, 0.0) for run in runs) for frame in frames.frames}
    assert eager[costly[0]] > 5 * eager.get(cheap[0], 0.0)
    _the_backward_of_eager_work_is_charged_to_its_break(module, step, frames, costly[0], cheap[0])
    torch._dynamo.reset()


def _the_backward_of_eager_work_is_charged_to_its_break(module, step, frames, costly, cheap):
    """The autograd engine's node events carry the sequence number of the forward op that made
    the node (``capture.profile``). Oracle: the profiler's own events. The costly break runs
    ``tanh`` 24 times per layer eagerly, so its backward holds at least the 48
    ``TanhBackward0`` nodes' time and at most every non-compiled backward node's; the cheap
    break runs nothing eagerly, so nothing is added to it."""
    from torch.profiler import ProfilerActivity, profile

    node = "autograd::engine::evaluate_function: "
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = prof.events()
    forward = eager_us_by_frame(events, set(frames.frames), backward=False)
    both = eager_us_by_frame(events, set(frames.frames))
    added = both[costly] - forward[costly]
    tanh = [e for e in events if e.name == node + "TanhBackward0"]
    assert len(tanh) == module.EAGER_MATMULS * module.N_LAYERS
    eager_nodes = [
        e for e in events if e.name.startswith(node) and "CompiledFunctionBackward" not in e.name
    ]
    assert sum(e.time_range.elapsed_us() for e in tanh) <= added + 1e-6
    assert added <= sum(e.time_range.elapsed_us() for e in eager_nodes) + 1e-6
    assert both.get(cheap, 0.0) == forward.get(cheap, 0.0)


@pytest.fixture(scope="module")
def trained():
    """What the ``priced`` fixture's rounds were given and measured: [(spec, strategies,
    options, Rounds)]."""
    return []


@pytest.fixture(scope="module")
def priced(tmp_path_factory, trained):
    from typer.testing import CliRunner

    from gbdoctor import plan as plan_module
    from gbdoctor.cli import app
    from gbdoctor.price import driver as price_module
    from gbdoctor.run import rounds as rounds_module
    from gbdoctor.setup.dist import fresh_ranks

    tmp = tmp_path_factory.mktemp("price")
    spec = tmp / "priced.toml"
    spec.write_text(
        f'[model]\nname = "custom"\nflavor = "two-breaks"\nfactory = "{MODEL}:build"\n'
        "[training]\nlocal_batch_size = 2\nseq_len = 32\n"
        "[gbdoctor]\nbatch_size = 2\nseq_len = 32\n"
    )
    out = tmp / "price.json"

    def train_rounds(spec, framework, strategies, settings, **options):
        measured = rounds_module.train_rounds(spec, framework, strategies, settings, **options)
        trained.append((spec, framework, strategies, settings, options, measured))
        return measured

    # The plan price makes and prices against, saved as `gbdoctor plan -o` would: `run --price`
    # below reuses it (`run SPEC --plan plan.json --price priced.json`, docs/price.md) instead of
    # making the same plan again.
    plans = []
    real_propose_plan = plan_module.propose_plan

    def propose_plan(spec, **options):
        plans.append(real_propose_plan(spec, **options))
        return plans[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(price_module, "train_rounds", train_rounds)
        patch.setattr(plan_module, "propose_plan", propose_plan)
        # price's own pool, not the session's (tests/conftest.py): its first job is then a
        # fresh rank's, a witness of test_price_jobs_on_shared_ranks_measure_what_fresh_ranks_measure
        # (a module fixture: the fresh_ranks marker's function fixture comes too late for it).
        with fresh_ranks():
            result = CliRunner().invoke(
                app,
                [
                    "price",
                    str(spec),
                    "--backend",
                    "aot_eager",
                    "--rounds",
                    "2",
                    "--steps",
                    "1",
                    "--warmup",
                    "1",
                    # CPU time: the real path of the clock a busy machine needs (the wall clock
                    # differs only in the field it reads, and its arithmetic is tested below).
                    "--clock",
                    "cpu",
                    "-f",
                    "json",
                    "-o",
                    str(out),
                ],
            )
    assert result.exit_code == 0, result.output
    assert len(trained) == 1 and len(plans) == 1
    plan_json = tmp / "plan.json"
    plan_json.write_text(plan_module.dump_plan(plans[0]))
    return load_scan_json(out), json.loads(out.read_text()), (spec, out, plan_json)


@pytest.mark.fresh_ranks  # its witness job is spawned alone
def test_price_jobs_on_shared_ranks_measure_what_fresh_ranks_measure(priced, trained):
    """``price`` runs all its jobs on the same rank processes (``RankPool``): a job that follows
    others compiles the same graphs with the same breaks, and trains the same losses, as the
    job of that mode on fresh ranks. Two witnesses of a fresh rank: the pool's first job (round
    1 of ``as set up``), and one job of the mode that ran last in round 1, spawned alone."""
    from gbdoctor.price.driver import AS_SET_UP
    from gbdoctor.run.worker import ModeJob, run_mode_rank
    from gbdoctor.setup.dist import run_ranks

    spec, framework, strategies, settings, options, measured = trained[0]
    assert options["reuse_ranks"] and not measured.failures
    modes = list(strategies)
    assert modes[0] == AS_SET_UP and len(modes) == 4  # two kinds: their fixes and the plan

    def seen(run):
        return (run.graphs, run.graph_breaks, run.layout, run.losses)

    last = modes[-1]
    fresh = run_ranks(
        run_mode_rank,
        ModeJob(
            spec=spec,
            framework=framework,
            mode=last,
            strategy=strategies[last],
            device=settings.device,
            backend=settings.backend,
            warmup=settings.warmup,
            steps=settings.steps,
        ),
        world_size=1,
        device_type="cpu",
        timeout_s=300,
    )[0]
    witnesses = {AS_SET_UP: seen(measured.runs[AS_SET_UP][0][0]), last: seen(fresh)}
    for mode, runs in measured.runs.items():
        assert len(runs) == 2
        first, second = (seen(r[0]) for r in runs)
        assert first == second, mode  # round 2 runs the modes in reverse order
        assert first[1] > 0 or mode != AS_SET_UP
        if mode in witnesses:
            assert first == witnesses[mode], mode
    # The fixes change what compiles: the check above compares different graphs per mode.
    assert len({seen(r[0][0])[:2] for r in measured.runs.values()}) > 1
    # Where each break ended its frame, recorded in the pool's first job, is the scan's.
    report = load_scan_json(priced[2][1])
    located = {
        loc.line for locs in measured.runs[AS_SET_UP][0][0].break_frames.values() for loc in locs
    }
    assert {b.location.line for blk in report.blocks for b in blk.breaks if b.location} <= located


def test_every_distinct_break_has_a_price_with_a_spread(priced):
    report, data, _ = priced
    assert data["schema_version"] == SCHEMA_VERSION and report.price is not None
    price = report.price
    distinct = {
        (block.kind, brk.cause, str(brk.location) if brk.location else "")
        for block in report.blocks
        if block.same_as is None
        for brk in block.breaks
    }
    priced_breaks = {(p.kind, p.cause, p.location) for p in price.breaks}
    assert priced_breaks == distinct
    for p in price.breaks:
        assert p.ms_per_step is not None and p.spread_ms is not None
        assert p.spread_ms[0] <= p.ms_per_step <= p.spread_ms[1] or math.isclose(
            p.spread_ms[0], p.spread_ms[1], abs_tol=1e-3
        )
    assert price.backend == "aot_eager" and price.rounds == 2 and price.world_size == 1
    assert price.step_spread_ms[0] <= price.step_ms <= price.step_spread_ms[1]
    assert price.clock == "cpu" and data["price"]["clock"] == "cpu" and price.step_ms > 0


def test_a_kinds_price_is_split_over_its_breaks_by_their_eager_time(priced):
    report, _, _ = priced
    price = report.price
    assert price is not None
    for kind in price.kinds:
        assert kind.counterfactual in (Counterfactual.PLAN_FIX, Counterfactual.EAGER)
        assert kind.layers == sum(1 for b in report.blocks if b.kind == kind.kind)
        parts = [p for p in price.breaks if p.kind == kind.kind]
        assert kind.ms_per_step is not None
        assert math.isclose(sum(p.ms_per_step for p in parts), kind.ms_per_step, abs_tol=0.01)
        if len(parts) > 1:
            assert {p.split for p in parts} == {PriceSplit.EAGER_TIME}
            by_cause = {p.cause: p for p in parts}
            # The break that runs 24 matmuls eagerly weighs more than the one that runs nothing.
            assert by_cause["compiler-disabled"].eager_ms > by_cause["explicit"].eager_ms
        else:
            assert parts[0].split == PriceSplit.WHOLE_KIND


def test_the_table_and_markdown_show_the_prices(priced):
    from gbdoctor.report import render

    report, _, _ = priced
    table = render(report, "table")
    assert "Price per distinct break" in table and "Price per block kind" in table
    assert "backend aot_eager" in table
    markdown = render(report, "markdown")
    assert "### Price per distinct break" in markdown
    assert "Measured in the ranks' CPU time on cpu" in markdown


@pytest.mark.slow
def test_run_price_prints_the_check_from_a_real_priced_scan(priced, tmp_path):
    """``run --price`` on the spec that was priced, at its shapes and backend, with the plan the
    prices were measured against (``--plan``, as docs/price.md runs it): the JSON carries the
    check, its numbers recomputed here from the run's own per-round medians, and the table line
    says whether the two agree."""
    from typer.testing import CliRunner

    from gbdoctor.cli import app

    report, _, (spec, price_json, plan_json) = priced
    as_set_up = report.setup.strategy
    out = tmp_path / "run.json"
    args = ["run", str(spec), "--plan", str(plan_json), "--backend", "aot_eager"]
    args += ["--rounds", "2", "--steps", "1"]
    args += ["--warmup", "1", "--modes", "plan", "--batch-size", "2"]
    args += ["--seq-len", "32", "--price", str(price_json), "-f", "json", "-o", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 1), result.output
    run = json.loads(out.read_text())
    assert run["schema_version"] == RUN_SCHEMA_VERSION
    # The plan the prices were measured against, by name and digest (never a local path).
    digest = sha256(plan_json.read_bytes()).hexdigest()[:16]
    assert run["plan_source"] == f"{plan_json.name} sha256:{digest}"
    modes = {m["mode"]: m for m in run["modes"]}
    gains = [  # the prices are in CPU time: so is the side the check measures
        (b - p) * 1e3
        for b, p in zip(
            modes["as-priced"]["round_cpu_medians_s"], modes["plan"]["round_cpu_medians_s"]
        )
    ]
    check = run["price_check"]
    assert check["as_set_up"] == f"as-priced ({as_set_up})"
    assert check["measured_ms"] == pytest.approx(statistics.median(gains), abs=0.06)
    kinds = json.loads(price_json.read_text())["price"]["kinds"]
    total = sum(k["ms_per_step"] for k in kinds if k["ms_per_step"] is not None)
    assert check["predicted_ms"] == pytest.approx(total, abs=0.06)
    line = run_price_check(report_from_json(out.read_text()).price_check)
    assert line in render_run(report_from_json(out.read_text()), "markdown")
    assert f"this run measured {check['measured_ms']:.1f}" in line and "(CPU time)" in line
    for mode in modes.values():  # each round's median step in CPU time too, one per round
        assert len(mode["round_cpu_medians_s"]) == 2 and min(mode["round_cpu_medians_s"]) > 0


def test_profiling_a_step_prints_nothing_on_stderr():
    """Kineto prints ``USDT: ... profiler_start`` for every profiled step at its default log
    level; pricing profiles one step per mode and round, so its stderr would fill with them."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from gbdoctor.capture.profile import eager_us_of\n"
        "eager_us_of(lambda: torch.ones(3) + 1, 'cpu', set())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr, done.stderr
