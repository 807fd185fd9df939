"""The options more than one command takes, each defined once as an ``Annotated`` alias, so
that every command spells, documents and validates it the same way."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.models import OptionInfo

from gbdoctor.frameworks.registry import command_line_runs
from gbdoctor.report.formats import Printout, format_help

if TYPE_CHECKING:
    from gbdoctor.records.shapes import ShapeStream

_RUNS = command_line_runs()
RUN_FLAGS = tuple(run.flag for run in _RUNS)
"""The options that name a run by a framework's own configuration instead of a SPEC.toml (each
framework's ``RegistryRuns.flag``: ``--torchtitan MODULE:CONFIG``, ``--accelerate CONFIG``)."""
RUN_FLAG = " or ".join(RUN_FLAGS)
"""How messages name them."""
SPECS_HELP = (
    "TOML train config (docs/specs.md); with "
    + ", ".join(f"{run.flag} ({run.title})" for run in _RUNS)
    + ", that framework's own arguments instead"
)

SpecArg = Annotated[
    Path, typer.Argument(help="TOML train config (docs/specs.md)", show_default=False)
]
SpecArgs = Annotated[
    list[str] | None, typer.Argument(metavar="SPEC", help=SPECS_HELP, show_default=False)
]
RegistryRun = tuple[str, str] | None
"""``(flag, value)`` of the framework run option given on the command line, if any: what
:func:`with_registry_runs` hands a command as its ``registry_run`` parameter."""


def with_registry_runs(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` with one option per framework that names runs itself (:data:`RUN_FLAGS`),
    in place of its ``registry_run`` parameter, which receives the one given as ``(flag,
    value)``. An installed plug-in's option appears on every command that takes a spec, with no
    command naming it; two at once are a usage error."""
    # Evaluated: typer reads a __signature__'s annotations as they are (no string resolution).
    signature = inspect.signature(command, eval_str=True)
    names = [f"registry_run_{i}" for i in range(len(_RUNS))]
    options = [
        inspect.Parameter(
            name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=None,
            annotation=Annotated[
                str | None, typer.Option(run.flag, help=run.flag_help, show_default=False)
            ],
        )
        for name, run in zip(names, _RUNS)
    ]
    kept = [p for p in signature.parameters.values() if p.name != "registry_run"]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given = [(run.flag, kwargs.pop(name)) for name, run in zip(names, _RUNS)]
        chosen = [(flag, value) for flag, value in given if value is not None]
        if len(chosen) > 1:
            raise typer.BadParameter(
                f"{' and '.join(flag for flag, _ in chosen)} each name a run: give one"
            )
        return command(*args, registry_run=chosen[0] if chosen else None, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[*kept, *options])  # type: ignore[attr-defined]
    return wrapper


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


ShapesOpt = Annotated[
    str | None,
    typer.Option(
        "--shapes",
        help="The batch shapes per step and rank: a shape-stream JSON file, or a preset "
        "(varlen|buckets|packed|last-partial[:k=v,...]) (docs/shapes.md)",
        show_default=False,
    ),
]


def load_shapes(text: str | None) -> ShapeStream | None:
    """``--shapes``: a preset (``varlen:steps=30``) or a stream file, checked (exit 2 when bad)."""
    from gbdoctor.errors import SpecError
    from gbdoctor.records.shape_presets import is_preset, preset_stream
    from gbdoctor.records.shapes import read_shape_stream

    if text is None:
        return None
    stream = preset_stream(text) if is_preset(text) else read_shape_stream(text)
    if len(stream.steps) < 2:
        raise SpecError(f"--shapes {text[:60]}: 1 step; a stream needs at least 2")
    return stream
