"""``gbdoctor scan``: capture every graph break of every block (``gbdoctor.scan.scan``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gbdoctor.cli.inputs import choose_strategy, load_spec_options
from gbdoctor.cli.options import (
    OutputOpt,
    ScanFormatOpt,
    SetOpt,
    SimulateOpt,
    StrategyOpt,
    StrictOpt,
    WorldSizeOpt,
)
from gbdoctor.cli.output import ProgressBar, emit, notice, preflight
from gbdoctor.errors import ExitCode

if TYPE_CHECKING:
    from gbdoctor.records import ScanReport, Spec


def scan(
    spec_args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="SPEC",
            help="torchtitan v0.2.x TOML train config; with --torchtitan, torchtitan's own "
            "--section.key overrides instead",
            show_default=False,
        ),
    ] = None,
    torchtitan: Annotated[
        str | None,
        typer.Option(
            "--torchtitan",
            help="Set up with the installed torchtitan (>= 0.3): MODULE:CONFIG of its config "
            "registry, followed by torchtitan's own --section.key overrides",
        ),
    ] = None,
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="Scan with a gbdoctor plan.json applied")
    ] = None,
    format: ScanFormatOpt = "table",
    output: OutputOpt = None,
    strict: StrictOpt = False,
    simulate: SimulateOpt = False,
    world_size: WorldSizeOpt = None,
    no_dedupe: Annotated[
        bool, typer.Option("--no-dedupe", help="Capture every layer, not one per kind")
    ] = False,
    recompile_probe: Annotated[
        bool | None,
        typer.Option(
            "--recompile-probe/--no-recompile-probe",
            help="Run each block kind twice more with changed inputs and record its recompiles "
            "(default on; costs about two eager steps and two block replays per kind)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Capture every graph break of every block under the spec's training setup."""
    from gbdoctor.report import render
    from gbdoctor.summary import has_findings

    preflight(format, "scan", output, inputs=(*(spec_args or [])[:1], plan))
    args = spec_args or []
    if torchtitan is not None:
        if strategy is not None or plan is not None or simulate or world_size is not None:
            raise typer.BadParameter(
                "--torchtitan takes no --strategy, --plan, --simulate or --world-size: "
                "torchtitan's own code decides the setup"
            )
        if recompile_probe:
            raise typer.BadParameter(
                "--torchtitan scans have no recompile probe (scan a SPEC.toml for recompiles)"
            )
        report = _scan_torchtitan(torchtitan, args, set_, dedupe=not no_dedupe)
        emit(render(report, format), output)
        if strict and has_findings(report):
            raise typer.Exit(int(ExitCode.FINDINGS))
        return
    if len(args) != 1 or args[0].startswith("-"):
        raise typer.BadParameter(
            "give one SPEC.toml (unknown options such as --section.key are torchtitan "
            "overrides: they need --torchtitan MODULE:CONFIG)"
        )
    loaded = load_spec_options(Path(args[0]), set_, simulate=simulate, world_size=world_size)
    report = scan_with_progress(
        loaded,
        choose_strategy(loaded, strategy, plan),
        dedupe=not no_dedupe,
        recompiles=recompile_probe,
    )
    notice(report.notes, output, format)
    emit(render(report, format), output)
    if strict and has_findings(report):
        raise typer.Exit(int(ExitCode.FINDINGS))


def scan_with_progress(
    spec: Spec, strategy: Any, dedupe: bool = True, recompiles: bool | None = None
) -> ScanReport:
    """``gbdoctor.scan.scan`` under a progress bar on stderr."""
    from gbdoctor.scan import scan as run_scan

    with ProgressBar() as bar:
        return run_scan(spec, strategy=strategy, dedupe=dedupe, progress=bar, recompiles=recompiles)


def _scan_torchtitan(
    name: str, args: list[str], set_: list[str] | None, *, dedupe: bool
) -> ScanReport:
    from gbdoctor.errors import SpecError
    from gbdoctor.frameworks.torchtitan.setup import DEFAULT_BATCH_SIZE, DEFAULT_SEQ_LEN, parse_run
    from gbdoctor.scan.torchtitan import scan_torchtitan

    capture = {"batch_size": DEFAULT_BATCH_SIZE, "seq_len": DEFAULT_SEQ_LEN}
    for item in set_ or []:
        key, sep, value = item.partition("=")
        field = key.removeprefix("gbdoctor.")
        if not sep or field not in capture or not value.isdigit() or int(value) < 1:
            raise SpecError(
                f"--set {item!r} is not a capture setting of a torchtitan scan",
                hint="only --set gbdoctor.batch_size=N and --set gbdoctor.seq_len=N apply; "
                "torchtitan's own keys go as --section.key VALUE",
            )
        capture[field] = int(value)
    run = parse_run(name, tuple(args), **capture)
    with ProgressBar() as bar:
        return scan_torchtitan(run, dedupe=dedupe, progress=bar)
