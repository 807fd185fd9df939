"""Layout of ``gbdoctor plan``: one row per block kind, then reasons and flag costs."""

from __future__ import annotations

from gbdoctor.records import Plan


def render_plan_table(plan: Plan) -> str:
    from rich.table import Table

    from gbdoctor.report.table import plain_text, recording_console

    console = recording_console()
    status = "verified" if plan.verified else "NOT fully verified"
    console.print(
        f"[bold]gbdoctor plan[/] {plan.spec} ({plan.model}), torch {plan.torch_version}: {status} "
        f"after {plan.rounds} round(s)"
        + (" of simulated scans" if plan.simulated else "")
        + f"; baseline = {plan.baseline_strategy}"
    )
    for note in plan.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    table = Table()
    for col in (
        "kind",
        "layers",
        "compile",
        "eager",
        "split AC",
        "breaks",
        "fullgraph share",
        "verified",
    ):
        table.add_column(col)
    for k in plan.kinds:
        table.add_row(
            k.kind,
            str(len(k.layers)),
            f"{k.mode} fullgraph" if k.fullgraph else k.mode,
            k.eager_summary() or "-",
            "yes" if k.split_ac else "-",
            f"{k.breaks_before} -> {k.breaks_after}",
            f"{k.fullgraph_share_before:.0%} -> {k.fullgraph_share_after:.0%}",
            "yes" if k.verified else "NO",
        )
    console.print(table)
    for k in plan.kinds:
        for reason in k.reasons:
            console.print(f"  {k.kind}: {reason}", markup=False)
        if not k.verified:
            console.print(f"  {k.kind}: {k.detail}", markup=False)
        if k.cudagraphs:
            ready = "is CUDA-graph ready" if k.cudagraph_ready else "is not CUDA-graph ready"
            console.print(f"  {k.kind} {ready}: {k.cudagraphs}", markup=False)
    if any(k.cudagraph_ready for k in plan.kinds):
        console.print(
            "  CUDA graphs: emitted code takes cudagraphs=True to compile the ready kinds with "
            'mode="reduce-overhead"; `gbdoctor run --plan ... --modes plan,cudagraphs` checks it on CUDA',
            markup=False,
        )
    ds = plan.deepspeed
    if ds is not None:
        leaf = f"; ZeRO-3 leaf modules: {', '.join(ds.leaf_modules)}" if ds.leaf_modules else ""
        console.print(
            f"DeepSpeed (ZeRO-{ds.zero_stage}): compile {ds.mode}, fullgraph={ds.fullgraph}{leaf}",
            markup=False,
        )
        for item in ds.remaining:
            console.print(f"  remains: {item}", markup=False)
    if plan.flags:
        console.print("Dynamo flags: " + ", ".join(f"{n}={v}" for n, v in plan.flags), markup=False)
        for cost in plan.flag_costs:
            console.print(f"  cost: {cost}", markup=False)
    for s in plan.suggestions:
        console.print(f"  also possible: {s}", markup=False)
    return plain_text(console)
