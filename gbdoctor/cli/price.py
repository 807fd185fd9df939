"""``gbdoctor price``: what each distinct graph break costs a training step
(``gbdoctor.price.driver.price_scan``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gbdoctor.cli.bounds import check_measuring
from gbdoctor.cli.inputs import choose_strategy, load_spec_options
from gbdoctor.cli.options import (
    DetailsOpt,
    OutputOpt,
    PriceFormatOpt,
    SetOpt,
    SpecArg,
    StrategyOpt,
    StrictOpt,
    WorldSizeOpt,
)
from gbdoctor.cli.output import (
    ProgressBar,
    emit,
    notice,
    preflight,
    spare_model_code,
    table_width,
)
from gbdoctor.errors import ExitCode
from gbdoctor.records import Clock


def price(
    spec: SpecArg,
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    plan_file: Annotated[
        Path | None,
        typer.Option(
            "--plan", help="The fixes to price against: a saved plan JSON (default: make one)"
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="inductor (what training uses) or aot_eager (quick, tests); default: the spec's "
            "[compile] backend when it names one, else inductor (as `run` and `timeline`)",
        ),
    ] = None,
    rounds: Annotated[
        int, typer.Option("--rounds", help="Repeat every mode, alternating the order (spread)")
    ] = 2,
    steps: Annotated[int, typer.Option("--steps", help="Measured steps per mode and round")] = 3,
    warmup: Annotated[
        int, typer.Option("--warmup", help="Warm-up steps per mode (compile happens here)")
    ] = 2,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="Local batch (default: as `run`)")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", help="Sequence length (default: as `run`)")
    ] = None,
    clock: Annotated[
        Clock,
        typer.Option(
            "--clock",
            help="wall: elapsed step time (what training feels); cpu: the ranks' CPU time, "
            "steady on a busy machine (CPU devices)",
        ),
    ] = Clock.WALL,
    format: PriceFormatOpt = "table",
    output: OutputOpt = None,
    details: DetailsOpt = False,
    strict: StrictOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Scan, then measure what each distinct break costs a training step (ms and share, with
    the spread over rounds): each block kind as set up against the same kind fixed by the plan."""
    from gbdoctor.cli.scan import scan_with_progress
    from gbdoctor.frameworks import framework_for
    from gbdoctor.plan import PriorScan, propose_plan, read_plan
    from gbdoctor.price.driver import price_scan
    from gbdoctor.report.formats import Printout, RenderOptions, render
    from gbdoctor.run.settings import run_settings
    from gbdoctor.scan import scan_decision
    from gbdoctor.setup.dist import shared_ranks
    from gbdoctor.summary import has_findings

    check_measuring(rounds, steps, warmup, batch_size, seq_len)
    preflight(format, Printout.PRICE, output, inputs=(spec, plan_file))
    # Read before the scan: a bad plan file is exit 2 in a second, not after the scan.
    saved_plan = read_plan(plan_file)[0] if plan_file is not None else None
    # The strategy goes into the spec, so the plan is made against the same setup as the scan.
    overrides = [*(set_ or []), *([f"gbdoctor.strategy={strategy}"] if strategy else [])]
    loaded = load_spec_options(spec, overrides, world_size=world_size)
    spare_model_code(loaded, output)
    # Before the scan: a bad backend or clock is exit 2 in a second.
    settings = run_settings(
        loaded,
        steps=steps,
        warmup=warmup,
        rounds=rounds,
        backend=backend,
        batch_size=batch_size,
        seq_len=seq_len,
        clock=clock,
    )
    # Real or simulated is decided once, for the scan and every re-scan of the plan; the plan
    # takes the scan below where it asks for that same capture (PriorScan).
    framework = framework_for(loaded)  # once: the scan, the plan's re-scans and the rounds
    decision = scan_decision(loaded, framework)
    chosen = choose_strategy(loaded, strategy, None, framework)
    # The scan's ranks run the rounds too (setup.dist.shared_ranks): one start, not two.
    with shared_ranks():
        report = scan_with_progress(
            loaded, chosen, recompiles=False, decision=decision, framework=framework
        )
        if saved_plan is not None:
            plan = saved_plan
        else:
            prior = PriorScan(report=report, spec=loaded, strategy=chosen, recompiles=False)
            with ProgressBar() as bar:
                plan = propose_plan(
                    loaded,
                    progress=lambda m, d, t: bar(f"plan: {m}", d, t),
                    decision=decision,
                    prior=prior,
                    framework=framework,
                )
        with ProgressBar() as bar:
            priced = price_scan(loaded, report, plan, settings, progress=bar, framework=framework)
    notice(priced.notes, output, format)
    options = RenderOptions(details=details, width=table_width(output))
    emit(render(Printout.PRICE, format, priced, options), output)
    if strict and has_findings(priced):
        raise typer.Exit(int(ExitCode.FINDINGS))
