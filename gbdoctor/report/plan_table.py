"""Layout of ``gbdoctor plan``: one row per block kind, then reasons and flag costs; its
renderers (``plan_table``, ``plan_html``) in :mod:`gbdoctor.report.formats`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gbdoctor.records import Plan, PriceReport
from gbdoctor.records.io import dumps
from gbdoctor.report.formats import RenderOptions


def _no_configs() -> tuple[tuple[str, str], ...]:
    return ()


@dataclass(frozen=True)
class PlanPrintout:
    """What ``gbdoctor plan`` prints: the plan; the table shows each kind's predicted gain
    from ``price`` (a ``gbdoctor price`` output of the same spec); the HTML page shows the
    configs the plan emits, as ``(name, text)`` pairs. ``configs`` is called only by the page:
    the caller emits them (report/ does not import plan/), and a table needs none."""

    plan: Plan
    price: PriceReport | None = None
    configs: Callable[[], tuple[tuple[str, str], ...]] = _no_configs


def plan_table(printout: PlanPrintout, options: RenderOptions) -> str:
    return render_plan_table(printout.plan, printout.price)


def plan_html(printout: PlanPrintout, options: RenderOptions) -> str:
    """``--format html``: the plan's page, with its JSON twin (the plan file's text) and the
    emitted configs."""
    from gbdoctor.report.html import plan_document, render_html

    plan = printout.plan
    return render_html([plan_document(plan, dumps(plan), printout.configs())])


def render_plan_table(plan: Plan, price: PriceReport | None = None) -> str:
    """The plan as a table; with ``price`` (a ``gbdoctor price`` output of the same spec) each
    kind's predicted gain: the measured price of the breaks its fix removes."""
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
    for line in plan.stage_lines():
        # Unwrapped: one line per stage, whatever the width (scripts and the docs grep them).
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if price is not None:
        for line in predicted_gains(plan, price):
            console.print(line, markup=False, highlight=False)
    for k in plan.kinds:
        for reason in k.reasons:
            console.print(f"  {k.kind}: {reason}", markup=False)
        if not k.verified:
            console.print(f"  {k.kind}: {k.detail}", markup=False)
        if k.cudagraphs:
            ready = "is CUDA-graph ready" if k.cudagraph_ready else "is not CUDA-graph ready"
            console.print(f"  {k.kind} {ready}: {k.cudagraphs}", markup=False)
    if any(k.cudagraph_ready for k in plan.kinds):
        console.print(_cudagraph_usage(plan), markup=False)
    extra = plan.framework_section()
    if extra is not None:
        console.print(extra.headline, markup=False)
        for item in extra.remaining:
            console.print(f"  remains: {item}", markup=False)
    if plan.flags:
        console.print("Dynamo flags: " + ", ".join(f"{n}={v}" for n, v in plan.flags), markup=False)
        for cost in plan.flag_costs:
            console.print(f"  cost: {cost}", markup=False)
    for s in plan.suggestions:
        console.print(f"  also possible: {s}", markup=False)
    return plain_text(console)


def predicted_gains(plan: Plan, price: PriceReport) -> list[str]:
    """One line per plan kind: the priced kind's measured price (its fix's predicted gain)."""
    by_kind = {k.kind: k for k in price.kinds}
    lines = []
    for k in plan.kinds:
        priced = by_kind.get(k.kind)
        if priced is None or priced.ms_per_step is None:
            why = (
                "no price (no breaks there, or the kind did not train)"
                if priced is None
                else priced.detail
            )
            lines.append(f"  {k.kind}: predicted gain: {why}")
            continue
        spread = (
            f" [{priced.spread_ms[0]:.1f} to {priced.spread_ms[1]:.1f}]" if priced.spread_ms else ""
        )
        share = f", {priced.share:.1%} of the step" if priced.share is not None else ""
        free = " (within noise)" if priced.free else ""
        lines.append(
            f"  {k.kind}: predicted gain {priced.ms_per_step:.1f}{spread} ms/step{share}{free}, "
            f"measured against {priced.counterfactual} on {price.device} ({price.backend})"
        )
    return lines


def _cudagraph_usage(plan: Plan) -> str:
    """How to use the ready kinds: the python emitter serves every framework; a run mode that
    measures them exists only where the plan's framework has one."""
    from gbdoctor.frameworks.interface import HasRunModes
    from gbdoctor.frameworks.registry import framework_named

    line = (
        "  CUDA graphs: `--emit-config python` code takes cudagraphs=True to compile the ready "
        'kinds with mode="reduce-overhead"'
    )
    framework = framework_named(plan.framework)
    if isinstance(framework, HasRunModes) and "cudagraphs" in framework.run_modes.modes:
        line += "; `gbdoctor run --plan ... --modes plan,cudagraphs` measures it on CUDA"
    return line
