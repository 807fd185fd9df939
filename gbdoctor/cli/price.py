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
        str,
        typer.Option("--backend", help="inductor (what training uses) or aot_eager (quick, tests)"),
    ] = "inductor",
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
    from gbdoctor.plan import propose_plan, read_plan
    from gbdoctor.price.driver import check_clock, price_scan
    from gbdoctor.report.formats import Printout, RenderOptions, render
    from gbdoctor.run.modes import check_backend
    from gbdoctor.setup.dist import shared_ranks
    from gbdoctor.summary import has_findings

    check_measuring(rounds, steps, warmup, batch_size, seq_len)
    preflight(format, Printout.PRICE, output, inputs=(spec, plan_file))
    # Read before the scan: a bad plan file is exit 2 in a second, not after the scan.
    saved_plan = read_plan(plan_file)[0] if plan_file is not None else None
    check_backend(backend)
    # The strategy goes into the spec, so the plan is made against the same setup as the scan.
    overrides = [*(set_ or []), *([f"gbdoctor.strategy={strategy}"] if strategy else [])]
    loaded = load_spec_options(spec, overrides, world_size=world_size)
    spare_model_code(loaded, output)
    check_clock(clock, loaded)
    # The scan's ranks run the rounds too (setup.dist.shared_ranks): one start, not two.
    with shared_ranks():
        report = scan_with_progress(
            loaded, choose_strategy(loaded, strategy, None), recompiles=False
        )
        if saved_plan is not None:
            plan = saved_plan
        else:
            with ProgressBar() as bar:
                plan = propose_plan(loaded, progress=lambda m, d, t: bar(f"plan: {m}", d, t))
        with ProgressBar() as bar:
            priced = price_scan(
                loaded,
                report,
                plan,
                backend=backend,
                rounds=rounds,
                steps=steps,
                warmup=warmup,
                batch_size=batch_size,
                seq_len=seq_len,
                progress=bar,
                clock=clock,
            )
    notice(priced.notes, output, format)
    options = RenderOptions(details=details, width=table_width(output))
    emit(render(Printout.PRICE, format, priced, options), output)
    if strict and has_findings(priced):
        raise typer.Exit(int(ExitCode.FINDINGS))
