"""Layout of ``gbdoctor inspect``: a rich tree per block, or stable JSON (its renderers; the
registry is :mod:`gbdoctor.report.formats`)."""

from __future__ import annotations

from gbdoctor.records import SetupReport
from gbdoctor.records.io import dumps
from gbdoctor.report.formats import RenderOptions


def inspect_json(report: SetupReport, options: RenderOptions) -> str:
    return dumps(report)


def inspect_table(report: SetupReport, options: RenderOptions) -> str:
    from rich.table import Table
    from rich.tree import Tree

    from gbdoctor.report.table import plain_text, recording_console

    console = recording_console()
    s = report.setup
    console.print(f"[bold]{report.spec}[/] model={report.model} torch={report.torch_version}")
    console.print(
        f"strategy={s.strategy} device={s.device}{' (simulated)' if s.simulated else ''} "
        f"world_size={s.world_size} ep={s.ep_degree} dp_replicate={s.dp_replicate} "
        f"dp_shard={s.dp_shard} ac={s.ac_mode}/{s.ac_option} fsdp={s.fsdp}"
    )
    for note in report.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    if s.dynamo_config:
        console.print("dynamo: " + ", ".join(f"{k}={v}" for k, v in s.dynamo_config))
    table = Table(title="blocks")
    for col in ("block", "kind", "params", "AC-wrapped", "compiled (fullgraph*)", "FSDP-sharded"):
        table.add_column(col)
    for b in report.blocks:
        compiled = ", ".join(r + ("*" if r in b.fullgraph else "") for r in b.compiled) or "-"
        table.add_row(
            b.fqn,
            b.kind,
            f"{b.params:,}",
            ", ".join(b.ac_wrapped) or "-",
            compiled,
            ", ".join(b.sharded) or "-",
        )
    console.print(table)
    tree = Tree("hooks (module: kind <- installer)")
    for b in report.blocks:
        if b.hooks:
            node = tree.add(b.fqn)
            for h in b.hooks:
                node.add(f"{h.module or '<root>'}: {h.kind} <- {h.installer} ({h.name})")
    if report.other_hooks:
        node = tree.add("outside blocks")
        for h in report.other_hooks:
            node.add(f"{h.module or '<root>'}: {h.kind} <- {h.installer} ({h.name})")
    console.print(tree)
    if report.other_sharded:
        console.print("FSDP-sharded outside blocks: " + ", ".join(report.other_sharded))
    return plain_text(console)
