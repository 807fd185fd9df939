"""Pipeline stages as torchtitan lays them out, checked against the installed torchtitan's own
splitting code (``torchtitan.distributed.pipeline_parallel``) as the oracle; the scan's
per-stage records on the unmodified llama4 17bx128e config (PP 4) come from the same layout."""

from __future__ import annotations

import pytest

from gbdoctor.errors import SpecError
from gbdoctor.records import ParallelSpec
from gbdoctor.setup.apply import ac_counter_index
from gbdoctor.setup.pipeline import (
    modules_per_stage,
    pipeline_layout,
    stage_ranks,
    virtual_stage_count,
)

titan_pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")

SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "ZBVZeroBubble", "DualPipeV")


def _titan_names(stages: int, layers: int, first: int, last: int) -> list[list[str]]:
    # torchtitan 0.3 names the output projection lm_head; v0.2.2 (mirrored here) output.
    names = titan_pp._generate_llm_fqn_per_model_part(stages, layers, first, last)
    return [["output" if m == "lm_head" else m for m in stage] for stage in names]


@pytest.mark.parametrize("layers", [2, 5, 6, 16, 27, 48, 61])
@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("weights", [(1, 1), (0, 0), (2, 1), (1, 3)])
def test_modules_per_stage_match_torchtitan(layers, stages, weights):
    first, last = weights
    try:
        expected = _titan_names(stages, layers, first, last)
    except ValueError:
        with pytest.raises(SpecError):
            modules_per_stage(stages, layers, first, last)
        return
    assert modules_per_stage(stages, layers, first, last) == expected


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("pp", [2, 4])
def test_stage_ranks_match_torchtitan(schedule, pp):
    num_stages = pp * (1 if schedule in ("1F1B", "GPipe") else 2)
    owners = stage_ranks(pp, schedule, num_stages)
    for rank in range(pp):
        theirs = titan_pp._get_pp_rank_to_stage_indices_mapping(rank, pp, schedule, num_stages)
        assert tuple(i for i, r in enumerate(owners) if r == rank) == tuple(sorted(theirs))


class _Dims:
    def __init__(self, pp: int) -> None:
        self.pp = pp


class _Model:
    def __init__(self, layers: int) -> None:
        self.layers = [None] * layers


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("per_stage", [None, 1, 2, 3, 4, 6])
def test_virtual_stage_count_matches_torchtitan(schedule, per_stage):
    p = ParallelSpec(
        pipeline_parallel_degree=2,
        pipeline_parallel_schedule=schedule,
        pipeline_parallel_layers_per_stage=per_stage,
    )
    from torchtitan.config import ParallelismConfig

    config = ParallelismConfig(
        pipeline_parallel_degree=2,
        pipeline_parallel_schedule=schedule,
        pipeline_parallel_layers_per_stage=per_stage,
    )
    try:
        expected = titan_pp._get_pipeline_metadata(_Dims(2), config, _Model(10))[0]
    except ValueError:
        with pytest.raises(SpecError):
            virtual_stage_count(p, 10)
        return
    assert virtual_stage_count(p, 10) == expected


def test_llama4_maverick_layout_and_microbatches():
    # 48 layers + embeddings + norm/output = 50 effective over 4 stages: 13, 13, 12, 12, the
    # first and last giving one layer's place to their extra modules.
    p = ParallelSpec(pipeline_parallel_degree=4)
    layout = pipeline_layout(p, 48, local_batch_size=8)
    assert [len(s.layers) for s in layout.stages] == [12, 13, 12, 11]
    assert layout.stages[0].modules[0] == "tok_embeddings"
    assert layout.stages[-1].modules[-2:] == ("norm", "output")
    assert [s.pp_rank for s in layout.stages] == [0, 1, 2, 3]
    assert layout.microbatches == 8
    interleaved = pipeline_layout(
        ParallelSpec(
            pipeline_parallel_degree=4,
            pipeline_parallel_schedule="Interleaved1F1B",
            pipeline_parallel_microbatch_size=2,
        ),
        48,
        local_batch_size=8,
    )
    assert len(interleaved.stages) == 8 and interleaved.microbatches == 4
    assert [s.index for s in interleaved.stages_of_rank(1)] == [1, 5]
    assert sum(len(s.layers) for s in interleaved.stages) == 48


def test_layer_selective_ac_counts_each_ranks_own_blocks():
    # torchtitan v0.2.2 counts wrapped layers per parallelize call; under PP each rank calls it
    # on its own stages, so the count restarts on every rank and runs on across its stages.
    layout = pipeline_layout(
        ParallelSpec(pipeline_parallel_degree=2, pipeline_parallel_schedule="Interleaved1F1B"),
        6,
        local_batch_size=1,
    )
    # 8 effective layers over 4 stages: stage 0 [0], 1 [1, 2], 2 [3, 4], 3 [5]; rank 0 holds
    # stages 0 and 2, rank 1 stages 1 and 3.
    assert [s.layers for s in layout.stages] == [(0,), (1, 2), (3, 4), (5,)]
    assert ac_counter_index(layout, 6) == [0, 0, 1, 1, 2, 2]
    assert ac_counter_index(None, 6) == [0, 1, 2, 3, 4, 5]


def test_split_stage_cuts_the_model_as_torchtitan_does():
    import torch

    from gbdoctor.models import build_model
    from gbdoctor.records import ModelSpec
    from gbdoctor.setup.pipeline import split_stage

    with torch.device("meta"):
        model = build_model(ModelSpec(name="llama3", flavor="debugmodel"), device="meta")
    layout = pipeline_layout(
        ParallelSpec(pipeline_parallel_degree=2, pipeline_parallel_schedule="Interleaved1F1B"),
        len(model.layers),
        local_batch_size=1,
    )
    for stage in layout.stages:
        ours = split_stage(model, stage)
        theirs = titan_pp._split_module(model, list(stage.modules))
        assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
        assert {n for n, _ in ours.named_parameters()} <= {n for n, _ in model.named_parameters()}
    assert ours.tok_embeddings is None and ours.output is not None  # the last stage
