"""Pipeline parallelism in a scan: torchtitan v0.2.2's unmodified ``llama4_17bx128e.toml``
(TP 8 x PP 4, 48 layers) scanned with no flags (simulated: 32 ranks), its blocks carrying the
stage torchtitan's own splitting code assigns them (the installed torchtitan is the oracle),
and the gate keyed by stage. The layout rules themselves: ``tests/setup/test_pipeline_layout.py``."""

from __future__ import annotations

import json

import pytest
from repo_paths import FIXTURES
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


def _per_kind(report) -> dict[str, tuple[int, int, frozenset[str]]]:
    """Kind label (variants folded: PP can split a structure by its neighbours' inputs) ->
    (worst breaks per block, worst graph count, causes)."""
    from gbdoctor.records import BlockKind
    from gbdoctor.summary import block_break_count

    out: dict[str, tuple[int, int, frozenset[str]]] = {}
    for block in report.blocks:
        label = BlockKind.parse(block.kind).label
        breaks, graphs, causes = out.get(label, (0, 0, frozenset()))
        out[label] = (
            max(breaks, block_break_count(block)),
            max(graphs, block.graph_count),
            causes | {b.cause for b in block.breaks},
        )
    return out


def test_real_pp2_scan_matches_the_pp1_scan_per_kind():
    """fixtures/llama3_debug_pp2.toml on 2 real gloo ranks (Interleaved1F1B: 4 stages,
    microbatches of 2) against the same config without PP: the same kinds with the same breaks,
    the stages torchtitan assigns, and AC wrapped where each rank's own counter puts it."""
    titan_pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    from gbdoctor.scan import scan
    from gbdoctor.spec import load_spec

    pp2 = scan(load_spec(FIXTURES / "llama3_debug_pp2.toml"), recompiles=False)
    pp1 = scan(
        load_spec(
            FIXTURES / "llama3_debug_pp2.toml",
            ["parallelism.pipeline_parallel_degree=1", "gbdoctor.batch_size=2"],
        ),
        recompiles=False,
    )
    assert not pp2.setup.simulated and pp2.setup.world_size == 2
    assert (pp2.setup.pp_degree, pp2.setup.pp_stages, pp2.setup.pp_microbatches) == (2, 4, 4)
    assert pp1.setup.pp_degree == 1 and all(b.stage is None for b in pp1.blocks)
    assert pp2.setup.batch_size == pp1.setup.batch_size == 2  # the microbatch
    assert all(b.error is None for b in pp2.blocks)
    assert _per_kind(pp2) == _per_kind(pp1)

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
