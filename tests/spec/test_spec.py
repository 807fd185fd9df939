"""Spec loading: torchtitan v0.2.2 TOML + [gbdoctor], overrides, and one-line SpecErrors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from repo_paths import FIXTURES, REPO

from gbdoctor.errors import ExitCode, SpecError
from gbdoctor.frameworks.registry import framework_named
from gbdoctor.frameworks.torchtitan_v02 import TorchtitanV02
from gbdoctor.spec import VALID_KEYS, load_spec, parse_override

STRATEGY_NAMES = TorchtitanV02.strategy_names

TITAN_CONFIGS = FIXTURES / "torchtitan_v0.2.2"

LLAMA4 = '[model]\nname = "llama4"\nflavor = "debugmodel"\n'
LLAMA3 = '[model]\nname = "llama3"\nflavor = "debugmodel"\n'


def write(tmp_path: Path, body: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def spec_error(path, overrides=()) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides)
    err = info.value
    assert err.exit_code == ExitCode.BAD_INPUT
    assert "\n" not in err.message, err.message
    return err


# --------------------------------------------------------------------------- fixtures


# (model, flavor, dp_shard, world_size, expert_parallel_degree)
FIXTURE_EXPECTED = {
    "llama3_debug.toml": ("llama3", "debugmodel", 1, 1, 1),
    "llama3_debug_dp2.toml": ("llama3", "debugmodel", 2, 2, 1),
    "llama4_debug.toml": ("llama4", "debugmodel", 1, 1, 1),
    "llama4_debug_ep2.toml": ("llama4", "debugmodel", 2, 2, 2),
    "deepseek_v3_debug.toml": ("deepseek_v3", "debugmodel", 1, 1, 1),
    "deepseek_v3_debug_ep2.toml": ("deepseek_v3", "debugmodel", 2, 2, 2),
    "custom_tiny.toml": ("custom", "tiny", 1, 1, 1),
    # TP fixtures: dp_shard x tp ranks
    "llama3_debug_tp2.toml": ("llama3", "debugmodel", 1, 2, 1),
    "llama4_debug_tp2.toml": ("llama4", "debugmodel", 1, 2, 1),
    "llama3_debug_dp2tp2.toml": ("llama3", "debugmodel", 2, 4, 1),
    # PP fixture: 2 pipeline ranks; the capture batch is the microbatch (2)
    "llama3_debug_pp2.toml": ("llama3", "debugmodel", 1, 2, 1),
    # CP fixture: dp_shard 1 x cp 2 ranks
    "llama3_debug_cp2.toml": ("llama3", "debugmodel", 1, 2, 1),
}


def test_every_fixture_is_covered():
    # DeepSpeed specs need the deepspeed extra to load: tests/frameworks/deepspeed covers them.
    torchtitan = [p.name for p in FIXTURES.glob("*.toml") if not p.name.startswith("deepspeed_")]
    assert sorted(torchtitan) == sorted(FIXTURE_EXPECTED)


@pytest.mark.parametrize("name", sorted(FIXTURE_EXPECTED))
def test_fixture_loads(name):
    model, flavor, dp_shard, world, ep = FIXTURE_EXPECTED[name]
    spec = load_spec(FIXTURES / name)
    assert spec.path == str(FIXTURES / name)
    assert (spec.model.name, spec.model.flavor) == (model, flavor)
    assert spec.parallelism.dp_shard == dp_shard
    assert spec.parallelism.world_size == world
    assert spec.parallelism.expert_parallel_degree == ep
    assert (spec.capture_batch_size, spec.capture_seq_len) == (2, 64)


def test_debug_fixture_values():
    spec = load_spec(FIXTURES / "llama4_debug.toml")
    assert spec.training.local_batch_size == 8 and spec.training.seq_len == 2048
    assert spec.training.steps == 10 and spec.training.max_norm == 1.0
    assert spec.activation_checkpoint.mode == "selective"
    assert spec.activation_checkpoint.selective_ac_option == "op"
    assert spec.compile.enable is False
    assert spec.compile.components == ("model", "loss")
    assert spec.parallelism.data_parallel_shard_degree == -1
    assert spec.gbdoctor.batch_size == 2 and spec.gbdoctor.seq_len == 64
    llama3 = load_spec(FIXTURES / "llama3_debug.toml")
    assert llama3.activation_checkpoint.selective_ac_option == "2"


def test_custom_fixture_factory_is_resolved_next_to_the_spec():
    spec = load_spec(FIXTURES / "custom_tiny.toml")
    assert spec.model.factory == f"{FIXTURES / 'models' / 'tiny_custom.py'}:build"


# --------------------------------------------------------------------------- torchtitan configs

# Configs gbdoctor refuses, and the keys the error must name (none since pipeline parallelism
# is set up: llama4_17bx128e's PP 4 loads, test_torchtitan_llama4_maverick_loads_with_pp4).
TITAN_REFUSED: dict[str, tuple[str, ...]] = {}


def titan_configs() -> list[str]:
    return sorted(p.name for p in TITAN_CONFIGS.glob("*.toml"))


@pytest.mark.parametrize("name", titan_configs())
def test_torchtitan_v022_config_loads_or_is_refused(name):
    path = TITAN_CONFIGS / name
    if name in TITAN_REFUSED:
        err = spec_error(path)
        assert "not supported" in err.message
        for needle in TITAN_REFUSED[name]:
            assert needle in err.message
        # With the unsupported degree overridden, the same config loads, with its TP 8 world.
        overrides = ["parallelism.pipeline_parallel_degree=1"]
        assert load_spec(path, overrides).parallelism.world_size == 8
    else:
        spec = load_spec(path)
        assert spec.model.name in name


def test_torchtitan_llama4_maverick_loads_with_pp4():
    spec = load_spec(TITAN_CONFIGS / "llama4_17bx128e.toml")
    p = spec.parallelism
    # TP 8 x PP 4: the world counts the pipeline ranks; v0.2.2's defaults fill the schedule.
    assert (p.pipeline_parallel_degree, p.tensor_parallel_degree, p.world_size) == (4, 8, 32)
    assert p.pipeline_parallel_schedule == "1F1B" and p.pipeline_parallel_microbatch_size == 1
    # Blocks see microbatches: the capture batch is the microbatch size.
    assert spec.capture_batch_size == 1
    overrides = ["parallelism.pipeline_parallel_degree=1"]
    assert load_spec(TITAN_CONFIGS / "llama4_17bx128e.toml", overrides).parallelism.world_size == 8


def test_pipeline_layout_errors_are_one_line_spec_errors(tmp_path):
    # torchtitan raises these at setup; the spec loader refuses them before anything is built.
    cases = {
        "pipeline_parallel_microbatch_size": (3, "not divisible by"),
        "pipeline_parallel_schedule": ('"Bogus"', "Unknown schedule name"),
        "pipeline_parallel_layers_per_stage": (1, "stages per rank"),
    }
    for key, (value, needle) in cases.items():
        err = spec_error(par(tmp_path, LLAMA4, pipeline_parallel_degree=2, **{key: value}))
        assert needle in err.message and "\n" not in err.message, err.message
        assert err.hint


def test_torchtitan_deepseek_16b_resolves_ep8_world():
    spec = load_spec(TITAN_CONFIGS / "deepseek_v3_16b.toml")
    assert spec.model.flavor == "16B"
    assert spec.parallelism.expert_parallel_degree == 8
    assert (spec.parallelism.dp_shard, spec.parallelism.world_size) == (8, 8)
    assert spec.compile.enable and spec.compile.components == ("loss",)


def test_titan_sections_and_keys_are_accepted(tmp_path):
    path = write(
        tmp_path,
        LLAMA4
        + """
