"""DeepSpeed specs: both forms of the config, validation by DeepSpeed's own config classes, bad
input as one-line errors (exit 2); the causes, the recompile-limit parsing and the emitter, whose
output DeepSpeed itself accepts. No rank is started here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repo_paths import FIXTURES, REPO
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.errors import SpecError
from gbdoctor.spec import load_spec

pytestmark = pytest.mark.extra("deepspeed")
ZERO1, ZERO2, ZERO3 = (FIXTURES / f"deepspeed_zero{n}.toml" for n in (1, 2, 3))


def test_table_and_json_file_forms_load_with_their_zero_stage():
    z1, z2, z3 = load_spec(ZERO1), load_spec(ZERO2), load_spec(ZERO3)
    assert [s.deepspeed.zero_stage for s in (z1, z2, z3)] == [1, 2, 3]
    assert z1.deepspeed.source == "[deepspeed]" and z2.deepspeed.source == "deepspeed/zero2.json"
    # The JSON file's own keys reach DeepSpeed unchanged.
    cfg2 = json.loads(z2.deepspeed.config_json)
    assert cfg2["zero_optimization"] == {
        "stage": 2,
        "overlap_comm": False,
        "contiguous_gradients": True,
    }
    assert cfg2["gradient_clipping"] == 1.0
    # framework = deepspeed: engine.compile() unless the spec names a strategy; ZeRO shards over 2 ranks.
    assert z2.gbdoctor.strategy == "engine" and z3.parallelism.world_size == 2
    assert z3.activation_checkpoint.mode == "none"


def test_missing_keys_are_filled_and_recorded(tmp_path):
    spec = tmp_path / "ds.toml"
    head = ZERO3.read_text().split("\n[deepspeed]\n")[0].replace('"models/', f'"{FIXTURES}/models/')
    spec.write_text(head + "\n[deepspeed]\nzero_optimization = { stage = 2 }\n")
    loaded = load_spec(spec)
    cfg = json.loads(loaded.deepspeed.config_json)
    assert cfg["train_micro_batch_size_per_gpu"] == loaded.capture_batch_size
    assert cfg["optimizer"] == {"type": "AdamW", "params": {"lr": 8e-4, "torch_adam": True}}
    assert len(loaded.deepspeed.filled) == 2


@pytest.mark.parametrize(
    "override, needles",
    [
        # DeepSpeed 0.19's CompileConfig forbids the old compile.enabled/backend keys.
        (
            "deepspeed.compile.enabled=true",
            ["CompileConfig", "enabled", "Extra inputs are not permitted"],
        ),
        ("deepspeed.zero_optimization.stag=3", ["DeepSpeedZeroConfig", "stag"]),
        ("deepspeed.zero_optimization.stage=7", ["DeepSpeedZeroConfig", "stage"]),
    ],
)
def test_deepspeed_rejects_bad_keys_with_its_own_message(override, needles):
    with pytest.raises(SpecError) as err:
        load_spec(ZERO3, [override])
    message = err.value.message
    assert "DeepSpeed rejects the config" in message and "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_bad_key_in_the_json_file_names_the_file(tmp_path):
    (tmp_path / "ds.json").write_text(
        json.dumps({"zero_optimization": {"stage": 3, "overlap_com": True}})
    )
    spec = tmp_path / "spec.toml"
    spec.write_text(
        ZERO2.read_text()
        .replace("deepspeed/zero2.json", "ds.json")
        .replace('"models/', f'"{FIXTURES}/models/')
    )
    with pytest.raises(SpecError, match=r"ds\.json: DeepSpeed rejects the config: .*overlap_com"):
        load_spec(spec)


@pytest.mark.parametrize(
    "text, needle",
    [
        (
            '[gbdoctor]\nframework = "torchtitan"\n[deepspeed]\nzero_optimization = { stage = 3 }\n',
            "only read with",
        ),
        ('[gbdoctor]\nframework = "deepspeed"\n', "needs a DeepSpeed config"),
        (
            '[gbdoctor]\nframework = "deepspeed"\nstrategy = "titan-v0.2.2"\n[deepspeed]\nzero_optimization = { stage = 3 }\n',
            "engine, block, none",
        ),
        ('[gbdoctor]\nframework = "deepspeeed"\n', "did you mean 'deepspeed'"),
        ('[gbdoctor]\nframework = "deepspeed"\ndeepspeed_config = "missing.json"\n', "not found"),
    ],
)
def test_framework_mismatches_are_spec_errors(tmp_path, text, needle):
    spec = tmp_path / "s.toml"
    spec.write_text(
        f'[model]\nname = "custom"\nflavor = "tiny"\nfactory = "{FIXTURES}/models/tiny_custom.py:build"\n'
        + text
    )
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert needle in err.value.message


def test_cli_bad_deepspeed_key_is_one_line_exit_2():
    result = CliRunner().invoke(
        app, ["scan", str(ZERO3), "--set", "deepspeed.compile.backend=inductor"]
    )
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    text = " ".join(result.stderr.split())  # the console wraps long lines
    assert (
        lines[0].startswith("Error: ")
        and "CompileConfig: backend: Extra inputs are not permitted" in text
    )
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------- causes


def test_zero_hook_cause_and_rules():
    from gbdoctor.causes import classify
    from gbdoctor.frameworks.registry import cause_taxonomy, framework_named, hooks_of
    from gbdoctor.records import Location, RawBreak

    zero = hooks_of(framework_named("deepspeed"))  # the framework's own hook library

    cause = cause_taxonomy().causes["zero-hook"]  # DeepSpeed contributes it
    assert cause.owner == "training-setup"
    fixes = " ".join(cause.fixes)
    for needle in ("leaf_module", "ZeRO-1 or ZeRO-2", "DeepCompile", "compiled_autograd"):
        assert needle in fixes
    assert (
        classify(
            RawBreak(
                gb_type="Attempted to inline function marked as skipped",
                message="",
                component="zero",
            ),
            zero,
        )
        == "zero-hook"
    )
    # By location alone: the innermost library frames are ZeRO's.
    frames = (
        Location(file="/x/model.py", line=3, function="forward"),
        Location(
            file="/site-packages/deepspeed/runtime/zero/parameter_offload.py",
            line=412,
            function="_pre_backward_module_hook",
        ),
        Location(file="/site-packages/torch/autograd/function.py", line=802, function="apply"),
    )
    assert (
        classify(
            RawBreak(gb_type="Unexpected type in sourceless builder", message="", frames=frames),
            zero,
        )
        == "zero-hook"
    )
    # FSDP stays FSDP.
    fsdp = (
        Location(
            file="/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_state.py",
            line=1,
            function="f",
        ),
    )
    assert (
        classify(
            RawBreak(
                gb_type="Skip calling `torch.compiler.disable()`d function", message="", frames=fsdp
            ),
            zero,
        )
        == "fsdp-hook"
    )


def test_deepspeed_engine_hooks_are_the_deepspeed_component_and_zero_hooks_stay_zero():
    """``inspect`` names the installer of every hook by the file its code lives in: the engine's
    own forward hooks (``runtime/engine.py``) are ``deepspeed``, ZeRO's (``runtime/zero/``)
    ``zero``, and code outside DeepSpeed is the user's."""
    import importlib.util

    import torch.nn as nn

    from gbdoctor.capture import find_hooks

    root = Path(importlib.util.find_spec("deepspeed").submodule_search_locations[0])

    def hook_from(path: Path):
        namespace: dict = {}
        exec(compile("def hook(module, args):\n    return None\n", str(path), "exec"), namespace)
        return namespace["hook"]

    model = nn.Sequential(nn.Linear(2, 2))
    model.register_forward_pre_hook(hook_from(root / "runtime" / "engine.py"))
    model[0].register_forward_pre_hook(
        hook_from(root / "runtime" / "zero" / "parameter_offload.py")
    )
    model[0].register_forward_hook(hook_from(REPO / "fixtures" / "models" / "planted.py"))
    installers = {(h.module, h.kind): h.installer for h in find_hooks(model, ())}
    assert installers == {
        ("", "forward_pre"): "deepspeed",
        ("0", "forward_pre"): "zero",
        ("0", "forward"): "user",
    }


