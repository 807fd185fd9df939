"""Pipeline parallelism in a scan: torchtitan v0.2.2's unmodified ``llama4_17bx128e.toml``
(TP 8 x PP 4, 48 layers) scanned with no flags (simulated: 32 ranks), its blocks carrying the
stage torchtitan's own splitting code assigns them (the installed torchtitan is the oracle),
and the gate keyed by stage. The layout rules themselves: ``tests/setup/test_pipeline_layout.py``."""

from __future__ import annotations

import json

import pytest
from repo_paths import FIXTURES
from scan_factory import per_kind
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.records import SCHEMA_VERSION
from gbdoctor.report.json import load_scan_json
from gbdoctor.report.table import plain_text, recording_console, render_table
from gbdoctor.scan import memory_estimate

MAVERICK = "fixtures/torchtitan_v0.2.2/llama4_17bx128e.toml"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)
    monkeypatch.delenv(memory_estimate.AVAILABLE_ENV, raising=False)


@pytest.fixture(scope="module")
def pp1_scan():
    """The PP = 1 reference scan: the same config without PP, at the PP scans' microbatch
    (2 rows), scanned once for the module (it depends on nothing a test changes)."""
    from gbdoctor.scan import scan
    from gbdoctor.spec import load_spec

    return scan(
        load_spec(
            FIXTURES / "llama3_debug_pp2.toml",
            ["parallelism.pipeline_parallel_degree=1", "gbdoctor.batch_size=2"],
        ),
        recompiles=False,
    )


