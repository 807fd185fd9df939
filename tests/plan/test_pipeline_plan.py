"""``plan`` and ``gate`` per pipeline stage, on a model whose stages differ for real: four clean
blocks under PP 2, then the same model with a break planted in ``layers.3`` only
(``fixtures/models/staged.py``), so stage 1 holds a kind (``dense#2``) that stage 0 does not.
Scans are simulated (fake process group, one process), as a production PP config's are.

The oracle of the stage split is the installed torchtitan's own (``tests/setup/
test_pipeline_layout.py`` for the rules); of the emitted code, the model parts that split
produces, each handed to the emitted ``apply_compile`` as torchtitan's parallelize would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plan_factory import make_plan
from repo_paths import FIXTURES
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.records import PLAN_SCHEMA_VERSION, StagePlan
from gbdoctor.scan import memory_estimate

runner = CliRunner()
STAGED = FIXTURES / "models" / "staged.py"


def _spec(path: Path, flavor: str) -> Path:
    """The user's config: PP 2 (1F1B), no AC, simulated; rewritten in place for a change."""
    path.write_text(
        f"""[model]
name = "custom"
flavor = "{flavor}"
factory = "{STAGED.as_posix()}:build"

[training]
local_batch_size = 2
seq_len = 64

[parallelism]
pipeline_parallel_degree = 2

[activation_checkpoint]
mode = "none"

[gbdoctor]
simulate = true
seq_len = 64
"""
    )
    return path


@pytest.fixture(autouse=True)
def _no_memory_override(monkeypatch):
    monkeypatch.delenv(memory_estimate.AVAILABLE_ENV, raising=False)


@pytest.fixture(scope="module")
def broken_plan(tmp_path_factory):
    from gbdoctor.plan import propose_plan
    from gbdoctor.spec import load_spec

    spec = load_spec(_spec(tmp_path_factory.mktemp("plan") / "s.toml", "print_in_layer_3"))
    return propose_plan(spec)


@pytest.mark.slow  # simulated scans: minutes on shared cores
def test_the_gate_fails_naming_the_stage_a_break_appears_in(tmp_path):
    spec = _spec(tmp_path / "s.toml", "clean")
    baseline = tmp_path / "baseline.json"
    made = runner.invoke(app, ["gate", str(spec), "--baseline", str(baseline), "--update-baseline"])
    assert made.exit_code == 0, made.stderr
    keys = set(next(iter(json.loads(baseline.read_text())["specs"].values())))
    assert keys == {"stage 0/dense", "stage 1/dense"}

    _spec(spec, "print_in_layer_3")  # the change: layers.3's code now prints
    checked = runner.invoke(app, ["gate", str(spec), "--baseline", str(baseline), "-f", "json"])
    assert checked.exit_code == 1, checked.stdout
    result = json.loads(checked.stdout)
    failing = [f for f in result["findings"] if f["severity"] == "regression"]
    assert failing, result["findings"]
    # The new break is stage 1's (layers.3); stage 0 is unchanged and named nowhere.
    assert {f["kind"] for f in failing} == {"stage 1/dense#2"}, failing
    assert any(f["cause"] == "python-side-effect" for f in failing), failing
    assert not any(f["kind"].startswith("stage 0/") for f in result["findings"])
    text = runner.invoke(app, ["gate", str(spec), "--baseline", str(baseline)])
    assert text.exit_code == 1 and "stage 1/dense#2" in text.stdout


@pytest.mark.slow  # simulated scans: minutes on shared cores
def test_plan_keys_stages_whose_kinds_differ(broken_plan):
    titan_pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    plan = broken_plan
    assert plan.verified, [k.detail for k in plan.kinds]
    assert [k.kind for k in plan.kinds] == ["dense", "dense#2"]
    # torchtitan's own split of 4 layers over 2 stages, embeddings and output counting 1 each.
    expected = titan_pp._generate_llm_fqn_per_model_part(2, 4, 1, 1)
    assert [s.layers for s in plan.stages] == [
        tuple(m for m in names if m.startswith("layers.")) for names in expected
    ]
    first, last = plan.stages
    assert (first.kinds, last.kinds) == (("dense",), ("dense", "dense#2"))
    assert (first.breaks_before, last.breaks_before) == (0, 1)
    assert (first.modules, first.loss) == (("tok_embeddings",), False)
    assert (last.modules, last.loss) == (("norm", "output"), True)
    assert not plan.stages_agree()
    lines = plan.stage_lines()
    assert lines[0].startswith("pipeline stages differ (2 stages)")
    assert "  stage 1 (PP rank 1, layers.2-3): dense, dense#2; breaks 1 -> 0; verified" in lines
    # dense#2's break is isolated; dense shares its recipe (the setup's is per kind, not variant).
    assert {k.kind: k.mode for k in plan.kinds} == {"dense": "children", "dense#2": "children"}


