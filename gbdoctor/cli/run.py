"""``gbdoctor run``: train for real under every mode and compare throughput
(``gbdoctor.run.run_modes``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gbdoctor.cli.bounds import check_measuring
from gbdoctor.cli.inputs import load_spec_args, read_priced_scan
from gbdoctor.cli.options import (
    DetailsOpt,
    OutputOpt,
    RegistryRun,
    RunFormatOpt,
    SetOpt,
    SpecArgs,
    StrictOpt,
    WorldSizeOpt,
)
from gbdoctor.cli.output import ProgressBar, emit, err_console, preflight, say, spare_model_code
from gbdoctor.errors import ExitCode
from gbdoctor.records.enums import ENVIRONMENT_FAILURES, ModeStatus

if TYPE_CHECKING:
    from gbdoctor.records import Plan


def run(
    spec: SpecArgs = None,
    registry_run: RegistryRun = None,
    set_: SetOpt = None,
    modes: Annotated[
        str | None,
        typer.Option(
            "--modes",
            help="Comma-separated subset of eager,titan-v0.2.0,titan-v0.2.2,block-fullgraph,plan,"
            "cudagraphs (the plan with mode=reduce-overhead; CUDA only)",
        ),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", help="Measured steps per mode and round")] = 5,
    warmup: Annotated[
        int, typer.Option("--warmup", help="Warm-up steps per mode (compile happens here)")
    ] = 2,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            help="Run every mode this many times, alternating the order; 2+ gives ratios a spread",
        ),
    ] = 2,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="inductor (what training uses) or aot_eager (traces only: quick runs, tests); "
            "default: the spec's [compile] backend when it names one, else inductor",
        ),
    ] = None,
    plan_file: Annotated[
        Path | None,
        typer.Option("--plan", help="Reuse a saved plan JSON instead of making one"),
    ] = None,
    no_plan: Annotated[bool, typer.Option("--no-plan", help="Do not make or run a plan")] = False,
    price_file: Annotated[
        Path | None,
        typer.Option(
            "--price",
            help="A `gbdoctor price -f json` output of this spec: set its predicted gain beside "
            "the gain measured here (plan against the mode as set up)",
        ),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size", help="Local batch (default: CPU bench shape; CUDA: [training])"
        ),
    ] = None,
    seq_len: Annotated[
        int | None,
        typer.Option(
            "--seq-len", help="Sequence length (default: CPU bench shape; CUDA: [training])"
        ),
    ] = None,
    nproc: Annotated[
        int | None, typer.Option("--nproc", help="Ranks (must match the spec's world size)")
    ] = None,
    format: RunFormatOpt = "table",
    csv: Annotated[
        Path | None, typer.Option("--csv", help="Also write one CSV row per mode")
    ] = None,
    output: OutputOpt = None,
    details: DetailsOpt = False,
    strict: StrictOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Make and verify the plan, then train for real under eager, the torchtitan baselines and
    the plan; compare throughput, each ratio with its spread over rounds.

    It cannot simulate: a spec that does not fit this machine is refused (exit 2) with the
    memory estimate and how to shrink it."""
    from gbdoctor.frameworks import framework_for
    from gbdoctor.price.check import priced_mode, with_price_check
    from gbdoctor.report.formats import Printout, RenderOptions, render
    from gbdoctor.report.plan_table import render_plan_table
    from gbdoctor.report.run_formats import write_csv
    from gbdoctor.run import run_modes
    from gbdoctor.run.settings import run_settings

    check_measuring(rounds, steps, warmup, batch_size, seq_len)
    files = tuple(spec or ()) if registry_run is None else ()
    preflight(format, Printout.RUN, output, csv, inputs=(*files, plan_file, price_file))
    priced = read_priced_scan(price_file) if price_file is not None else None
    if priced is not None and no_plan:
        raise typer.BadParameter(
            "--price compares the plan with the mode as set up: drop --no-plan"
        )
    loaded = load_spec_args(spec, registry_run, set_, world_size=world_size)
    framework = framework_for(loaded)  # once: the plan, the modes, the ranks and the report
    spare_model_code(loaded, output, csv)
    settings = run_settings(
        loaded,
        steps=steps,
        warmup=warmup,
        rounds=rounds,
        backend=backend,
        batch_size=batch_size,
        seq_len=seq_len,
        nproc=nproc,
    )
    chosen = [m.strip() for m in modes.split(",") if m.strip()] if modes else None

    def show_plan(result: Plan) -> None:
        err_console.print(render_plan_table(result), markup=False, highlight=False)

    with ProgressBar() as bar:
        report = run_modes(
            loaded,
            settings,
            modes=chosen,
            plan_path=str(plan_file) if plan_file else None,
            make_plan=not no_plan,
            progress=bar,
            on_plan=show_plan,
            extra_modes=priced_mode(framework, priced) if priced is not None else None,
            framework=framework,
        )
    if priced is not None:
        report = with_price_check(report, priced)
    emit(render(Printout.RUN, format, report, RenderOptions(details=details)), output)
    if csv is not None:
        write_csv(report, csv)
    # A mode that failed by a graph break or a compile error is a finding about that mode;
    # one whose rank was killed or timed out means the comparison itself did not happen.
    broken = [
        mode
        for mode in report.modes
        if mode.status == ModeStatus.FAILED and mode.error_kind in ENVIRONMENT_FAILURES
    ]
    if broken:
        for mode in broken:
            say(f"Error: mode {mode.mode} failed ({mode.error_kind}): {mode.error}")
        say("Hint: the report above is incomplete; rerun, or raise --set gbdoctor.timeout_s=...")
        raise typer.Exit(int(ExitCode.ENVIRONMENT))
    if strict and report.has_findings:
        raise typer.Exit(int(ExitCode.FINDINGS))
