"""The inputs of an Accelerate run, read strictly, with no rank started: the YAML `accelerate
config` writes and the Trainer's TrainingArguments file give the same settings; every unknown
or unsupported key is one line naming it and the supported alternative, exit 2; the model is
a directory with config.json, a cached Hub id or a factory, never downloaded."""

from __future__ import annotations

import json

import pytest
from repo_paths import FIXTURES
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.errors import SpecError
from gbdoctor.frameworks.accelerate.config import load_settings
from gbdoctor.frameworks.registry import spec_for_run
from gbdoctor.spec import load_spec

pytestmark = pytest.mark.extra("accelerate")

ACCELERATE = FIXTURES / "accelerate"
LLAMA = str(ACCELERATE / "models" / "llama")
runner = CliRunner()


def _yaml(tmp_path, text: str):
    path = tmp_path / "accelerate.yaml"
    path.write_text(text)
    return path


def test_a_config_and_its_trainingarguments_give_the_same_settings():
    yaml = load_settings(str(ACCELERATE / "fsdp2_whole_ac.yaml"))
    trainer = load_settings(str(ACCELERATE / "trainer_whole_ac.json"))
    assert (yaml.source, trainer.source) == ("accelerate-config", "training-arguments")
    same = ("mixed_precision", "auto_wrap_policy", "activation_checkpointing", "regional")
    assert all(getattr(yaml, k) == getattr(trainer, k) for k in same)
    assert (yaml.dynamo_backend, trainer.dynamo_backend) == ("inductor", "inductor")
    assert yaml.activation_checkpointing and not yaml.regional
    regional = load_settings(str(ACCELERATE / "fsdp2_regional_ac.yaml"))
    assert regional.regional and regional.activation_checkpointing


def test_a_run_is_a_spec_on_two_ranks():
    spec = spec_for_run(
        "--accelerate", str(ACCELERATE / "fsdp2_regional_noac.yaml"), ("--model", LLAMA)
    )
    assert spec.gbdoctor.framework == "accelerate"
    assert spec.parallelism.world_size == 2 and spec.parallelism.dp_shard == 2
    assert spec.activation_checkpoint.mode == "none" and spec.compile.enable
    assert spec.registry_run is not None and spec.registry_run.config == f"dir:{LLAMA}"


@pytest.mark.parametrize(
    "text, named, alternative",
    [
        (
            "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n",
            "fsdp_version: 1",
            "fsdp_version: 2",
        ),
        (
            "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_sharding_strategy: FULL_SHARD\n",
            "fsdp_sharding_strategy",
            "FSDP2 has no such option",
        ),
        ("distributed_type: DEEPSPEED\n", "DEEPSPEED", 'framework = "deepspeed"'),
        (
            "distributed_type: FSDP\ndeepspeed_config: {}\n",
            "deepspeed_config",
            'framework = "deepspeed"',
        ),
        ("distributed_type: MEGATRON_LM\n", "MEGATRON_LM", "distributed_type: FSDP"),
        ("distributed_type: FSDP\nfsdp_confg: {}\n", "fsdp_confg", "fsdp_config"),
        (
            "distributed_type: FSDP\nfsdp_config: {fsdp_version: 2}\ndynamo_config: {dynamo_use_fullgraf: true}\n",
            "dynamo_use_fullgraf",
            "dynamo_use_fullgraph",
        ),
    ],
    ids=["fsdp1", "fsdp1-key", "deepspeed", "deepspeed-config", "megatron", "typo", "dynamo-typo"],
)
def test_unsupported_or_unknown_keys_exit_2_in_one_line(tmp_path, text, named, alternative):
    path = _yaml(tmp_path, text)
    result = runner.invoke(app, ["scan", "--accelerate", str(path), "--model", LLAMA])
    assert result.exit_code == 2, result.output
    first, *rest = result.stderr.strip().splitlines()
    assert named in first and str(path) in first, first
    assert any(alternative in line for line in rest) or alternative in first, result.stderr
    assert "Traceback" not in result.output


def test_trainingarguments_are_read_strictly(tmp_path):
    good = json.loads((ACCELERATE / "trainer_whole_ac.json").read_text())
    for change, named in [
        ({"torch_compyle": True}, "torch_compyle"),
        ({"fsdp": False}, "fsdp is not set"),
        ({"deepspeed": "ds.json"}, "deepspeed"),
        ({"fsdp_config": {"version": 1}}, "version: 1"),
        ({"fsdp": "hybrid_shard"}, "hybrid_shard"),
    ]:
        path = tmp_path / "args.json"
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(SpecError) as raised:
            load_settings(str(path))
        assert named in raised.value.message, (change, raised.value.message)
        assert raised.value.hint


def test_the_model_is_never_downloaded(tmp_path):
    config = str(ACCELERATE / "fsdp2_regional_ac.yaml")
    (tmp_path / "empty").mkdir()
    for model, named in [
        (str(tmp_path / "empty"), "has no config.json"),
        ("no-such-org/no-such-model-gbdoctor", "not in the local Hugging Face cache"),
        (str(tmp_path / "missing.py") + ":build", "does not exist"),
    ]:
        result = runner.invoke(app, ["scan", "--accelerate", config, "--model", model])
        assert result.exit_code == 2 and named in result.stderr, result.output
    result = runner.invoke(app, ["scan", "--accelerate", config])
    assert result.exit_code == 2 and "--model" in result.stderr


def test_a_toml_spec_with_an_accelerate_section(tmp_path):
    spec_file = tmp_path / "run.toml"
    spec_file.write_text(
        '[model]\nname = "custom"\nfactory = "unused.py:build"\n'
        '[gbdoctor]\nframework = "accelerate"\n'
        f'[accelerate]\nconfig = "{ACCELERATE / "fsdp2_regional_ac.yaml"}"\nmodel = "{LLAMA}"\n'
    )
    spec = load_spec(spec_file)
    assert spec.gbdoctor.framework == "accelerate" and spec.gbdoctor.strategy == "accelerate"
    assert spec.activation_checkpoint.mode == "full"
    assert spec.registry_run is not None and spec.registry_run.config == f"dir:{LLAMA}"
    # [model] is not needed: the [accelerate] section names the model.
    bare = tmp_path / "bare.toml"
    bare.write_text("[gbdoctor]" + spec_file.read_text().split("[gbdoctor]", 1)[1])
    assert "[model]" not in bare.read_text()
    assert load_spec(bare).model == spec.model
    spec_file.write_text(spec_file.read_text() + "confg = 1\n")
    with pytest.raises(SpecError, match="'confg' is not a key"):
        load_spec(spec_file)
    other = tmp_path / "other.toml"
    other.write_text(
        '[model]\nname = "llama3"\nflavor = "debugmodel"\n[accelerate]\nconfig = "x.yaml"\n'
    )
    with pytest.raises(SpecError, match=r"only read with \[gbdoctor\] framework = \"accelerate\""):
        load_spec(other)
