"""A torchtitan >= 0.3 run (``--torchtitan MODULE:CONFIG`` + its overrides) as a spec: how it is
read, what is refused before any rank starts, and every command on it, with the installed
torchtitan 0.3.0 as the oracle (its own config registry, model registry, ``parallelize_fn``,
loss, optimizer and step). The scans here are one-rank llama3 debug runs (the quickest
torchtitan model); deepseek_v3's plan and emitted config are in ``test_torchtitan_plan.py``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.errors import SpecError
from gbdoctor.frameworks.registry import spec_for_run
from gbdoctor.report.json import load_scan_json
from gbdoctor.spec import load_spec

pytestmark = pytest.mark.extra("torchtitan")

LLAMA = ["--torchtitan", "llama3:llama3_debugmodel", "--compile.enable"]
EP2 = ("--parallelism.expert_parallel_degree", "2", "--training.disable_cuda_graphs")
PARTIAL = ("--parallelism.spmd_backend", "partial_dtensor")
runner = CliRunner()


def _cli(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_a_run_is_a_spec_filled_from_torchtitans_own_config():
    spec = spec_for_run("--torchtitan", "deepseek_v3:deepseek_v3_debugmodel", EP2 + PARTIAL)
    assert spec.key == "torchtitan:deepseek_v3:deepseek_v3_debugmodel " + " ".join(EP2 + PARTIAL)
    assert spec.registry_run is not None and spec.registry_run.args == EP2 + PARTIAL
    assert spec.gbdoctor.framework == "torchtitan-installed"
    # dp_shard = -1 takes what EP 2 needs: two ranks, resolved as torchtitan resolves it.
    p = spec.parallelism
    assert (p.world_size, p.dp_shard, p.expert_parallel_degree) == (2, 2, 1 * 2)
    assert spec.activation_checkpoint.mode == "selective"  # its SelectiveAC.Config()
    assert spec.activation_checkpoint.selective_ac_option == "op"
    assert not spec.compile.enable  # off in its debug config unless --compile.enable
    assert (spec.capture_batch_size, spec.capture_seq_len) == (2, 64)


def test_spmd_types_default_is_refused_before_any_rank_starts():
    """torchtitan 0.3's default spmd_backend meets FSDP2 sharding (2 ranks): torch 2.13's
    fully_shard rejects its plain-tensor parameters on every rank. Refused in one line naming
    the override, exit 2; one rank (no sharding) and the override pass."""
    from gbdoctor.frameworks.torchtitan.spec import fsdp_rejects_plain_params

    code, out, err = _cli("scan", "--torchtitan", "deepseek_v3:deepseek_v3_debugmodel", *EP2)
    assert code == 2 and not out
    lines = [line for line in err.splitlines() if line.startswith(("Error", "Hint"))]
    assert fsdp_rejects_plain_params()  # this torch: the check it reads is there
    assert "spmd_types" in lines[0] and "--parallelism.spmd_backend partial_dtensor" in lines[1]
    assert "Traceback" not in err
    spec_for_run("--torchtitan", "deepseek_v3:deepseek_v3_debugmodel", ())  # one rank: fine


@pytest.mark.parametrize(
    "args, words",
    [
        (["scan", "--torchtitan", "llama3", "--compile.enable"], "MODULE:CONFIG"),
        (["scan", "--torchtitan", "llama3:no_such_config"], "could not load"),
        (["scan", *LLAMA, "--set", "training.seq_len=8"], "not a capture setting"),
        (["scan", "--compile.enable"], "need --torchtitan"),
    ],
)
def test_bad_runs_are_one_line_errors(args, words):
    code, out, err = _cli(*args)
    assert code == 2 and words in err and "Traceback" not in err, err


def test_a_toml_spec_cannot_name_the_installed_framework(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        '[model]\nname = "llama3"\nflavor = "debugmodel"\n'
        '[gbdoctor]\nframework = "torchtitan-installed"\n'
    )
    with pytest.raises(SpecError, match="not read from a TOML file") as caught:
        load_spec(path)
    assert "--torchtitan MODULE:CONFIG" in (caught.value.hint or "")


@pytest.fixture(scope="module")
def llama_scan(tmp_path_factory):
    """The JSON of one scan of llama3's debug config with torchtitan's compile on."""
    out = tmp_path_factory.mktemp("titan") / "scan.json"
    code, _, err = _cli("scan", *LLAMA, "-f", "json", "-o", str(out))
    assert code == 0, err
    return out


def test_scan_json_has_the_toml_shape_and_names_the_run(llama_scan):
    report = load_scan_json(llama_scan)  # the reader every saved scan goes through
    assert report.spec == "torchtitan:llama3:llama3_debugmodel --compile.enable"
    assert report.setup.framework == "torchtitan-installed"
    assert report.setup.strategy == "torchtitan" and report.setup.fsdp
    assert ("capture_scalar_outputs", "True") in report.setup.dynamo_config  # torchtitan set it
    # torchtitan compiles each block in place, whole, fullgraph=True: 6 dense+SAC blocks, clean.
    assert [b.kind for b in report.blocks] == ["dense+sac"] * 6
    assert all(b.regions == b.fullgraph_regions == (b.fqn,) for b in report.blocks)
    assert report.blocks[0].graph_count == 1 and not report.blocks[0].breaks
    assert any("torchtitan 0.3.0's own code" in n for n in report.notes)
    assert not any("hidden states" in n for n in report.notes)  # its own loss took the output


def test_gate_keys_the_baseline_by_run_name_and_overrides(llama_scan, tmp_path):
    baseline = tmp_path / "baseline.json"
    code, _, err = _cli("gate", *LLAMA, "-b", str(baseline), "--update-baseline")
    assert code == 0, err
    keys = list(json.loads(baseline.read_text())["specs"])
    assert keys == ["torchtitan:llama3:llama3_debugmodel --compile.enable"]
    code, out, err = _cli("gate", *LLAMA, "-b", str(baseline))
    assert code == 0, out + err
    # A saved scan of the same run gates against the same key; diff compares two of them.
    assert _cli("gate", "--scan", str(llama_scan), "-b", str(baseline))[0] == 0
    assert _cli("diff", str(llama_scan), str(llama_scan))[0] == 0


def test_inspect_shows_torchtitans_own_setup():
    code, out, err = _cli("inspect", *LLAMA, "-f", "json")
    assert code == 0, err
    report = json.loads(out)
    blocks = report["blocks"]
    assert [b["fqn"] for b in blocks] == [f"layers.{i}" for i in range(6)]
    assert all(b["compiled"] == [b["fqn"]] for b in blocks)
