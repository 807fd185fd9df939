"""The options more than one command takes, each defined once as an ``Annotated`` alias, so
that every command spells, documents and validates it the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.models import OptionInfo

from gbdoctor.frameworks.registry import command_line_run
from gbdoctor.report.formats import Printout, format_help

_REGISTRY_RUN = command_line_run()
RUN_FLAG = _REGISTRY_RUN.flag
"""The option that names a run by a framework's config registry (``RegistryRuns.flag``)."""
SPECS_HELP = (
    f"TOML train config (docs/specs.md); with {RUN_FLAG}, the --section.key overrides of "
    f"{_REGISTRY_RUN.title} instead"
)

SpecArg = Annotated[
    Path, typer.Argument(help="TOML train config (docs/specs.md)", show_default=False)
]
SpecArgs = Annotated[
    list[str] | None, typer.Argument(metavar="SPEC", help=SPECS_HELP, show_default=False)
]
RegistryRunOpt = Annotated[
    str | None, typer.Option(RUN_FLAG, help=_REGISTRY_RUN.flag_help, show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Override a spec key: section.key=value (repeatable)", show_default=False
    ),
]
StrategyOpt = Annotated[
    str | None,
    typer.Option(
        "--strategy",
        help="Compile strategy preset (default: the spec's [gbdoctor] strategy, else 'block')",
    ),
]
OutputOpt = Annotated[Path | None, typer.Option("--output", "-o", help="Write the report to FILE")]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Exit 1 when any break, event or error is found")
]
DetailsOpt = Annotated[
    bool,
    typer.Option(
        "--details",
        "-v",
        help="Table: also the full setup, every CUDA-graph finding and every recompile (the "
        "verdict, the breaks and one line per other finding otherwise); other formats hold "
        "everything anyway",
    ),
]
StrictImprovementsOpt = Annotated[
    bool,
    typer.Option(
        "--strict-improvements", help="Fail on improvements too (keep the baseline tight)"
    ),
]
SimulateOpt = Annotated[
    bool,
    typer.Option(
        "--simulate",
        help="Meta tensors + fake process group (automatic when the spec does not fit this machine)",
    ),
]
WorldSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--world-size",
        min=1,
        help="Ranks of the training launch; resolves data_parallel_shard_degree = -1 "
        "(default: [gbdoctor] world_size)",
        show_default=False,
    ),
]


def _format_option(printout: Printout) -> OptionInfo:
    """``--format/-f`` of a command that prints ``printout``: its help lists the formats
    ``report.formats.RENDERERS`` has for it (``output.preflight`` checks the value against the
    same registry, and the command renders through it)."""
    return typer.Option("--format", "-f", help=format_help(printout))


ScanFormatOpt = Annotated[str, _format_option(Printout.SCAN)]
PriceFormatOpt = Annotated[str, _format_option(Printout.PRICE)]
InspectFormatOpt = Annotated[str, _format_option(Printout.INSPECT)]
CausesFormatOpt = Annotated[str, _format_option(Printout.CAUSES)]
RunFormatOpt = Annotated[str, _format_option(Printout.RUN)]
PlanFormatOpt = Annotated[str, _format_option(Printout.PLAN)]
GateFormatOpt = Annotated[str, _format_option(Printout.GATE)]
TimelineFormatOpt = Annotated[str, _format_option(Printout.TIMELINE)]
