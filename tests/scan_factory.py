"""Hand-built scan records for the report, gate and plan tests (no torch, no capture), and the
per-kind view the parallelism tests compare (``per_kind``).

The recorded fixtures under ``fixtures/scans/`` are these records serialized with
``render_json``; ``report/test_report_json.py`` keeps them in sync (set GBDOCTOR_UPDATE_FIXTURES=1
to rewrite them, and the goldens under ``tests/report/golden/``, after an intended change).
"""

from __future__ import annotations

import os
from dataclasses import replace

from repo_paths import FIXTURES, REPO

from gbdoctor.records import (
    BlockKind,
    BlockReport,
    Break,
    Event,
    Location,
    ScanReport,
    SetupInfo,
)
from gbdoctor.summary import block_break_count

SCANS = FIXTURES / "scans"
GOLDEN = REPO / "tests" / "report" / "golden"
UPDATE = os.environ.get("GBDOCTOR_UPDATE_FIXTURES") == "1"

SPEC = "fixtures/llama4_debug_ep2.toml"
MOE_PY = "gbdoctor/models/moe.py"


def make_break(
    cause: str = "fsdp-hook",
    *,
    gb_type: str = "Skip calling `torch.compiler.disable()`d function",
    gb_id: str | None = "GB0098",
    file: str | None = MOE_PY,
    line: int = 88,
    module: str = "layers.1.moe.experts",
    in_checkpoint: bool = False,
    component: str = "fsdp",
    region: str = "layers.1",
    count: int = 1,
    context: str = "",
) -> Break:
    return Break(
        cause=cause,
        gb_type=gb_type,
        gb_id=gb_id,
        location=Location(file=file, line=line, function="forward") if file else None,
        module=module,
        in_checkpoint=in_checkpoint,
        component=component,
        region=region,
        count=count,
        context=context,
    )


def make_block(
    fqn: str,
    kind: str,
    *,
    breaks: tuple[Break, ...] = (),
    events: tuple[Event, ...] = (),
    error: str | None = None,
    graph_count: int | None = None,
    same_as: str | None = None,
) -> BlockReport:
    if graph_count is None:
        graph_count = 0 if error else 1 + sum(b.count for b in breaks)
    return BlockReport(
        fqn=fqn,
        kind=kind,
        same_as=same_as,
        graph_count=graph_count,
        op_count=40 * graph_count,
        breaks=breaks,
        events=events,
        error=error,
        regions=(fqn,),
        fullgraph_regions=(fqn,) if kind.startswith("dense") else (),
    )


def make_report(
    blocks: tuple[BlockReport, ...],
    *,
    spec: str = SPEC,
    torch_version: str = "2.13.0",
    ac_mode: str = "none",
    notes: tuple[str, ...] = (),
) -> ScanReport:
    setup = SetupInfo(
        strategy="titan-v0.2.0",
        device="cpu",
        world_size=2,
        ep_degree=2,
        dp_shard=2,
        ac_mode=ac_mode,
        ac_option="2",
        fsdp=True,
        dynamo_config=(("capture_scalar_outputs", "True"),),
        batch_size=2,
        seq_len=64,
        probed_recompiles=True,
    )
    return ScanReport(
        spec=spec,
        model="llama4/debugmodel",
        torch_version=torch_version,
        setup=setup,
        blocks=blocks,
        notes=notes,
    )


def layers(kinds: dict[str, str], per_kind: dict[str, BlockReport]) -> tuple[BlockReport, ...]:
    """One block per fqn; the first block of a kind is captured, the others share it (same_as)."""
    first: dict[str, str] = {}
    out = []
    for fqn, kind in kinds.items():
        base = per_kind[kind]
        out.append(replace(base, fqn=fqn, same_as=first.get(kind)))
        first.setdefault(kind, fqn)
    return tuple(out)


FOUR = {"layers.0": "dense", "layers.1": "moe", "layers.2": "dense", "layers.3": "moe"}


def fsdp_breaks(in_checkpoint: bool = False) -> tuple[Break, ...]:
    """FSDP2's pre- and post-forward hooks on the separately sharded moe.experts (EP 2)."""
    return (
        make_break(line=88, in_checkpoint=in_checkpoint, context="FSDPState._pre_forward"),
        make_break(line=91, in_checkpoint=in_checkpoint, context="FSDPState._post_forward"),
    )


def llama4_before() -> ScanReport:
    """MoE blocks with 2 fsdp-hook breaks each; dense blocks clean."""
    return make_report(
        layers(
            FOUR,
            {
                "dense": make_block("layers.0", "dense"),
                "moe": make_block("layers.1", "moe", breaks=fsdp_breaks()),
            },
        )
    )


def data_dependent_break() -> Break:
    return make_break(
        "data-dependent",
        gb_type="Dynamic shape operator",
        gb_id="GB0036",
        line=142,
        module="layers.1.moe.router",
        component="model",
        context="aten.bincount.default",
    )


def llama4_after_new_break() -> ScanReport:
    """``llama4_before`` plus one data-dependent break (router bincount) in every MoE block."""
    breaks = fsdp_breaks() + (data_dependent_break(),)
    return make_report(
        layers(
            FOUR,
            {
                "dense": make_block("layers.0", "dense"),
                "moe": make_block("layers.1", "moe", breaks=breaks),
            },
        )
    )


def llama4_region_eager() -> ScanReport:
    """Full AC: the FSDP hook breaks sit inside the checkpoint, so each MoE block runs eager."""
    kinds = {fqn: f"{kind}+ac" for fqn, kind in FOUR.items()}
    event = Event(
        kind="region_eager",
        module="layers.1",
        gb_type="Skip calling `torch.compiler.disable()`d function",
        location=Location(file=MOE_PY, line=88, function="forward"),
        detail="a break inside the activation-checkpoint region sent the whole region to eager",
    )
    moe = make_block(
        "layers.1", "moe+ac", breaks=fsdp_breaks(in_checkpoint=True), events=(event,), graph_count=0
    )
    return make_report(
        layers(kinds, {"dense+ac": make_block("layers.0", "dense+ac"), "moe+ac": moe}),
        ac_mode="full",
    )


SCAN_FIXTURES = {
    "llama4_before": llama4_before,
    "llama4_after_new_break": llama4_after_new_break,
    "llama4_region_eager": llama4_region_eager,
}


def per_kind(report: ScanReport) -> dict[str, tuple[int, int, frozenset[str]]]:
    """Kind label (variants folded: PP can split a structure by its neighbours' inputs) ->
    (worst breaks per block, worst graph count, causes): what a PP or CP scan must keep equal
    to the same config's scan without it."""
    out: dict[str, tuple[int, int, frozenset[str]]] = {}
    for block in report.blocks:
        label = BlockKind.parse(block.kind).label
        breaks, graphs, causes = out.get(label, (0, 0, frozenset()))
        out[label] = (
            max(breaks, block_break_count(block)),
            max(graphs, block.graph_count),
            causes | {b.cause for b in block.breaks},
        )
    return out
