"""The options more than one command takes, each defined once as an ``Annotated`` alias, so
that every command spells, documents and validates it the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.models import OptionInfo

from gbdoctor.report import COMMAND_FORMATS

SpecArg = Annotated[
    Path, typer.Argument(help="torchtitan v0.2.x TOML train config", show_default=False)
]
SpecArgs = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="SPEC",
        help="torchtitan v0.2.x TOML train config; with --torchtitan, torchtitan's own "
        "--section.key overrides instead",
        show_default=False,
    ),
]
TorchtitanOpt = Annotated[
    str | None,
    typer.Option(
        "--torchtitan",
        help="Set up with the installed torchtitan (>= 0.3): MODULE:CONFIG of its config "
        "registry, followed by torchtitan's own --section.key overrides",
        show_default=False,
    ),
]
AccelerateOpt = Annotated[
    str | None,
    typer.Option(
        "--accelerate",
        help="Set up with Hugging Face Accelerate's FSDP2 path: CONFIG is the YAML `accelerate "
        "config` writes or a TrainingArguments JSON/YAML (needs --model)",
        show_default=False,
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="With --accelerate: a directory with config.json, a Hub id in the local cache, or "
        "FILE.py:FUNCTION (never downloaded)",
        show_default=False,
    ),
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


def _format_option(command: str) -> OptionInfo:
    """``--format/-f`` of ``command``: its help lists the formats ``report.COMMAND_FORMATS``
    registers for the command (``output.preflight`` checks the value against the same list)."""
    return typer.Option("--format", "-f", help="|".join(COMMAND_FORMATS[command]))


ScanFormatOpt = Annotated[str, _format_option("scan")]
InspectFormatOpt = Annotated[str, _format_option("inspect")]
CausesFormatOpt = Annotated[str, _format_option("causes")]
RunFormatOpt = Annotated[str, _format_option("run")]
PlanFormatOpt = Annotated[str, _format_option("plan")]
GateFormatOpt = Annotated[str, _format_option("gate")]
DiffFormatOpt = Annotated[str, _format_option("diff")]
