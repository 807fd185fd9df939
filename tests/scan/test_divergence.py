"""Rank divergence: ranks that compile a block differently never hang a scan, and the report
says where, why, whether it can hang training, and how to fix it (``scan.divergence``).

The 2-rank scans are checked against the oracle: plain ``torch.compile`` of each layer on each
rank of a real 2-rank gloo group, with Dynamo's graph-break log."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from repo_paths import FIXTURES

from gbdoctor.gate import baseline_from_reports, check_gate
from gbdoctor.records import (
    SCHEMA_VERSION,
    Break,
    CollectiveHazard,
    DedupeProof,
    DivergenceCause,
    EventKind,
    Location,
    ScanReport,
)
from gbdoctor.report.divergence import divergence_lines
from gbdoctor.report.json import load_scan_json, render_json
from gbdoctor.scan.divergence import rank_divergences

PRINT_AT = Location(file="fixtures/models/rank_divergent.py", line=91, function="planted")
ITEM_AT = Location(file="fixtures/models/rank_divergent.py", line=101, function="planted")


def _scan() -> ScanReport:
    return load_scan_json(FIXTURES / "scans" / "llama4_before.json")


def _brk(cause: str, gb_type: str, at: Location) -> Break:
    return Break(
        cause=cause, gb_type=gb_type, gb_id=None, location=at, module="", in_checkpoint=False
    )


def _ranks(report: ScanReport, extra_on_rank0: tuple[Break, ...], kind: str = "dense"):
    """Two ranks' blocks: rank 1 the report's, rank 0 with ``extra_on_rank0`` in every block of
    ``kind``."""
    rank1 = report.blocks
    rank0 = tuple(
        replace(b, breaks=b.breaks + extra_on_rank0) if b.kind == kind else b for b in rank1
    )
    return [rank0, rank1]


def test_a_break_on_one_rank_only_is_rank_conditional_and_folds_over_layers() -> None:
    report = _scan()
    printed = _brk("python-side-effect", "Failed to trace builtin operator", PRINT_AT)
    [found] = rank_divergences(_ranks(report, (printed,)), report.setup)
    dense = [b for b in report.blocks if b.kind == "dense"]
    assert found.ranks == (0,) and found.without == (1,)
    assert found.block == dense[0].fqn and found.layers == len(dense)
    assert found.cause == DivergenceCause.RANK_CONDITIONAL
    # llama4 debug under EP 2: its dense blocks' collectives are FSDP's, in hooks.
    assert found.hazard == CollectiveHazard.CANNOT_DESYNC
    assert "reorderable_logging_functions" in found.fix
    # Under tensor parallel the blocks' graphs hold collectives: the same break can hang.
    tp = replace(report.setup, tp_degree=2)
    [under_tp] = rank_divergences(_ranks(report, (printed,)), tp)
    assert under_tp.hazard == CollectiveHazard.CAN_DESYNC
    assert "enable_compiler_collectives" in under_tp.fix


def test_a_break_after_a_shared_data_dependent_break_is_per_rank_data() -> None:
    report = _scan()
    item = _brk("data-dependent", "Data dependent operator", ITEM_AT)
    shared = tuple(
        replace(b, breaks=b.breaks + (item,)) if b.kind == "dense" else b for b in report.blocks
    )
    tolist = _brk("data-dependent", "Unsupported Tensor.tolist() call", PRINT_AT)
    rank0 = tuple(
        replace(b, breaks=b.breaks + (tolist,)) if b.kind == "dense" else b for b in shared
    )
    [found] = rank_divergences([rank0, shared], report.setup)
    assert found.cause == DivergenceCause.PER_RANK_DATA and found.gb_type.endswith("tolist() call")


def test_ranks_that_agree_have_no_divergence_section() -> None:
    report = _scan()
    assert rank_divergences([report.blocks, report.blocks], report.setup) == ()
    assert divergence_lines(report) == []


def test_divergence_round_trips_through_json_and_old_scans_read_without_it(tmp_path) -> None:
    report = _scan()
    printed = _brk("python-side-effect", "Failed to trace builtin operator", PRINT_AT)
    diverging = replace(
        report, divergence=rank_divergences(_ranks(report, (printed,)), report.setup)
    )
    text = render_json(diverging)
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION == 9
    assert load_scan_json(text) == diverging
    # A schema-7 document (kept as it was written) reads as no divergence recorded.
    old = FIXTURES / "scans" / "llama4_before_schema7.json"
    assert json.loads(old.read_text())["schema_version"] == 7
    assert load_scan_json(old).divergence == ()
    [title, line] = divergence_lines(diverging)
    assert title.startswith("Rank divergence") and "rank 0 (not rank 1)" in line
    assert "rank_divergent.py:91" in line and "cannot desynchronize" in line


def test_gate_fails_on_new_divergence_and_passes_once_accepted() -> None:
    report = _scan()
    printed = _brk("python-side-effect", "Failed to trace builtin operator", PRINT_AT)
    diverging = replace(
        report, divergence=rank_divergences(_ranks(report, (printed,)), report.setup)
    )
    result = check_gate([diverging], baseline_from_reports([report]))
    [failure] = result.failures
    assert failure.what == f"new event {EventKind.DIVERGENCE}" and failure.kind == "dense"
    assert failure.locations == (PRINT_AT,)
    assert check_gate([diverging], baseline_from_reports([diverging])).passed
    # Fixed: the divergence going away is an improvement, not a failure.
    assert check_gate([report], baseline_from_reports([diverging])).passed


# ------------------------------------------------------------------ 2 ranks, against the oracle


def oracle_rank(spec) -> dict[str, set[tuple[str, int]]]:
    """On one rank of a real process group: each layer of ``spec``'s bare model compiled alone
    with plain ``torch.compile``, on this rank's data; the statements its graph-break log names.
    (A ``run_ranks`` target: module level.)"""
    import torch.distributed as dist

    from gbdoctor.capture import collect_block_inputs
    from gbdoctor.models import block_container, build_model, vocab_size
    from gbdoctor.scan.oracle import plain_compile_statements
    from gbdoctor.setup.train import synthetic_batch

    torch.manual_seed(spec.training.seed)
    model = build_model(spec.model, max_seq_len=spec.training.seq_len)
    blocks = dict(block_container(model))
    tokens, _ = synthetic_batch(
        seed=spec.training.seed,
        step=0,
        vocab=vocab_size(model),
        local_batch=spec.capture_batch_size,
        seq_len=spec.capture_seq_len,
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        device="cpu",
    )
    store, remove = collect_block_inputs(model, blocks)
    try:
        model(tokens)
    finally:
        remove()
    return {
        fqn: {
            (s.file, s.line) for s in plain_compile_statements(block, store[fqn], spec.root or None)
        }
        for fqn, block in blocks.items()
    }


def rank_statements(report: ScanReport, rank: int) -> set[tuple[str, int]]:
    """The statements ``rank`` broke at, from the merged report: rank 0's breaks, less the
    divergences ``rank`` does not meet, plus those it meets."""
    found = {
        (b.location.file, b.location.line)
        for block in report.blocks
        for b in block.breaks
        if b.location
    }
    for d in report.divergence:
        assert d.location is not None
        key = (d.location.file, d.location.line)
        if rank in d.without:
            found.discard(key)
        if rank in d.ranks:
            found.add(key)
    return found


@pytest.mark.parametrize(
    ("flavor", "diverges_per_layer"),
    [
        ("rank0_print_layer", True),
        ("rank0_item", False),
        ("odd_tolist", False),
        ("data_branch", False),
    ],
)
def test_a_rank_divergent_model_scans_on_two_ranks_as_plain_compile_sees_each_rank(
    custom_spec, flavor, diverges_per_layer
) -> None:
    from gbdoctor.scan import scan
    from gbdoctor.setup.dist import run_ranks
    from gbdoctor.spec import load_spec

    spec = load_spec(
        custom_spec(
            "rank_divergent.py",
            flavor,
            extra="timeout_s = 300\n[parallelism]\ndata_parallel_shard_degree = 2\n",
        )
    )
    report = scan(spec)  # before the fix: both ranks waited in FSDP collectives until the deadline
    oracle = run_ranks(oracle_rank, spec, world_size=2, device_type="cpu", timeout_s=300)
    per_rank = [set().union(*by_layer.values()) for by_layer in oracle]
    for rank in (0, 1):
        assert rank_statements(report, rank) == per_rank[rank], rank
    # A divergence exactly where plain compile breaks on one rank and not the other.
    differing = per_rank[0] ^ per_rank[1]
    assert {
        (d.location.file, d.location.line) for d in report.divergence if d.location
    } == differing
    if flavor != "data_branch":
        assert differing, "the fixture's flavor diverges by construction"
    for d in report.divergence:
        # Data parallel over FSDP: the collectives are in FSDP's hooks, outside the graphs.
        assert d.hazard == CollectiveHazard.CANNOT_DESYNC
        assert d.layers == 3  # every layer diverges alike, whatever its guards
        assert d.cause == (
            DivergenceCause.PER_RANK_DATA
            if flavor == "data_branch"
            else DivergenceCause.RANK_CONDITIONAL
        )
    if diverges_per_layer:
        # Rank 0's guards differ per layer (the layer index): no later layer ran on layer 0's
        # compiled code unchanged, each was re-traced or captured itself.
        later = report.blocks[1:]
        assert all(b.dedupe != DedupeProof.GUARDS_PASS for b in later), [
            (b.fqn, b.dedupe, b.dedupe_detail) for b in report.blocks
        ]


def test_a_divergence_where_the_ranks_inputs_differ_in_shape_is_per_rank_shape() -> None:
    report = _scan()
    item = _brk("data-dependent", "Data dependent operator", ITEM_AT)
    blocks = len(report.blocks)
    shapes = [["(2, 16, 64)"] * blocks, ["(2, 12, 64)"] * blocks]
    [found] = rank_divergences(_ranks(report, (item,)), report.setup, input_shapes=shapes)
    assert found.cause == DivergenceCause.PER_RANK_SHAPE and "same shapes" in found.fix
    # The same shapes on both ranks: the class follows from the breaks again.
    same = [shapes[0], shapes[0]]
    [again] = rank_divergences(_ranks(report, (item,)), report.setup, input_shapes=same)
    assert again.cause == DivergenceCause.RANK_CONDITIONAL
