"""Pipeline parallelism through the installed torchtitan's own pipeline code (issue #43):
``scan --torchtitan llama3:llama3_debugmodel`` with PP 2 and the 1F1B schedule on 2 gloo ranks.
Each rank's model part comes from torchtitan 0.3's ``pipelining_fn`` (its split, its
``parallelize_fn`` per part, its schedule), the warm-up is its trainer's
``pp_forward_backward_step``. Oracles: the same run without PP (per-kind breaks), torchtitan's
own split functions (stages), and plain per-block ``torch.compile`` with the graph-break log on
each block of the stage modules torchtitan's ``_split_module`` cuts, each stage fed the previous
stage's output. A break is planted in ``layers.4`` (stage 1) with torchtitan's own override
mechanism (``fixtures/torchtitan_overrides/planted_print.py``), so the comparisons have a break
to agree on, on the second PP rank only."""

from __future__ import annotations

import pytest
from repo_paths import FIXTURES
from scan_factory import per_kind

pytestmark = pytest.mark.extra("torchtitan")

RUN = "llama3:llama3_debugmodel"
COMMON = (
    "--compile.enable",
    "--parallelism.spmd_backend",
    "partial_dtensor",
    "--training.disable_cuda_graphs",
    "--override.imports",
    "planted_print.planted_print",
)
PLANTED = FIXTURES / "torchtitan_overrides"
"""On ``sys.path`` (the spawned ranks get this process's) for ``--override.imports``."""
PP2 = (
    "--parallelism.pipeline_parallel_degree",
    "2",
    "--parallelism.pipeline_parallel_schedule",
    "1F1B",
    # Microbatches of 2 rows: the blocks see the PP = 1 scan's capture shape (2 x 64).
    "--parallelism.pipeline_parallel_microbatch_size",
    "2",
)


@pytest.fixture(scope="module")
def scans():
    from gbdoctor.frameworks.registry import spec_for_run
    from gbdoctor.scan import scan

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(PLANTED))
        patch.chdir(FIXTURES.parent)  # break locations relative to the repository
        pp2_spec = spec_for_run("--torchtitan", RUN, COMMON + PP2)
        pp2 = scan(pp2_spec, recompiles=False)
        pp1 = scan(spec_for_run("--torchtitan", RUN, COMMON), recompiles=False)
        yield pp2_spec, pp2, pp1


def _breaks(report) -> dict[str, tuple[int, tuple[tuple[str, str], ...]]]:
    """Block -> (graphs, (cause, location) of each break)."""
    return {
        b.fqn: (b.graph_count, tuple((x.cause, str(x.location)) for x in b.breaks))
        for b in report.blocks
    }


@pytest.mark.slow  # two scans, one on 2 ranks (~100 s at load 6)
def test_pp2_through_torchtitans_pipeline_code_matches_pp1per_kind(scans):
    titan_pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")
    spec, pp2, pp1 = scans
    assert spec.parallelism.pipeline_parallel_schedule == "1F1B"  # read from its config
    setup = pp2.setup
    assert not setup.simulated and setup.world_size == 2
    assert (setup.pp_degree, setup.pp_schedule, setup.pp_stages, setup.pp_microbatches) == (
        2,
        "1F1B",
        2,
        4,  # local_batch_size 8 / microbatches of 2, torchtitan's own count
    )
    assert pp1.setup.pp_degree == 1 and all(b.stage is None for b in pp1.blocks)
    assert setup.batch_size == pp1.setup.batch_size == 2
    assert all(b.error is None for b in pp2.blocks)
    assert per_kind(pp2) == per_kind(pp1)
    assert _breaks(pp2) == _breaks(pp1)  # block by block, the planted break included
    planted = ("python-side-effect", "fixtures/torchtitan_overrides/planted_print.py:22")
    assert {fqn: b for fqn, (_, b) in _breaks(pp2).items() if b} == {"layers.4": (planted,)}

    # Stages as torchtitan's own split lays them out: rank 0 stage 0, rank 1 stage 1.
    names = titan_pp._generate_llm_fqn_per_model_part(2, 6, 1, 1)
    stage_of = {m: i for i, part in enumerate(names) for m in part}
    assert {b.fqn: b.stage for b in pp2.blocks} == {
        f"layers.{i}": stage_of[f"layers.{i}"] for i in range(6)
    }
    for pp_rank in (0, 1):
        assert titan_pp._get_pp_rank_to_stage_indices_mapping(pp_rank, 2, "1F1B", 2) == (pp_rank,)
    # Each rank captured its own stage: one representative per kind and rank (layers.4 is a
    # kind of its own: its feed-forward is the planted class), the rest proven on them.
    assert [b.fqn for b in pp2.blocks if b.same_as is None] == ["layers.0", "layers.3", "layers.4"]

    # The PP-only findings: what ran of torchtitan's pipeline code, and what did not.
    (note,) = [n for n in pp2.notes if n.startswith("pipeline: ")]
    assert "own pipelining_fn split the model into 2 stages (rank 0: stage 0; rank 1: stage 1)" in (
        note
    )
    assert "1F1B schedule's step (4 microbatch(es) per step" in note
    assert "the recompile probe and a second schedule run are not run" in note
    assert "_step_microbatches" in note  # torch 2.13 has no step(arg_mbs=...)
    assert not pp2.divergence and not any(
        e.kind == "pipeline_crash" for b in pp2.blocks for e in b.events
    )


