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
    assert data["schema_version"] == SCHEMA_VERSION == 8
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
    report = load_scan_json(FIXTURES / "scans" / "llama4_before.json")
    assert (
        json.loads((FIXTURES / "scans" / "llama4_before.json").read_text())["schema_version"] == 7
    )
    assert report.blocks and all(b.stage is None for b in report.blocks)
    assert report.setup.pp_degree == 1