def test_maverick_scan_reports_each_stage_and_the_gate_keys_them(tmp_path):
    titan_pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    out = tmp_path / "scan.json"
    result = runner.invoke(app, ["scan", MAVERICK, "-f", "json", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    data = json.loads(out.read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 9
    setup = data["setup"]
    assert (setup["pp_degree"], setup["pp_schedule"], setup["pp_stages"]) == (4, "1F1B", 4)
    assert setup["simulated"] and setup["world_size"] == 32 and setup["batch_size"] == 1
    # The stage of every layer is the one torchtitan's own split gives it (1F1B: 4 stages).
    expected = titan_pp._generate_llm_fqn_per_model_part(4, 48, 1, 1)
    stage_of = {m: i for i, names in enumerate(expected) for m in names}
    assert {b["fqn"]: b["stage"] for b in data["blocks"]} == {
        f"layers.{i}": stage_of[f"layers.{i}"] for i in range(48)
    }
    # Every stage holds both kinds (llama4 interleaves dense and MoE layers).
    kinds = {(b["stage"], b["kind"]) for b in data["blocks"]}
    assert kinds == {(s, k) for s in range(4) for k in ("dense+ac", "moe+ac")}
    assert any(n.startswith("pipeline: PP 4, schedule 1F1B, 4 stages") for n in data["notes"])

    # The gate files counts per stage and kind, and passes against its own baseline.
    baseline = tmp_path / "baseline.json"
    args = ["gate", "--scan", str(out), "--baseline", str(baseline)]
    assert runner.invoke(app, [*args, "--update-baseline"]).exit_code == 0
    keys = set(json.loads(baseline.read_text())["specs"][MAVERICK])
    assert keys == {f"stage {s}/{k}" for s in range(4) for k in ("dense+ac", "moe+ac")}
    checked = runner.invoke(app, [*args, "-f", "json"])
    assert checked.exit_code == 0, checked.stdout
    assert len(json.loads(checked.stdout)["kinds"]) == 8

    # The table lays the stages out: stage -> layers -> kinds.
    console = recording_console()
    render_table(load_scan_json(out), console)
    text = plain_text(console)
    assert "Pipeline stages" in text
    assert "layers.12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24" in text  # stage 1


def test_scans_of_the_previous_schema_still_read_without_stages():
    old = FIXTURES / "scans" / "llama4_before_schema7.json"
    assert json.loads(old.read_text())["schema_version"] == 7
    report = load_scan_json(old)
    assert report.blocks and all(b.stage is None for b in report.blocks)
    assert report.setup.pp_degree == 1
    # The same records as the current version writes them, stage aside.
    assert report == load_scan_json(FIXTURES / "scans" / "llama4_before.json")


def test_real_pp2_scan_matches_the_pp1_scan_per_kind(pp1_scan):
    """fixtures/llama3_debug_pp2.toml on 2 real gloo ranks (Interleaved1F1B: 4 stages,
    microbatches of 2) against the same config without PP: the same kinds with the same breaks,
    the stages torchtitan assigns, and AC wrapped where each rank's own counter puts it."""
    titan_pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    from gbdoctor.scan import scan
    from gbdoctor.spec import load_spec

    pp2 = scan(load_spec(FIXTURES / "llama3_debug_pp2.toml"), recompiles=False)
    pp1 = pp1_scan  # the module's one PP = 1 scan (the schedule tests compare with it too)
    assert not pp2.setup.simulated and pp2.setup.world_size == 2
    assert (pp2.setup.pp_degree, pp2.setup.pp_stages, pp2.setup.pp_microbatches) == (2, 4, 4)
    assert pp1.setup.pp_degree == 1 and all(b.stage is None for b in pp1.blocks)
    assert pp2.setup.batch_size == pp1.setup.batch_size == 2  # the microbatch
    assert all(b.error is None for b in pp2.blocks)
    assert per_kind(pp2) == per_kind(pp1)

    expected = titan_pp._generate_llm_fqn_per_model_part(4, 6, 1, 1)
    stage_of = {m: i for i, names in enumerate(expected) for m in names}
    assert {b.fqn: b.stage for b in pp2.blocks} == {
        f"layers.{i}": stage_of[f"layers.{i}"] for i in range(6)
    }
    # selective_ac_option = 2: every 2nd block of each rank's own stages (rank 0: layers 0, 3,
    # 4; rank 1: layers 1, 2, 5), not layers 1, 3, 5 of the whole model as without PP.
    wrapped = {b.fqn for b in pp2.blocks if "+ac" in b.kind}
    assert wrapped == {"layers.2", "layers.3"}
    assert {b.fqn for b in pp1.blocks if "+ac" in b.kind} == {"layers.1", "layers.3", "layers.5"}

    # Oracle: plain torch.compile of each block inside its stage module agrees with the scan.
    oracle = _stage_oracle(load_spec(FIXTURES / "llama3_debug_pp2.toml"), pp2)
    assert [fqn for fqn, _ in oracle] == [f"layers.{i}" for i in range(6)]
    assert all(not unexpected for _, unexpected in oracle), oracle


def _stage_oracle(spec, report) -> list[tuple[str, tuple]]:
    """Plain per-block ``torch.compile`` (backend eager, the graph-break log on) of each block
    inside its stage module - the model cut per stage as torchtitan cuts it, each stage fed the
    previous stage's output - against the scan's records: (fqn, unexpected differences)."""

    import torch

    from gbdoctor.capture.block import collect_block_inputs
    from gbdoctor.models import block_container, build_model, vocab_size
    from gbdoctor.scan.oracle import compare, plain_compile_statements, training_flags
    from gbdoctor.setup.pipeline import pipeline_layout, split_stage
    from gbdoctor.setup.train import synthetic_batch

    torch.manual_seed(spec.training.seed)
    model = build_model(spec.model, max_seq_len=spec.training.seq_len).train()
    layout = pipeline_layout(spec.parallelism, len(block_container(model)), 8)
    hidden, _ = synthetic_batch(
        seed=spec.training.seed,
        step=0,
        vocab=vocab_size(model),
        local_batch=spec.capture_batch_size,
        seq_len=spec.capture_seq_len,
        rank=0,
        world_size=1,
        device="cpu",
    )
    flags = training_flags(report)
    by_fqn = {b.fqn: b for b in report.blocks}
    found = []
    for stage in layout.stages:
        chunk = split_stage(model, stage)
        blocks = dict(block_container(chunk))
        assert set(blocks) == {f"layers.{i}" for i in stage.layers}
        store, remove = collect_block_inputs(chunk, blocks)
        try:
            hidden = chunk(hidden)  # tokens into stage 0; hidden states between stages
        finally:
            remove()
        for fqn, block in blocks.items():
            statements = plain_compile_statements(block, store[fqn], spec.root or None, flags)
            found.append(
                (fqn, tuple(d for d in compare(statements, by_fqn[fqn]) if not d.expected))
            )
    assert hidden.shape[-1] == vocab_size(model)  # the last stage produced the logits
    return found


def test_schedule_findings_are_read_from_the_crash_and_the_compiles():
    """The parent's reading of a schedule run: which crash a message is (the workaround is
    chosen by it), and which compiles are recompiles of a block (every one after its first,
    paired with the recompile log record that came just before it)."""
    from gbdoctor.records import Recompile
    from gbdoctor.scan.pipeline_schedule import (
        CrashKind,
        ScheduleCrash,
        block_recompiles,
        crash_kind,
        runnable,
    )
    from gbdoctor.spec import load_spec

    def kind(text: str) -> CrashKind:
        return crash_kind(ScheduleCrash(text))

    assert (
        kind(
            "rank 0: ZBVZeroBubble step 0 (first microbatch shape) crashed on PP rank 0: "
            "RuntimeError: ... non-empty donated buffers ..."
        )
        == CrashKind.ZERO_BUBBLE
    )
    assert kind("rank 1: 1F1B step 2 (second microbatch shape) crashed") == CrashKind.SECOND_SHAPE
    assert kind("rank 1: 1F1B step 3 (first microbatch shape, LRU cache on) crashed") == (
        CrashKind.AC_CACHE
    )
    assert kind("rank 1: 1F1B step 1 (first microbatch shape) crashed") == CrashKind.OTHER

    reason = Recompile(step=2, measured=False, function="forward at m.py:1", reason="size 64 != 32")
    other = Recompile(step=0, measured=False, function="forward at m.py:1", reason="id mismatch")
    result = {
        "records": [other, reason],
        "compiles": [
            ("layers.0", 0, ((2, 64, 8),), 0),  # first compile: not a recompile
            ("layers.1", 0, ((2, 64, 8),), 1),  # its first too (logged: layers.0's entry failed)
            ("layers.0", 2, ((2, 32, 8),), 2),  # recompile, after the second record
            ("loss", 2, ((2, 32, 8),), 2),  # first compile of the loss, no new record
        ],
    }
    assert block_recompiles(result) == {"layers.0": (replace_step(reason, 2),)}

    spec = FIXTURES / "llama3_debug_pp2.toml"
    assert runnable(load_spec(spec)) is None
    hybrid = load_spec(spec, ["parallelism.data_parallel_shard_degree=2"])
    assert "pure PP ranks only" in runnable(hybrid)


def replace_step(r, step):
    from dataclasses import replace

    return replace(
        r,
        step=step,
        measured=False,
        hint=f"pipeline schedule step {step} (second microbatch shape)",
    )


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1F1B", "ZBVZeroBubble"])
def test_pp2_schedule_matches_pp1_and_reports_pp_only_findings(schedule, pp1_scan):
    """PP = 2 on 2 gloo ranks with torch's 1F1B and zero-bubble V schedules: per kind the same
    breaks as the PP = 1 scan; then the schedule trained for real on the ranks
    (``scan.pipeline_schedule``) adds what only PP causes: every recompile comes from the second
    microbatch shape (none in the steady step), that shape through the same schedule crashes
    the last stage's loss, ZBV's split backward crashes on donated buffers, each workaround
    verified by training again; and the loss is the whole model's, computed without PP."""
    import torch

    from gbdoctor.models import build_model, vocab_size
    from gbdoctor.scan import scan
    from gbdoctor.scan.pipeline_schedule import run_schedule, with_schedule
    from gbdoctor.setup.train import synthetic_batch
    from gbdoctor.spec import load_spec

    spec = load_spec(
        FIXTURES / "llama3_debug_pp2.toml", [f"parallelism.pipeline_parallel_schedule={schedule}"]
    )
    pp2 = scan(spec, recompiles=False)
    assert pp2.setup.pp_schedule == schedule and not pp2.setup.simulated
    assert all(b.error is None for b in pp2.blocks)
    assert per_kind(pp2) == per_kind(pp1_scan)

    found = run_schedule(spec)
    report = with_schedule(pp2, found)
    assert per_kind(report) == per_kind(pp1_scan)  # the schedule adds findings, not breaks
    recompiles = [(b.fqn, r) for b in report.blocks for r in b.recompiles]
    assert recompiles and {r.step for _, r in recompiles} == {2}
    assert all(
        "size mismatch at index 1. expected 64, actual 32" in r.reason for _, r in recompiles
    )
    crashes = [e for e in report.blocks[0].events if e.kind == "pipeline_crash"]
    expected = {"second-microbatch-shape"} | (
        {"zero-bubble-backward"} if schedule == "ZBVZeroBubble" else set()
    )
    assert {e.detail.split(":", 1)[0] for e in crashes} == expected
    assert all("(verified:" in e.detail for e in crashes)
    assert all(r.hint.startswith("pipeline schedule step 2") for _, r in recompiles)
    if schedule == "ZBVZeroBubble":
        assert any("donated buffers" in e.detail for e in crashes)
    assert all(len(b.events) == len(report.blocks[0].events) for b in report.blocks)
    assert any("does not reproduce here" in n for n in report.notes)  # pytorch#166926, AC on

    # Oracle for the training itself: step 0's loss is the plain model's on the same batch.
    torch.manual_seed(spec.training.seed)
    model = build_model(spec.model, max_seq_len=spec.training.seq_len)
    tokens, labels = synthetic_batch(
        seed=spec.training.seed,
        step=0,
        vocab=vocab_size(model),
        local_batch=8,
        seq_len=spec.capture_seq_len,
        rank=0,
        world_size=1,
        device="cpu",
    )
    with torch.no_grad():
        logits = model(tokens)
    plain = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    assert len(found.losses) == 4
    assert found.losses[0] == pytest.approx(float(plain), abs=1e-4)

    if schedule == "1F1B":
        # The stage-module oracle for a second schedule: 1 stage per rank, layers 0-2 and 3-5.
        oracle = _stage_oracle(spec, pp2)
        assert [fqn for fqn, _ in oracle] == [f"layers.{i}" for i in range(6)]
        assert all(not unexpected for _, unexpected in oracle), oracle
