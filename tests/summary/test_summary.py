"""Derived counts: every block counts its own copy; per-kind rows are per block."""

from __future__ import annotations

from dataclasses import replace

import pytest
from repo_paths import FIXTURES

from gbdoctor.frameworks.registry import cause_taxonomy
from gbdoctor.records import Event
from gbdoctor.report.json import load_scan_json
from gbdoctor.summary import compact_layers, fix_hint, has_findings, summarize

SCANS = FIXTURES / "scans"


def scan(name: str):
    return load_scan_json(SCANS / f"{name}.json")


def test_totals_count_every_layer_copy() -> None:
    s = summarize(scan("llama4_after_new_break"))
    assert (s.blocks, s.breaks, s.events, s.errors, s.graphs) == (4, 6, 0, 0, 10)
    assert s.by_cause == (("data-dependent", 2), ("fsdp-hook", 4))
    assert s.events_by_kind == ()
    assert not s.clean


def test_kind_rows_are_per_block() -> None:
    s = summarize(scan("llama4_after_new_break"))
    dense, moe = s.kinds
    assert (dense.kind, dense.layers, dense.layers_label, dense.graphs, dense.breaks) == (
        "dense",
        ("layers.0", "layers.2"),
        "layers.0, 2",
        1,
        0,
    )
    assert dense.clean and dense.causes == () and dense.break_records == ()
    assert (moe.kind, moe.layers_label, moe.graphs, moe.breaks, moe.events) == (
        "moe",
        "layers.1, 3",
        4,
        3,
        0,
    )
    assert moe.causes == ("data-dependent", "fsdp-hook")
    assert len(moe.break_records) == 3  # the shared capture's breaks appear once


def test_events_and_errors() -> None:
    report = scan("llama4_region_eager")
    s = summarize(report)
    assert s.events_by_kind == (("region_eager", 2),) and s.events == 2
    assert [row.events for row in s.kinds] == [0, 1]
    broken = replace(
        report, blocks=(replace(report.blocks[0], error="RuntimeError: x"),) + report.blocks[1:]
    )
    s = summarize(broken)
    assert s.errors == 1
    assert (
        s.kinds[0].errors == 1
        and s.kinds[0].error == "RuntimeError: x"
        and "error" in s.kinds[0].causes
    )


def test_break_count_field_is_honoured() -> None:
    report = scan("llama4_before")
    moe = report.blocks[1]
    bumped = replace(moe, breaks=(replace(moe.breaks[0], count=3), moe.breaks[1]))
    s = summarize(replace(report, blocks=(report.blocks[0], bumped)))
    assert s.breaks == 4 and s.kinds[1].breaks == 4


def test_has_findings() -> None:
    assert has_findings(scan("llama4_before"))
    report = scan("llama4_before")
    clean = replace(report, blocks=tuple(replace(b, breaks=()) for b in report.blocks))
    assert not has_findings(clean) and summarize(clean).clean
    with_event = replace(
        clean, blocks=(replace(clean.blocks[0], events=(Event(kind="frame_skipped", module="x"),)),)
    )
    assert has_findings(with_event)
    assert has_findings(replace(clean, blocks=(replace(clean.blocks[0], error="boom"),)))


@pytest.mark.parametrize(
    ("fqns", "label"),
    [
        (("layers.1", "layers.3", "layers.5"), "layers.1, 3, 5"),
        (("layers.0",), "layers.0"),
        (("model.layers.0", "model.layers.1", "other.0"), "model.layers.0, 1, other.0"),
        (("blk",), "blk"),
        ((), ""),
    ],
)
def test_compact_layers(fqns: tuple[str, ...], label: str) -> None:
    assert compact_layers(fqns) == label


def test_fix_hint() -> None:
    assert fix_hint("fsdp-hook") == cause_taxonomy().causes["fsdp-hook"].fixes[0]
    assert fix_hint("no-such-cause") == ""


def test_readiness_rows_merge_findings_that_differ_only_in_node_and_input() -> None:
    """A real scan (the llama4 golden: FSDP2 releases each dense block's 9 parameters, the MoE
    block has 15 inputs of data-dependent size): findings that differ only in the graph node
    and the input their detail names share a row that names every input once; none is lost."""
    from gbdoctor.records import BlockerEffect, BlockerKind
    from gbdoctor.summary import group_by_kind

    report = load_scan_json(FIXTURES / "golden" / "scan" / "llama4_debug.json")
    captured = {b.kind: b for b in report.blocks if b.same_as is None and b.cudagraphs}
    for row in summarize(report).kinds:
        findings = [
            f for f in captured[row.kind].cudagraphs.findings if f.effect != BlockerEffect.COPY
        ]
        assert sorted(n for g in row.cudagraph_notable for n in g.nodes) == sorted(
            f.node for f in findings
        )
        keys = [
            (g.finding.kind, g.finding.effect, g.finding.region, g.finding.graph, g.reason)
            for g in row.cudagraph_notable
        ]
        assert len(keys) == len(set(keys)), keys
        released = [
            g for g in row.cudagraph_notable if g.finding.kind == BlockerKind.RELEASED_STATIC_INPUT
        ]
        assert released, row.kind  # every kind is under FSDP2
        # one row per graph, naming each released parameter once and counting them
        for group in released:
            assert len(group.nodes) == len(group.subjects) > 1
            numbers = [int(node.rsplit("_", 1)[1]) for node in group.nodes]  # primals_N
            assert numbers == sorted(numbers), group.nodes
            assert group.detail.startswith(group.subjects[0] + ", ")
            assert f"({len(group.subjects)}): a parameter whose memory" in group.detail
    assert set(group_by_kind(report)) == set(captured)
