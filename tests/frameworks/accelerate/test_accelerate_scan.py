"""Accelerate scans on 2 gloo ranks, three Hugging Face families x the three configs of issue 42,
each checked per block against the oracle (``oracle.py``: the same model prepared by
accelerate's own functions, one block compiled at a time, the graph-break log); and a
TrainingArguments file against the equivalent Accelerate config."""

from __future__ import annotations

import os

import pytest
from oracle import Case, oracle
from repo_paths import FIXTURES

from gbdoctor.frameworks.registry import spec_for_run
from gbdoctor.scan import scan

pytestmark = pytest.mark.extra("accelerate")

ACCELERATE = FIXTURES / "accelerate"
CASES = {
    "fsdp2_regional_ac": Case("fsdp2_regional_ac.yaml", ac=True, regional=True),
    "fsdp2_whole_ac": Case("fsdp2_whole_ac.yaml", ac=True, regional=False),
    "fsdp2_regional_noac": Case("fsdp2_regional_noac.yaml", ac=False, regional=True),
}
MODELS = ("llama", "qwen3_moe", "qwen2")
DEFAULT = ("llama", "fsdp2_regional_ac")
"""The case in the default set; the other eight are marked slow."""


def _scan(config: str, model: str):
    spec = spec_for_run(
        "--accelerate", str(ACCELERATE / config), ("--model", str(ACCELERATE / "models" / model))
    )
    return scan(spec, recompiles=False, dedupe=False)


def _scanned(block) -> set[tuple[str, str, int]]:
    """The block's breaks as the oracle names them (``oracle.oracle``): a break in FSDP2's code
    by its component (the scan locates it at the user frame that called into FSDP2), any other
    by the statement it is at (file base name, line)."""
    out = set()
    for brk in block.breaks:
        if brk.component == "fsdp":
            out.add((brk.gb_type, "fsdp", 0))
        elif brk.location is not None:
            out.add((brk.gb_type, os.path.basename(brk.location.file), brk.location.line))
    return out


PARAMS = [
    pytest.param(m, c, marks=() if (m, c) == DEFAULT else pytest.mark.slow, id=f"{m}-{c}")
    for m in MODELS
    for c in CASES
]


@pytest.mark.parametrize("model, config", PARAMS)
def test_scan_matches_accelerates_own_setup_compiled_per_block(model, config):
    case = CASES[config]
    report = _scan(case.config, model)
    blocks = report.blocks
    assert [b.fqn for b in blocks] == ["model.layers.0", "model.layers.1"]
    assert all(b.error is None for b in blocks), [b.error for b in blocks]
    # The setup accelerate made: AC-wrapped layers exactly when the config asks for it, MoE
    # layers for Qwen3-MoE (read from the model's own config), FSDP2 on 2 ranks.
    assert all(("+ac" in str(b.kind)) == case.ac for b in blocks), [b.kind for b in blocks]
    assert all(str(b.kind).startswith("moe") == (model == "qwen3_moe") for b in blocks)
    assert report.setup.fsdp and report.setup.world_size == 2
    assert any("accelerate 1.15" in n for n in report.notes)

    expected = oracle(case, str(ACCELERATE / "models" / model), [b.fqn for b in blocks])
    for block in blocks:
        theirs = expected[block.fqn]
        logged = {(t, w, 0 if w == "fsdp" else n) for t, w, n in theirs.statements}
        assert _scanned(block) == logged, f"{block.fqn}: scan {_scanned(block)}, log {logged}"
        # Located in the model or in FSDP2's hook, never in the scan's own call of the block
        # (the innermost non-library frame when the hook runs inside the compiled AC region).
        for brk in block.breaks:
            assert brk.location is not None, brk
            assert not brk.location.file.startswith("gbdoctor/"), brk.location
            if brk.component == "fsdp":
                assert "distributed/fsdp/" in brk.location.file, brk.location
        # Regions: compiled to no graph at all exactly when the oracle's block compiled none.
        assert (block.graph_count == 0) == (theirs.graphs == 0), (block.graph_count, theirs.graphs)


def _records(report) -> list[tuple]:
    return [
        (
            b.fqn,
            str(b.kind),
            b.graph_count,
            sorted((x.gb_type, x.component, x.count) for x in b.breaks),
        )
        for b in report.blocks
    ]


@pytest.mark.slow
def test_trainingarguments_give_the_same_scan_as_the_accelerate_config():
    """The Trainer's fsdp/fsdp_config/torch_compile fields (trainer_whole_ac.json) and the
    equivalent `accelerate config` YAML (fsdp2_whole_ac.yaml): the same setup, the same scan."""
    trainer = _scan("trainer_whole_ac.json", "qwen2")
    config = _scan("fsdp2_whole_ac.yaml", "qwen2")
    assert _records(trainer) == _records(config)
    assert trainer.setup == config.setup
    assert any(b.breaks for b in trainer.blocks)  # a scan with something in it to compare


@pytest.mark.slow
def test_plan_fixes_the_checkpointed_fsdp_hook_and_the_emitted_config_rescans_clean(tmp_path):
    """llama + regional compile + AC: every layer eager (an FSDP2 hook break in the AC region).
    The plan's fix, re-scanned strictly through accelerate's own preparation, is clean; its
    emitted overlay merged into the user's YAML is read by accelerate's own config loader and
    by gbdoctor's strict reader, and that config scans clean too."""
    import yaml
    from accelerate.commands.config.config_args import load_config_from_file

    from gbdoctor.frameworks.accelerate.plan import emit_accelerate
    from gbdoctor.plan import propose_plan

    config = ACCELERATE / "fsdp2_regional_ac.yaml"
    spec = spec_for_run(
        "--accelerate", str(config), ("--model", str(ACCELERATE / "models" / "llama"))
    )
    plan = propose_plan(spec)
    assert plan.framework == "accelerate" and plan.verified and plan.rounds == 2
    (kind,) = plan.kinds
    assert (kind.breaks_before, kind.breaks_after) == (2, 0)
    assert "fsdp_activation_checkpointing: false" in kind.reasons[0]

    overlay = yaml.safe_load(emit_accelerate(plan))
    merged = yaml.safe_load(config.read_text())
    for section, values in overlay.items():
        merged[section].update(values)
    path = tmp_path / "patched.yaml"
    path.write_text(yaml.safe_dump(merged))
    assert load_config_from_file(str(path)).fsdp_config["fsdp_activation_checkpointing"] is False
    rescanned = scan(
        spec_for_run("--accelerate", str(path), ("--model", str(ACCELERATE / "models" / "llama"))),
        strict=True,
        recompiles=False,
    )
    assert all(not b.breaks and not b.events and b.graph_count == 1 for b in rescanned.blocks)
