"""``gbdoctor inspect``: the model as set up (``gbdoctor.scan.inspect.inspect_spec``)."""

from __future__ import annotations

import contextlib
import sys

from gbdoctor.cli.inputs import choose_strategy, load_spec_args, named_run
from gbdoctor.cli.options import (
    AccelerateOpt,
    InspectFormatOpt,
    ModelOpt,
    OutputOpt,
    SetOpt,
    SimulateOpt,
    SpecArgs,
    StrategyOpt,
    TorchtitanOpt,
    WorldSizeOpt,
)
from gbdoctor.cli.output import emit, notice, preflight


def inspect(
    spec: SpecArgs = None,
    torchtitan: TorchtitanOpt = None,
    accelerate: AccelerateOpt = None,
    model: ModelOpt = None,
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    format: InspectFormatOpt = "table",
    output: OutputOpt = None,
    simulate: SimulateOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Show the model as set up: AC wrappers, compiled regions, FSDP sharding, hooks."""
    from gbdoctor.report.inspect import render_inspect
    from gbdoctor.scan.inspect import inspect_spec

    preflight(
        format,
        "inspect",
        output,
        inputs=tuple(spec or ()) if named_run(torchtitan, accelerate) is None else (),
    )
    loaded = load_spec_args(
        spec,
        torchtitan,
        set_,
        simulate=simulate,
        world_size=world_size,
        accelerate=accelerate,
        model=model,
    )
    # The model's own prints go to stderr: stdout holds only the report.
    with contextlib.redirect_stdout(sys.stderr):
        report = inspect_spec(loaded, strategy=choose_strategy(loaded, strategy, None))
    notice(report.notes, output, format)
    emit(render_inspect(report, format), output)