@pytest.mark.slow  # a torchtitan model built, split and compiled per block (~20 s at load 6)
def test_plain_compile_of_each_stage_modules_blocks_agrees(scans, monkeypatch):
    """Oracle: the model as torchtitan builds it, cut by torchtitan's own ``_split_module``
    into the two stage modules, stage 0 fed tokens and stage 1 stage 0's hidden states; each
    block of each stage compiled alone with plain ``torch.compile`` and the graph-break log on,
    compared statement by statement with the scan's records."""
    import torch
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _split_module,
    )

    from gbdoctor.capture.block import collect_block_inputs
    from gbdoctor.frameworks.torchtitan.config import load_config, model_on_meta
    from gbdoctor.frameworks.torchtitan.cpu import cpu_stand_ins
    from gbdoctor.models import block_container, vocab_size
    from gbdoctor.scan.oracle import compare, plain_compile_statements, training_flags

    spec, pp2, _ = scans
    monkeypatch.syspath_prepend(str(PLANTED))
    monkeypatch.chdir(FIXTURES.parent)
    config = load_config(spec.registry_run)
    flags = training_flags(pp2)
    by_fqn = {b.fqn: b for b in pp2.blocks}
    found = []
    with cpu_stand_ins("cpu"):
        torch.manual_seed(0)
        model = model_on_meta(config)  # torchtitan's own build, as the scan's ranks build it
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        model.train()
        tokens = torch.randint(0, 256, (2, 64))
        positions = torch.arange(64).repeat(2, 1)
        masks = model.get_attention_masks(positions=positions)
        hidden = tokens
        for names in _generate_llm_fqn_per_model_part(2, 6, 1, 1):
            chunk = _split_module(model, names)
            blocks = dict(block_container(chunk))
            assert set(blocks) == {n for n in names if n.startswith("layers.")}
            store, remove = collect_block_inputs(chunk, blocks)
            try:
                hidden = chunk(hidden, positions=positions, attention_masks=masks)
            finally:
                remove()
            for fqn, block in blocks.items():
                statements = plain_compile_statements(block, store[fqn], None, flags)
                unexpected = [d for d in compare(statements, by_fqn[fqn]) if not d.expected]
                found.append((fqn, len(statements), unexpected))
    assert hidden.shape == (2, 64, vocab_size(model))  # stage 1 ends in the LM head: logits
    assert [fqn for fqn, _, _ in found] == [f"layers.{i}" for i in range(6)]
    assert all(not unexpected for _, _, unexpected in found), found
    # Plain torch.compile logs one statement, the planted print, in stage 1's layers.4 only.
    assert {fqn: n for fqn, n, _ in found if n} == {"layers.4": 1}


@pytest.mark.slow  # a CLI run that loads torchtitan's config (~6 s)
def test_simulating_its_pipeline_code_is_a_one_line_refusal():
    from typer.testing import CliRunner

    from gbdoctor.cli import app

    args = ["scan", "--simulate", "--torchtitan", RUN, *COMMON[:-2], *PP2]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and not result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith(("Error", "Hint"))]
    assert "cannot run torchtitan's own pipeline code" in lines[0]
    assert "drop --simulate" in lines[1] and "Traceback" not in result.stderr