# --------------------------------------------------------------------------- recompiles


LIMIT_WARNING = """torch._dynamo hit config.recompile_limit (8)
   function: '_pre_backward_module_hook' (/venv/site-packages/deepspeed/runtime/zero/parameter_offload.py:410)
   last reason: 28/7: tensor 'output' size mismatch at index 2. expected 64, actual 128
To log all recompilation reasons, use TORCH_LOGS="recompiles".
To diagnose recompilation issues, see https://pytorch.org/docs/main/torch.compiler_troubleshooting.html"""


def test_recompile_limit_warning_is_a_record():
    from gbdoctor.capture.recompiles import parse_recompile_limit

    rec = parse_recompile_limit(LIMIT_WARNING, step=0, measured=False)
    assert rec.limit_hit and rec.failed_entries == 8
    assert (
        rec.function
        == "_pre_backward_module_hook at /venv/site-packages/deepspeed/runtime/zero/parameter_offload.py:410"
    )
    assert rec.reason == "tensor 'output' size mismatch at index 2. expected 64, actual 128"
    assert parse_recompile_limit("some other warning", step=0, measured=False) is None


def test_real_dynamo_recompiles_and_limit_hit_are_captured():
    """Real Dynamo as the oracle: a function guarded on an int recompiles once per new value and
    hits recompile_limit on the third; the recorder sees both streams."""
    import torch
    import torch._dynamo

    from gbdoctor.capture.recompiles import watch_recompiles

    def scale(x, k):
        return x * k

    compiled = torch.compile(scale, backend="eager", dynamic=False)
    torch._dynamo.reset()
    with (
        torch._dynamo.config.patch(recompile_limit=2, automatic_dynamic_shapes=False),
        watch_recompiles() as rec,
    ):
        for step, k in enumerate((1, 2, 3, 4)):
            rec.tag(step=step, measured=False)
            compiled(torch.ones(2), k)
    torch._dynamo.reset()
    plain = [r for r in rec.records if not r.limit_hit]
    limits = [r for r in rec.records if r.limit_hit]
    assert [r.step for r in plain] == [1, 2] and all("k == " in r.reason for r in plain)
    assert (
        rec.limit_hit
        and limits
        and limits[0].step == 2
        and limits[0].function.startswith("scale at ")
    )