hf_assets_path = "./x"
tokenizer_path = "./t"
converters = ["float8"]
print_after_conversion = true
[training]
dataset = "c4"
dtype = "bfloat16"
global_batch_size = 64
[training.dataloader]
num_workers = 2
[parallelism]
pipeline_parallel_schedule = "1F1B"
module_fqns_per_model_part = [["tok_embeddings"], ["layers.0"]]
context_parallel_load_balancer = "ptrr"
[activation_checkpoint]
early_stop = true
memory_budget = 0.3
determinism_check = "none"
[optimizer]
anything = "goes"
[quantize.linear.float8]
enable_fsdp_float8_all_gather = true
[comm]
init_timeout_seconds = 10
[fault_tolerance]
enable = false
[experimental]
custom_import = ""
[validation]
enable = true
[validation.dataloader]
num_workers = 1
[float8]
x = 1
[debug]
seed = 7
moe_force_load_balance = true
""",
    )
    spec = load_spec(path)
    assert spec.training.seed == 7
    assert spec.activation_checkpoint.mode == "selective"


# --------------------------------------------------------------------------- overrides


@pytest.mark.parametrize(
    "text, expected",
    [
        ("compile.enable=true", ("compile", "enable", True)),
        ("parallelism.expert_parallel_degree=2", ("parallelism", "expert_parallel_degree", 2)),
        (
            'activation_checkpoint.selective_ac_option="op"',
            ("activation_checkpoint", "selective_ac_option", "op"),
        ),
        (
            "activation_checkpoint.selective_ac_option=op",
            ("activation_checkpoint", "selective_ac_option", "op"),
        ),
        ('compile.components=["model"]', ("compile", "components", ["model"])),
        ("gbdoctor.strategy=titan-v0.2.2", ("gbdoctor", "strategy", "titan-v0.2.2")),
        ("gbdoctor.timeout_s=1.5", ("gbdoctor", "timeout_s", 1.5)),
        (" model.flavor = 8B ", ("model", "flavor", "8B")),
        ("training.dataloader.num_workers=2", ("training", "dataloader.num_workers", 2)),
        ("job.description=a=b", ("job", "description", "a=b")),
    ],
)
def test_parse_override(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["compile", "compile=true", ".enable=1", "compile.=1", "=1"])
def test_parse_override_malformed(text):
    with pytest.raises(SpecError, match="section.key=value"):
        parse_override(text)


def test_overrides_are_applied(tmp_path):
    spec = load_spec(
        FIXTURES / "llama4_debug.toml",
        [
            "activation_checkpoint.selective_ac_option=2",
            "activation_checkpoint.mode=full",
            "compile.enable=true",
            'compile.components=["model"]',
            "gbdoctor.strategy=titan-v0.2.2",
            "gbdoctor.device=cpu",
            "gbdoctor.simulate=true",
            "training.seq_len=128",
            "parallelism.expert_parallel_degree=2",
            "debug.seed=3",
            "optimizer.lr=1e-3",
        ],
    )
    assert spec.activation_checkpoint.selective_ac_option == "2"
    assert spec.activation_checkpoint.mode == "full"
    assert spec.compile.enable is True and spec.compile.components == ("model",)
    assert spec.gbdoctor.strategy == "titan-v0.2.2" and spec.gbdoctor.device == "cpu"
    assert spec.gbdoctor.simulate is True
    assert spec.training.seq_len == 128 and spec.capture_seq_len == 64
    assert spec.parallelism.world_size == 2
    assert spec.training.seed == 3


def test_override_string_and_list_shortcuts(tmp_path):
    path = write(tmp_path, LLAMA4)
    spec = load_spec(
        path,
        [
            "activation_checkpoint.selective_ac_option=op",
            "compile.components=loss",
            "gbdoctor.strategy=block",
        ],
    )
    assert spec.activation_checkpoint.selective_ac_option == "op"
    assert spec.compile.components == ("loss",)
    spec = load_spec(path, ["compile.components=model,loss"])
    assert spec.compile.components == ("model", "loss")


def test_override_creates_missing_section(tmp_path):
    spec = load_spec(write(tmp_path, LLAMA4), ["gbdoctor.batch_size=4"])
    assert spec.gbdoctor.batch_size == 4


def test_override_unknown_key_is_the_file_error(tmp_path):
    path = write(tmp_path, LLAMA4)
    err = spec_error(path, ["parallelism.expert_paralel_degree=2"])
    assert str(path) in err.message
    assert "[parallelism]" in err.message and "'expert_paralel_degree'" in err.message
    assert "did you mean 'expert_parallel_degree'" in err.message
    assert "--set parallelism.expert_paralel_degree=2" in err.message


def test_override_unknown_section(tmp_path):
    err = spec_error(write(tmp_path, LLAMA4), ["paralelism.tensor_parallel_degree=1"])
    assert "unknown section [paralelism]" in err.message
    assert "did you mean 'parallelism'" in err.message


def test_override_wrong_type(tmp_path):
    err = spec_error(write(tmp_path, LLAMA4), ["training.seq_len=x"])
    assert "training.seq_len" in err.message and "integer" in err.message
    assert "'x'" in err.message and "--set training.seq_len=x" in err.message


# --------------------------------------------------------------------------- unknown keys/sections


def test_unknown_key_names_file_section_key_and_valid_keys(tmp_path):
    path = write(tmp_path, LLAMA4 + "[parallelism]\nexpert_paralel_degree = 2\n")
    err = spec_error(path)
    assert str(path) in err.message
    assert "[parallelism]" in err.message
    assert "'expert_paralel_degree'" in err.message
    assert "did you mean 'expert_parallel_degree'" in err.message
    assert "valid keys:" in err.message
    for key in VALID_KEYS["parallelism"]:
        assert key in err.message


@pytest.mark.parametrize(
    "section, key",
    [
        ("model", "flavour"),
        ("training", "batch_size"),
        ("compile", "fullgraph"),
        ("activation_checkpoint", "option"),
        ("gbdoctor", "stratgy"),
    ],
)
def test_unknown_key_in_every_read_section(tmp_path, section, key):
    body = LLAMA4 + (f"{key} = 1\n" if section == "model" else f"[{section}]\n{key} = 1\n")
    err = spec_error(write(tmp_path, body))
    assert f"[{section}]" in err.message and f"'{key}'" in err.message


def test_gbdoctor_keys_are_toolspec_fields():
    assert VALID_KEYS["gbdoctor"] == {
        "strategy",
        "batch_size",
        "seq_len",
        "device",
        "timeout_s",
        "simulate",
        "world_size",
        "blocks",
        "framework",
        "deepspeed_config",
    }
    assert "factory" in VALID_KEYS["model"] and "hf_assets_path" in VALID_KEYS["model"]


def test_unknown_section(tmp_path):
    path = write(tmp_path, LLAMA4 + "[paralelism]\ntensor_parallel_degree = 1\n")
    err = spec_error(path)
    assert str(path) in err.message
    assert "unknown section [paralelism]" in err.message
    assert "did you mean 'parallelism'" in err.message
    assert "known sections:" in err.message and "gbdoctor" in err.message


def test_top_level_key_is_not_a_section(tmp_path):
    err = spec_error(write(tmp_path, "seed = 1\n" + LLAMA4))
    assert "unknown section [seed]" in err.message
    err = spec_error(write(tmp_path, "training = 1\n" + LLAMA4))
    assert "[training] must be a table" in err.message


# --------------------------------------------------------------------------- types


@pytest.mark.parametrize(
    "section, line, needles",
    [
        ("training", 'seq_len = "x"', ("training.seq_len", "an integer", "'x'")),
        ("training", "steps = true", ("training.steps", "an integer", "True")),
        ("training", "local_batch_size = 2.0", ("training.local_batch_size", "an integer", "2.0")),
        ("training", 'max_norm = "1"', ("training.max_norm", "a number", "'1'")),
        ("compile", "enable = 1", ("compile.enable", "a boolean", "1")),
        ("compile", 'components = "model"', ("compile.components", "an array of strings")),
        ("compile", "components = [1]", ("compile.components", "an array of strings")),
        ("parallelism", 'expert_parallel_degree = "2"', ("parallelism.expert_parallel_degree",)),
        (
            "activation_checkpoint",
            "selective_ac_option = true",
            ("activation_checkpoint.selective_ac_option", "a string"),
        ),
        ("gbdoctor", 'simulate = "yes"', ("gbdoctor.simulate", "a boolean")),
        ("gbdoctor", "strategy = 2", ("gbdoctor.strategy", "a string")),
    ],
)
def test_wrong_type(tmp_path, section, line, needles):
    err = spec_error(write(tmp_path, LLAMA4 + f"[{section}]\n{line}\n"))
    for needle in needles:
        assert needle in err.message, err.message


def test_model_name_wrong_type(tmp_path):
    err = spec_error(write(tmp_path, "[model]\nname = 3\n"))
    assert "model.name must be a string" in err.message


def test_int_is_accepted_where_titan_takes_a_float_or_an_option(tmp_path):
    spec = load_spec(
        write(
            tmp_path,
            LLAMA4 + "[training]\nmax_norm = 2\n"
            "[activation_checkpoint]\nselective_ac_option = 3\n"
            "[gbdoctor]\ntimeout_s = 30\n",
        )
    )
    assert spec.training.max_norm == 2.0
    assert spec.activation_checkpoint.selective_ac_option == "3"
    assert spec.gbdoctor.timeout_s == 30.0


# --------------------------------------------------------------------------- files


def test_malformed_toml(tmp_path):
    path = write(tmp_path, LLAMA4 + "[training]\nseq_len = \n")
    err = spec_error(path)
    assert str(path) in err.message and "invalid TOML" in err.message
    assert "line 5" in err.message


def test_missing_file(tmp_path):
    err = spec_error(tmp_path / "nope.toml")
    assert "nope.toml" in err.message and "not found" in err.message


def test_directory(tmp_path):
    err = spec_error(tmp_path)
    assert "directory" in err.message


def test_pathlike_and_str_paths(tmp_path):
    path = write(tmp_path, LLAMA4)
    assert load_spec(path).path == str(path)
    assert load_spec(str(path)).path == str(path)


def test_missing_model(tmp_path, monkeypatch):
    assert "missing [model]" in spec_error(write(tmp_path, "[training]\nsteps = 1\n")).message
    assert "name is required" in spec_error(write(tmp_path, '[model]\nflavor = "x"\n')).message
    # A framework's own section stands in for [model] only when the framework's check replaces
    # the model from it (Accelerate's does). DeepSpeed's [deepspeed] does not; its check is
    # stubbed to pass the spec through, as it does with the package installed.
    deepspeed = framework_named("deepspeed")
    monkeypatch.setattr(type(deepspeed), "check_spec", lambda self, spec, *args: spec)
    zero = '[gbdoctor]\nframework = "deepspeed"\n[deepspeed]\nzero_stage = 1\n'
    assert "missing [model]" in spec_error(write(tmp_path, zero)).message


def test_flavor_defaults_to_debugmodel(tmp_path):
    assert load_spec(write(tmp_path, '[model]\nname = "llama3"\n')).model.flavor == "debugmodel"


# --------------------------------------------------------------------------- model


def test_unknown_family(tmp_path):
    err = spec_error(write(tmp_path, '[model]\nname = "llama5"\n'))
    assert "model.name = 'llama5'" in err.message and "llama4" in err.message
    assert "custom" in err.message


def test_unknown_flavor(tmp_path):
    err = spec_error(write(tmp_path, '[model]\nname = "llama3"\nflavor = "debug"\n'))
    assert "'debug'" in err.message and "debugmodel" in err.message


def test_relative_factory_path_is_resolved_against_the_spec_dir(tmp_path, monkeypatch):
    sub = tmp_path / "specs"
    sub.mkdir()
    path = write(
        sub, '[model]\nname = "custom"\nflavor = "tiny"\nfactory = "../models/my_model.py:build"\n'
    )
    monkeypatch.chdir(REPO)  # resolution must not depend on the working directory
    spec = load_spec(os.path.relpath(path, REPO))
    assert spec.model.factory == f"{tmp_path / 'models' / 'my_model.py'}:build"
    assert spec.model.flavor == "tiny"


def test_absolute_and_module_factories_are_kept(tmp_path):
    body = '[model]\nname = "custom"\nfactory = "{}"\n'
    spec = load_spec(write(tmp_path, body.format("my_pkg.models:build_model")))
    assert spec.model.factory == "my_pkg.models:build_model"
    target = tmp_path / "m.py"
    spec = load_spec(write(tmp_path, body.format(f"{target}:build")))
    assert spec.model.factory == f"{target}:build"
    spec = load_spec(write(tmp_path, body.format("m.py:build")))
    assert spec.model.factory == f"{target}:build"


@pytest.mark.parametrize(
    "factory",
    ["model.py", "my_pkg.models", "m.py:", ":build", "my-pkg.models:build", "m.py:build-it"],
)
def test_bad_factory(tmp_path, factory):
    err = spec_error(write(tmp_path, f'[model]\nname = "custom"\nfactory = "{factory}"\n'))
    assert "model.factory" in err.message and factory in err.message


def test_custom_needs_a_factory(tmp_path):
    err = spec_error(write(tmp_path, '[model]\nname = "custom"\nflavor = "tiny"\n'))
    assert "factory" in err.message


def test_factory_only_with_custom(tmp_path):
    err = spec_error(write(tmp_path, LLAMA3 + 'factory = "m.py:build"\n'))
    assert "model.factory" in err.message and "custom" in err.message


# --------------------------------------------------------------------------- parallelism


def par(tmp_path, model: str, **degrees):
    lines = "".join(f"{k} = {v}\n" for k, v in degrees.items())
    return write(tmp_path, model + "[parallelism]\n" + lines)


@pytest.mark.parametrize(
    "degrees, dp_shard, world",
    [
        ({}, 1, 1),
        ({"expert_parallel_degree": 2}, 2, 2),
        ({"expert_parallel_degree": 8}, 8, 8),
        ({"expert_parallel_degree": 2, "data_parallel_shard_degree": 4}, 4, 4),
        ({"expert_parallel_degree": 2, "data_parallel_replicate_degree": 2}, 2, 4),
        ({"data_parallel_shard_degree": 3}, 3, 3),
        ({"data_parallel_replicate_degree": 2}, 1, 2),
    ],
)
def test_world_size_resolution(tmp_path, degrees, dp_shard, world):
    p = load_spec(par(tmp_path, LLAMA4, **degrees)).parallelism
    assert (p.dp_shard, p.world_size) == (dp_shard, world)
    assert p.data_parallel_shard_degree == degrees.get("data_parallel_shard_degree", -1)


def test_ep_must_divide_experts(tmp_path):
    err = spec_error(par(tmp_path, LLAMA4, expert_parallel_degree=3))
    assert "expert_parallel_degree = 3" in err.message
    assert "does not divide the 8 experts" in err.message


def test_ep_on_dense_model(tmp_path):
    err = spec_error(par(tmp_path, LLAMA3, expert_parallel_degree=2))
    assert "expert_parallel_degree = 2" in err.message and "dense" in err.message


def test_ep_must_divide_dp_shard(tmp_path):
    err = spec_error(par(tmp_path, LLAMA4, expert_parallel_degree=4, data_parallel_shard_degree=2))
    assert "expert_parallel_degree = 4" in err.message
    assert "data_parallel_shard_degree = 2" in err.message


def test_cp_multiplies_the_world_and_keeps_the_rotate_method(tmp_path):
    spec = load_spec(
        par(
            tmp_path, LLAMA3, context_parallel_degree=2, context_parallel_rotate_method='"alltoall"'
        )
    )
    p = spec.parallelism
    assert (p.context_parallel_degree, p.dp_shard, p.world_size) == (2, 1, 2)
    assert p.context_parallel_rotate_method == "alltoall"
    assert load_spec(FIXTURES / "llama3_debug_cp2.toml").parallelism.world_size == 2


@pytest.mark.parametrize(
    "body, needle, hint",
    [
        (
            LLAMA3 + "[parallelism]\ncontext_parallel_degree = 2\ntensor_parallel_degree = 2\n",
            "together with tensor_parallel_degree = 2: not supported yet",
            "--set parallelism.tensor_parallel_degree=1",
        ),
        (
            LLAMA3 + "[parallelism]\ncontext_parallel_degree = 2\npipeline_parallel_degree = 2\n",
            "together with pipeline_parallel_degree = 2: not supported yet",
            "--set parallelism.pipeline_parallel_degree=1",
        ),
        (
            '[model]\nname = "llama3"\nflavor = "debugmodel_flex_attn"\n'
            "[parallelism]\ncontext_parallel_degree = 2\n",
            "CP's Flex path cannot run on CPU",
            "--set model.flavor=debugmodel",
        ),
        (
            LLAMA3 + "[parallelism]\ncontext_parallel_degree = 4\n[gbdoctor]\nseq_len = 68\n",
            "gbdoctor.seq_len = 68 is not divisible by 2 x context_parallel_degree = 8",
            "multiple of 8",
        ),
        (
            LLAMA3 + '[parallelism]\ncontext_parallel_rotate_method = "ring"\n',
            "context_parallel_rotate_method = 'ring' is not one of allgather, alltoall",
            "allgather",
        ),
    ],
)
def test_cp_variants_refused_with_a_reason_and_a_next_step(tmp_path, body, needle, hint):
    err = spec_error(write(tmp_path, body))
    assert needle in err.message and hint in err.hint


@pytest.mark.parametrize(
    "degrees, world",
    [
        (dict(tensor_parallel_degree=2), 2),
        (dict(tensor_parallel_degree=2, data_parallel_shard_degree=2), 4),
        (
            dict(
                tensor_parallel_degree=2,
                data_parallel_shard_degree=2,
                data_parallel_replicate_degree=2,
            ),
            8,
        ),
    ],
)
def test_tp_multiplies_the_world(tmp_path, degrees, world):
    spec = load_spec(par(tmp_path, LLAMA3, **degrees))
    assert spec.parallelism.world_size == world
    assert spec.parallelism.tensor_parallel_degree == degrees["tensor_parallel_degree"]


@pytest.mark.parametrize(
    "extra, needle",
    [
        (
            "tensor_parallel_degree = 2\nexpert_tensor_parallel_degree = 4\n",
            "torchtitan accepts only 1 or the TP degree",
        ),
        (
            "tensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n",
            "async TP is not supported",
        ),
        ("tensor_parallel_degree = 2\nexpert_parallel_degree = 2\n", "EP borrowing ranks from TP"),
    ],
)
def test_tp_variants_refused_with_a_reason(tmp_path, extra, needle):
    err = spec_error(write(tmp_path, LLAMA4 + "[parallelism]\n" + extra))
    assert needle in err.message and err.hint


def test_tp_needs_a_divisible_sequence(tmp_path):
    path = write(
        tmp_path, LLAMA3 + "[parallelism]\ntensor_parallel_degree = 4\n[gbdoctor]\nseq_len = 66\n"
    )
    err = spec_error(path)
    assert "gbdoctor.seq_len = 66 is not divisible by tensor_parallel_degree = 4" in err.message


@pytest.mark.parametrize(
    "key, value",
    [
        ("data_parallel_shard_degree", 0),
        ("data_parallel_shard_degree", -2),
        ("data_parallel_replicate_degree", 0),
        ("data_parallel_replicate_degree", -1),
        ("expert_parallel_degree", 0),
        ("tensor_parallel_degree", -1),
    ],
)
def test_bad_degrees(tmp_path, key, value):
    err = spec_error(par(tmp_path, LLAMA4, **{key: value}))
    assert f"parallelism.{key}" in err.message and str(value) in err.message


def test_deepep_backend_with_ep_is_refused(tmp_path):
    path = write(
        tmp_path,
        LLAMA4 + "[parallelism]\nexpert_parallel_degree = 2\n"
        'expert_parallel_comm_backend = "deepep"\n',
    )
    assert "not supported yet" in spec_error(path).message


def test_bad_reshard_policy(tmp_path):
    path = write(tmp_path, LLAMA4 + '[parallelism]\nfsdp_reshard_after_forward = "sometimes"\n')
    assert "fsdp_reshard_after_forward" in spec_error(path).message


# --------------------------------------------------------------------------- AC, compile, training


@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_ac_modes(tmp_path, mode):
    spec = load_spec(write(tmp_path, LLAMA4 + f'[activation_checkpoint]\nmode = "{mode}"\n'))
    assert spec.activation_checkpoint.mode == mode


def test_ac_memory_budget_not_supported(tmp_path):
    err = spec_error(write(tmp_path, LLAMA4 + '[activation_checkpoint]\nmode = "memory_budget"\n'))
    assert "memory_budget" in err.message and "not supported yet" in err.message


def test_ac_bad_mode(tmp_path):
    err = spec_error(write(tmp_path, LLAMA4 + '[activation_checkpoint]\nmode = "ful"\n'))
    assert "activation_checkpoint.mode = 'ful'" in err.message and "full" in err.message


@pytest.mark.parametrize("option", ["0", "-1", "x", "", "ops", "1.5"])
def test_ac_bad_option(tmp_path, option):
    path = write(tmp_path, LLAMA4 + f'[activation_checkpoint]\nselective_ac_option = "{option}"\n')
    assert "selective_ac_option" in spec_error(path).message


def test_ac_fields(tmp_path):
    spec = load_spec(
        write(
            tmp_path,
            LLAMA4 + "[activation_checkpoint]\n"
            'per_op_sac_force_recompute_mm_shapes_by_fqns = ["a", "b"]\n'
            "preserve_rng_state = true\n",
        )
    )
    ac = spec.activation_checkpoint
    assert ac.per_op_sac_force_recompute_mm_shapes_by_fqns == ("a", "b")
    assert ac.preserve_rng_state is True


def test_compile_components(tmp_path):
    spec = load_spec(write(tmp_path, LLAMA4 + '[compile]\ncomponents = []\nbackend = "eager"\n'))
    assert spec.compile.components == () and spec.compile.backend == "eager"
    err = spec_error(write(tmp_path, LLAMA4 + '[compile]\ncomponents = ["model", "optimizer"]\n'))
    assert "'optimizer'" in err.message and "compile.components" in err.message


@pytest.mark.parametrize(
    "line, needle",
    [
        ("local_batch_size = 0", "training.local_batch_size"),
        ("seq_len = -1", "training.seq_len"),
        ("steps = 0", "training.steps"),
        ('mixed_precision_param = "float16"', "training.mixed_precision_param"),
        ('mixed_precision_reduce = "fp32"', "training.mixed_precision_reduce"),
    ],
)
def test_training_checks(tmp_path, line, needle):
    assert needle in spec_error(write(tmp_path, LLAMA4 + f"[training]\n{line}\n")).message


# --------------------------------------------------------------------------- [gbdoctor]


def test_strategy_names():
    assert STRATEGY_NAMES == (
        "none",
        "block",
        "block-nofullgraph",
        "titan-v0.2.0",
        "titan-v0.2.2",
        "children",
    )


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_every_strategy_loads(tmp_path, strategy):
    spec = load_spec(write(tmp_path, LLAMA4), [f"gbdoctor.strategy={strategy}"])
    assert spec.gbdoctor.strategy == strategy


@pytest.mark.parametrize(
    "line, needle",
    [
        ('strategy = "blok"', "did you mean 'block'"),
        ('device = "gpu"', "gbdoctor.device"),
        ("batch_size = -1", "gbdoctor.batch_size"),
        ("seq_len = -8", "gbdoctor.seq_len"),
        ("timeout_s = 0", "gbdoctor.timeout_s"),
    ],
)
def test_gbdoctor_checks(tmp_path, line, needle):
    assert needle in spec_error(write(tmp_path, LLAMA4 + f"[gbdoctor]\n{line}\n")).message


def test_gbdoctor_defaults(tmp_path):
    spec = load_spec(write(tmp_path, LLAMA4 + "[training]\nlocal_batch_size = 3\nseq_len = 32\n"))
    assert spec.gbdoctor.strategy == "block" and spec.gbdoctor.device == "auto"
    assert (spec.capture_batch_size, spec.capture_seq_len) == (3, 32)