@pytest.mark.slow  # simulated scans: minutes on shared cores
def test_plan_file_keeps_the_stages_and_reads_the_previous_schema(broken_plan, tmp_path):
    from gbdoctor.plan import dump_plan, load_plan

    path = tmp_path / "plan.json"
    path.write_text(dump_plan(broken_plan))
    data = json.loads(path.read_text())
    assert data["schema_version"] == PLAN_SCHEMA_VERSION == 5
    assert [s["stage"] for s in data["stages"]] == [0, 1]
    assert load_plan(path) == broken_plan
    # A version-4 plan (before stages) still reads, without stages.
    del data["stages"]
    path.write_text(json.dumps(data | {"schema_version": 4}))
    assert load_plan(path).stages == ()


@pytest.mark.slow  # simulated scans: minutes on shared cores
def test_emitted_torchtitan_code_applies_the_plan_per_model_part(broken_plan):
    import torch

    from gbdoctor.models.custom import load_factory
    from gbdoctor.plan.emit import emit
    from gbdoctor.setup.pipeline import PipelineStage, split_stage

    code = emit(broken_plan, "torchtitan")
    assert "pipeline stages differ (2 stages)" in code
    namespace: dict = {}
    exec(compile(code, "<emitted>", "exec"), namespace)
    assert namespace["STAGES"] == {0: ("0", "1"), 1: ("2", "3")}

    class CompileConfig:
        backend = "eager"

    model = load_factory(f"{STAGED}:build", "print_in_layer_3")
    # Each model part as torchtitan's pipeline split makes it, compiled as its parallelize would.
    parts = [
        split_stage(model, PipelineStage(index=s.stage, pp_rank=s.pp_rank, modules=names))
        for s, names in zip(
            broken_plan.stages,
            (
                ("tok_embeddings", "layers.0", "layers.1"),
                ("layers.2", "layers.3", "norm", "output"),
            ),
        )
    ]
    for part in parts:
        namespace["apply_compile"](part, CompileConfig())
    plan_of = {f: k for k in broken_plan.kinds for f in k.layers}
    for part in parts:
        for key, block in part.layers.items():
            whole = isinstance(block, torch._dynamo.eval_frame.OptimizedModule)
            assert whole == (plan_of[f"layers.{key}"].mode == "block"), key
    tokens = torch.randint(0, 256, (2, 16))
    hidden = parts[0](tokens)
    assert parts[1](hidden).shape == (2, 16, 256)
    # The whole model is no stage of this plan's split: refused, not half-applied.
    with pytest.raises(ValueError, match="not a pipeline stage of this plan"):
        namespace["apply_compile"](model, CompileConfig())


def _stage(stage: int, *kinds: str, **extra) -> StagePlan:
    return StagePlan(
        stage=stage,
        pp_rank=stage % 2,
        layers=(f"layers.{stage}",),
        kinds=kinds,
        verified=True,
        **extra,
    )


def test_stages_that_agree_are_said_once():
    plan = make_plan(
        stages=(
            _stage(0, "dense", "moe", modules=("tok_embeddings",)),
            _stage(1, "moe", "dense"),
            _stage(2, "dense", "moe", modules=("norm", "output"), loss=True),
        )
    )
    assert plan.stages_agree()
    assert plan.stage_lines() == (
        "all 3 pipeline stages agree: each holds dense, moe with the same choices "
        "(stage 0 also holds tok_embeddings; stage 2 also holds norm, output, the loss)",
    )
    assert make_plan().stage_lines() == ()


def test_a_torchtitan_03_layer_plan_skips_the_layers_another_stage_holds():
    import torch.nn as nn

    from gbdoctor.frameworks.torchtitan.layer_plan import apply_layer_plan

    part = nn.Module()
    part.layers = nn.ModuleDict({"2": nn.Linear(2, 2)})  # a model part: layers.0, 1 deleted
    apply_layer_plan(part, (("0", "eager"), ("2", "nofullgraph")), (), "eager")
    assert part.layers["2"]._compiled_call_impl is not None


@pytest.mark.slow  # three simulated scans of a 400B model: ~90 s of CPU
def test_maverick_plan_names_its_stages_once_and_verifies_tp_with_full_ac(monkeypatch):
    from gbdoctor.plan import propose_plan
    from gbdoctor.spec import load_spec

    monkeypatch.chdir(FIXTURES.parent)
    steps: list[str] = []
    plan = propose_plan(
        load_spec("fixtures/torchtitan_v0.2.2/llama4_17bx128e.toml"),
        progress=lambda what, *_: steps.append(what),
    )
    # TP 8 + full AC traces on CPU with setup/ac.py's RNG stand-in (tests/setup/test_tp_ac.py),
    # so every kind verifies, by a strict re-scan of the proposed layout. The baseline is clean,
    # so that strict scan is the one round (no non-strict round first: 2 scans in all).
    assert plan.verified and plan.simulated, [k.detail for k in plan.kinds]
    assert steps == ["baseline scan (whole blocks, no flags)", "strict verification", "done"]
    assert [len(s.layers) for s in plan.stages] == [12, 13, 12, 11]
    assert plan.stages_agree() and all(set(s.kinds) == {"dense+ac", "moe+ac"} for s in plan.stages)
    assert plan.stage_lines()[0].startswith(
        "all 4 pipeline stages agree: each holds dense+ac, moe+ac with the same choices"
    )
