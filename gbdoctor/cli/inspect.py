"""``gbdoctor inspect``: the model as set up (``gbdoctor.scan.inspect.inspect_spec``)."""

from __future__ import annotations

import contextlib
import sys

from gbdoctor.cli.inputs import choose_strategy, load_spec_args
from gbdoctor.cli.options import (
    InspectFormatOpt,
    OutputOpt,
    RegistryRun,
    SetOpt,
    SimulateOpt,
    SpecArgs,
    StrategyOpt,
    WorldSizeOpt,
)
from gbdoctor.cli.output import emit, notice, preflight, spare_model_code


def inspect(
    spec: SpecArgs = None,
    registry_run: RegistryRun = None,
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    format: InspectFormatOpt = "table",
    output: OutputOpt = None,
    simulate: SimulateOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Show the model as set up: AC wrappers, compiled regions, FSDP sharding, hooks."""
    from gbdoctor.frameworks import framework_for
    from gbdoctor.report.formats import Printout, render
    from gbdoctor.scan.inspect import inspect_spec

    preflight(
        format, Printout.INSPECT, output, inputs=tuple(spec or ()) if registry_run is None else ()
    )
    loaded = load_spec_args(spec, registry_run, set_, simulate=simulate, world_size=world_size)
    spare_model_code(loaded, output)
    framework = framework_for(loaded)  # once: the --strategy check and the set-up
    # The model's own prints go to stderr: stdout holds only the report.
    with contextlib.redirect_stdout(sys.stderr):
        chosen = choose_strategy(loaded, strategy, None, framework)
        report = inspect_spec(loaded, strategy=chosen, framework=framework)
    notice(report.notes, output, format)
    emit(render(Printout.INSPECT, format, report), output)