def test_guard_object_ids_are_dropped():
    from gbdoctor.capture.recompiles import parse_recompile

    text = (
        "Recompiling function hook in /x/p.py:10\n    triggered by the following guard failure(s):\n"
        "    - 3/0: ___check_type_id(module, 94347476639120), type=<class 'Embedding'>  # code  # p.py:12 in hook"
    )
    assert (
        parse_recompile(text, step=0, measured=False).reason
        == "___check_type_id(module), type=<class 'Embedding'>"
    )


# --------------------------------------------------------------------------- emitter


def _plan(mode: str, leaf: tuple[str, ...]):
    from gbdoctor.records import DeepSpeedPlan, KindPlan, Plan

    kind = KindPlan(
        kind="dense", layers=("layers.0", "layers.1"), mode=mode, fullgraph=True, verified=True
    )
    return Plan(
        spec="s.toml",
        model="custom/tiny",
        torch_version="2.13",
        baseline_strategy="engine",
        flags=(),
        flag_costs=(),
        kinds=(kind,),
        verified=True,
        rounds=1,
        framework="deepspeed",
        deepspeed=DeepSpeedPlan(
            mode=mode,
            fullgraph=True,
            zero_stage=3,
            leaf_modules=leaf,
            remaining=("model: frame_skipped: x",),
        ),
    )


@pytest.mark.parametrize("mode, leaf", [("forward", ("tiny_custom.DecoderLayer",)), ("engine", ())])
def test_emitted_deepspeed_config_loads_in_deepspeed(mode, leaf):
    from gbdoctor.frameworks.deepspeed.setup import validate_config
    from gbdoctor.plan.emit import emit

    text = emit(_plan(mode, leaf), "deepspeed")
    namespace: dict = {}
    exec(compile(text, "emitted.py", "exec"), namespace)  # valid Python, and it runs
    user = json.loads(load_spec(ZERO3).deepspeed.config_json)
    merged = namespace["merge_config"](user)
    assert validate_config(merged, world_size=2, where="emitted") == 3  # DeepSpeed accepts it
    assert "deepcompile" not in json.dumps(namespace["DS_CONFIG"])  # never on CPU-verified plans
    if leaf:
        assert merged["zero_optimization"]["leaf_module"]["classes"] == list(leaf)
        assert "block.forward = torch.compile(block.forward" in text
    else:
        assert namespace["DS_CONFIG"] == {} and "engine.compile(backend=backend" in text
    assert "Breaks the plan does not remove" in text


# --------------------------------------------------------------------------- plan files


def test_deepspeed_plan_file_round_trips_and_applies_to_deepspeed_specs_only(tmp_path):
    from gbdoctor.errors import BaselineError
    from gbdoctor.plan import dump_plan, plan_strategy, read_plan

    path = tmp_path / "plan.json"
    path.write_text(dump_plan(_plan("forward", ("DecoderLayer",))))
    plan, identity = read_plan(path)
    strategy = plan_strategy(plan, load_spec(ZERO3), identity=identity)
    assert (strategy.mode, strategy.leaf_blocks, strategy.fullgraph) == ("forward", True, True)
    assert strategy.plan == identity
    with pytest.raises(SpecError, match="is a DeepSpeed plan; spec .* has framework 'torchtitan'"):
        plan_strategy(plan, load_spec(REPO / "fixtures" / "llama3_debug.toml"))
    # A plan that says deepspeed without the deepspeed record (or the reverse) is malformed.
    data = json.loads(path.read_text())
    data["deepspeed"] = None
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError, match=r"\$\.deepspeed"):
        read_plan(path)


def test_a_stale_jit_lock_is_an_error_naming_what_to_delete(tmp_path, monkeypatch):
    """torch waits forever on a JIT build lock a killed build left; gbdoctor checks it before
    any DeepSpeed rank starts and names the directory to delete (exit 3)."""
    from gbdoctor.errors import ExitCode, SetupError
    from gbdoctor.frameworks.deepspeed.setup import SHM_OP, check_jit_lock, jit_build_dir

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    build_dir = tmp_path / SHM_OP
    assert jit_build_dir() == str(build_dir)
    check_jit_lock("cpu", wait_s=0)  # no lock: nothing to say
    build_dir.mkdir()
    (build_dir / "lock").touch()
    with pytest.raises(SetupError) as info:
        check_jit_lock("cpu", wait_s=0.2, poll_s=0.1)
    assert info.value.exit_code == ExitCode.ENVIRONMENT
    assert str(build_dir / "lock") in info.value.message and str(build_dir) in info.value.hint
    check_jit_lock("cuda", wait_s=0)  # CUDA runs build no shm op
