"""``gbdoctor run`` on an Accelerate setup (2 gloo ranks): each mode trains and its record carries
the Dynamo settings its setup ran under: accelerate's own for the config's compile (what
``Accelerator._prepare_fsdp2`` sets), none for eager. The report was built from a member only
torchtitan's strategies have, and crashed after training."""

from __future__ import annotations

import json

import pytest
from repo_paths import FIXTURES
from typer.testing import CliRunner

from gbdoctor.cli import app

pytestmark = pytest.mark.extra("accelerate")

ACCELERATE = FIXTURES / "accelerate"


def test_run_trains_each_mode_and_records_the_settings_it_ran_under(tmp_path):
    out = tmp_path / "run.json"
    args = [
        "run", "--accelerate", str(ACCELERATE / "fsdp2_regional_ac.yaml"),
        "--model", str(ACCELERATE / "models" / "llama"), "--modes", "eager,accelerate",
        "--backend", "aot_eager", "--steps", "2", "--warmup", "1", "--rounds", "1",
        "--format", "json", "-o", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    modes = {m["mode"]: m for m in json.loads(out.read_text())["modes"]}
    assert [m["status"] for m in modes.values()] == ["ok", "ok"], modes
    assert all(m["tokens_per_s"] > 0 and len(m["step_times_s"]) == 2 for m in modes.values())
    # The same model, seed and batches: the compiled setup trains as eager does.
    assert modes["accelerate"]["losses"] == pytest.approx(modes["eager"]["losses"], rel=1e-3)
    assert modes["eager"]["dynamo_config"] == []
    # What accelerate 1.15's Accelerator._prepare_fsdp2 sets before compile_regions_fsdp2.
    assert modes["accelerate"]["dynamo_config"] == [
        ["capture_scalar_outputs", "True"],
        ["skip_fwd_side_effects_in_bwd_under_checkpoint", "True"],
    ]
