"""The ``gbdoctor`` command line: a thin typer app over the library API.

Each command parses, calls the library, renders and returns an exit code. Errors from the
library (``GbdoctorError``) become one line ``Error: ...`` plus ``Hint: ...`` on stderr and the
documented exit code; ``--debug`` (or ``GBDOCTOR_DEBUG=1``) adds the traceback.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

from gbdoctor.errors import DEBUG_ENV, ExitCode, GbdoctorError, exception_line

# typer vendors click (``typer._click``) in recent releases and uses the real package in older
# ones: find click's base exception through a public class instead of importing either.
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class _OneLineErrors(TyperGroup):
    """Usage errors (unknown option, bad value) as click's plain ``Error: ...`` line instead of
    typer's rich box, which wraps the message over several lines."""

    def main(
        self,
        args: Any = None,
        prog_name: Any = None,
        complete_var: Any = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _ClickException as exc:
            if not standalone_mode:
                raise
            exc.show()
            if getattr(exc, "option_name", None) == "--debug":
                _say("Hint: --debug is an option of gbdoctor itself: gbdoctor --debug COMMAND ...")
            sys.exit(exc.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            _say("Aborted.")
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts name TOML tables ("[training]"): plain text, not Rich markup, which would eat them.
    rich_markup_mode=None,
    help="Find, explain, fix and gate torch.compile graph breaks under real training setups.",
)
err_console = Console(stderr=True)

SpecArg = Annotated[
    Path, typer.Argument(help="torchtitan v0.2.x TOML train config", show_default=False)
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


def format_opt(command: str) -> Any:
    """``--format/-f`` for ``command``, its help listing the values ``report.COMMAND_FORMATS``
    registers for it."""
    from gbdoctor.report import COMMAND_FORMATS

    return Annotated[str, typer.Option("--format", "-f", help="|".join(COMMAND_FORMATS[command]))]


StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Exit 1 when any break, event or error is found")
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


def _debug_enabled() -> bool:
    """``gbdoctor --debug COMMAND`` (the app option, recorded by the app callback on every
    invocation) or ``GBDOCTOR_DEBUG=1``."""
    return _APP_DEBUG[0] or os.environ.get(DEBUG_ENV) == "1"


_APP_DEBUG = [False]
"""The app's ``--debug``, set by ``_root`` each time the CLI runs (typer gives the command no
click context to read it from)."""


@contextlib.contextmanager
def _debug_env(debug: bool) -> Iterator[None]:
    """``--debug`` as ``GBDOCTOR_DEBUG=1`` for the command's duration: spawned ranks inherit it
    (a block that does not trace prints its traceback to stderr)."""
    old = os.environ.get(DEBUG_ENV)
    if debug:
        os.environ[DEBUG_ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = old


class Terminated(BaseException):
    """SIGTERM arrived (CI cancel or timeout): unwound like Ctrl-C, so every child is stopped."""


SIGNAL_EXIT = {"interrupted": 130, "terminated": 143}
"""Exit status after Ctrl-C (SIGINT) and SIGTERM: 128 + the signal number, as a shell reports it."""


def _on_sigterm(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


def _say(line: str) -> None:
    """One line on stderr, never wrapped (rich wraps at 80 columns when stderr is a pipe)."""
    sys.stderr.write(line.replace("\n", " ") + "\n")
    sys.stderr.flush()


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map library errors to one line and an exit code (traceback only with --debug).

    User code run by the command (a custom model's factory, forward, hooks) that calls
    ``sys.exit`` or ``os._exit`` is an error too (exit 3): a scan must never pass by exiting."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gbdoctor.usercode import exits_guarded

        debug = _debug_enabled()
        try:
            with _debug_env(debug), exits_guarded():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.BadParameter):
            raise
        except GbdoctorError as exc:
            if debug:
                err_console.print(traceback.format_exc(), markup=False, highlight=False)
                remote = getattr(exc, "remote_traceback", None)
                if remote:
                    err_console.print(remote, markup=False, highlight=False)
            _say(f"Error: {exc.message}")
            if exc.hint:
                _say(f"Hint: {exc.hint}")
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt:
            _say("Interrupted.")
            raise typer.Exit(SIGNAL_EXIT["interrupted"]) from None
        except Terminated:
            _say("Terminated.")
            raise typer.Exit(SIGNAL_EXIT["terminated"]) from None
        except RecursionError:
            if debug:
                err_console.print(traceback.format_exc(), markup=False, highlight=False)
            _say("Error: input nested too deeply to read")
            raise typer.Exit(int(ExitCode.BAD_INPUT)) from None
        except Exception as exc:  # noqa: BLE001 - last line of defence: no raw traceback
            if debug:
                err_console.print(traceback.format_exc(), markup=False, highlight=False)
            _say(f"Error: internal error: {exception_line(exc)}")
            _say("Hint: rerun with `gbdoctor --debug ...` and report the traceback")
            raise typer.Exit(int(ExitCode.ENVIRONMENT)) from None

    return wrapper


def _load(
    spec: Path,
    overrides: list[str] | None,
    *,
    simulate: bool = False,
    world_size: int | None = None,
) -> Any:
    from gbdoctor.spec import load_spec

    extra = ["gbdoctor.simulate=true"] if simulate else []
    extra += [f"gbdoctor.world_size={world_size}"] if world_size is not None else []
    return load_spec(spec, [*(overrides or ()), *extra])


def _notice(notes: Any, output: Path | None, format: str) -> None:
    """An automatic simulation's notice, also on stderr when the report does not go to the
    terminal as a table (whose header carries it)."""
    if output is not None or format != "table":
        for note in notes:
            if note.startswith("notice:"):
                err_console.print(note, markup=False, highlight=False, soft_wrap=True)


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        from gbdoctor.records.io import write_atomic

        write_atomic(output, text)
        err_console.print(f"wrote {output}", markup=False, highlight=False, soft_wrap=True)


def _preflight(format: str | None, command: str, *outputs: Path | None) -> None:
    """Check the options that need no model before any work: the format name and every output
    location (a bad one is exit 2 in a second, instead of a lost scan)."""
    from gbdoctor.errors import SpecError
    from gbdoctor.records.io import check_writable
    from gbdoctor.report import COMMAND_FORMATS

    formats = COMMAND_FORMATS.get(command, ())
    if format is not None and format not in formats:
        raise SpecError(f"unknown --format {format!r}", hint=f"valid formats: {', '.join(formats)}")
    for path in outputs:
        if path is not None:
            check_writable(path)


class _ProgressBar:
    """A rich progress bar on stderr driven by the library's (message, done, total) callback.

    While it is shown, Python-level prints (a model's own ``print`` calls, which scans run) go
    to stderr, so that stdout holds only the report (``--format json`` stays parseable).
    """

    def __init__(self) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self._task: Any = None

    def __enter__(self) -> _ProgressBar:
        self._redirect = contextlib.redirect_stdout(sys.stderr)
        self._redirect.__enter__()
        self._progress.__enter__()
        self._task = self._progress.add_task("starting", total=1)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)
        self._redirect.__exit__(*exc)

    def __call__(self, message: str, done: int, total: int) -> None:
        self._progress.update(self._task, description=message, completed=done, total=max(total, 1))


TORCH_VERSIONS_TESTED = ("2.13.0",)
"""torch releases the planted-break suite passes on (benchmarks/compat.py re-measures)."""


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        import torch

        from gbdoctor.setup.torchtitan_native import TORCHTITAN_VERSIONS_TESTED, torchtitan_version

        try:
            own = version("gbdoctor")
        except PackageNotFoundError:
            own = "(not installed)"
        titan = torchtitan_version() or "not installed"
        typer.echo(
            f"gbdoctor {own}\n"
            f"torch {torch.__version__} (tested: {', '.join(TORCH_VERSIONS_TESTED)})\n"
            f"torchtitan {titan} (scan --torchtitan tested with: "
            f"{', '.join(TORCHTITAN_VERSIONS_TESTED)}; the built-in recipe follows v0.2.0-0.2.2)"
        )
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version_callback,
            is_eager=True,
            help="Show gbdoctor, torch and torchtitan versions, and those tested",
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="Show tracebacks on errors (every command; before it: gbdoctor --debug scan ...)",
        ),
    ] = False,
) -> None:
    """Find, explain, fix and gate torch.compile graph breaks under real training setups."""
    _APP_DEBUG[0] = debug


@app.command(context_settings={"ignore_unknown_options": True})
@handle_errors
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
    format: format_opt("scan") = "table",
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

    _preflight(format, "scan", output)
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
        _emit(render(report, format), output)
        if strict and has_findings(report):
            raise typer.Exit(int(ExitCode.FINDINGS))
        return
    if len(args) != 1 or args[0].startswith("-"):
        raise typer.BadParameter(
            "give one SPEC.toml (unknown options such as --section.key are torchtitan "
            "overrides: they need --torchtitan MODULE:CONFIG)"
        )
    spec = Path(args[0])
    loaded = _load(spec, set_, simulate=simulate, world_size=world_size)
    report = _scan_with_progress(
        loaded, _strategy(loaded, strategy, plan), dedupe=not no_dedupe, recompiles=recompile_probe
    )
    _notice(report.notes, output, format)
    _emit(render(report, format), output)
    if strict and has_findings(report):
        raise typer.Exit(int(ExitCode.FINDINGS))


def _strategy(spec: Any, strategy: str | None, plan: Path | None) -> Any:
    if plan is not None:
        if strategy is not None:
            raise typer.BadParameter("--plan and --strategy are mutually exclusive")
        from gbdoctor.plan import plan_strategy, read_plan

        loaded_plan, identity = read_plan(plan)
        return plan_strategy(loaded_plan, spec, identity=identity)
    if strategy is not None:
        if spec.gbdoctor.framework == "deepspeed":
            from gbdoctor.setup.deepspeed import DS_STRATEGIES as STRATEGIES
        else:
            from gbdoctor.setup.compile import STRATEGIES

        if strategy not in STRATEGIES:
            raise typer.BadParameter(
                f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}"
            )
    return strategy


@app.command()
@handle_errors
def inspect(
    spec: SpecArg,
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    format: format_opt("inspect") = "table",
    output: OutputOpt = None,
    simulate: SimulateOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Show the model as set up: AC wrappers, compiled regions, FSDP sharding, hooks."""
    from gbdoctor.report.inspect import render_inspect
    from gbdoctor.scan.inspect import inspect_spec

    _preflight(format, "inspect", output)
    loaded = _load(spec, set_, simulate=simulate, world_size=world_size)
    with contextlib.redirect_stdout(sys.stderr):
        report = inspect_spec(loaded, strategy=_strategy(loaded, strategy, None))
    _notice(report.notes, output, format)
    _emit(render_inspect(report, format), output)


@app.command()
@handle_errors
def causes(
    cause_id: Annotated[str | None, typer.Argument(help="Explain one cause id")] = None,
    format: format_opt("causes") = "table",
    cudagraphs: Annotated[
        bool, typer.Option("--cudagraphs", help="List the CUDA-graph blocker kinds and their fixes")
    ] = False,
) -> None:
    """List the cause ids gbdoctor classifies breaks into, or explain one."""
    from gbdoctor.report.causes_table import render_causes, render_cudagraph_blockers

    _preflight(format, "causes")
    _emit(
        render_cudagraph_blockers(format) if cudagraphs else render_causes(cause_id, format), None
    )


@app.command()
@handle_errors
def plan(
    spec: SpecArg,
    set_: SetOpt = None,
    emit_config: Annotated[
        str | None, typer.Option("--emit-config", help="json|torchtitan|deepspeed|python")
    ] = None,
    output: OutputOpt = None,
    simulate: SimulateOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Propose a per-block compile/wrapping plan, verify it by re-scanning, emit it.

    Exit 1 when some block kind could not be verified (it is then left out of emitted code)."""
    from gbdoctor.plan import propose_plan
    from gbdoctor.plan.emit import EMITTERS, emit
    from gbdoctor.report.plan_table import render_plan_table

    if emit_config is not None and emit_config not in EMITTERS:
        raise typer.BadParameter(f"--emit-config must be one of {', '.join(EMITTERS)}")
    _preflight(None, "plan", output)
    loaded = _load(spec, set_, simulate=simulate, world_size=world_size)
    with _ProgressBar() as bar:
        result = propose_plan(loaded, progress=bar)
    if emit_config is None:
        _emit(render_plan_table(result), output)
    else:
        err_console.print(render_plan_table(result), markup=False, highlight=False)
        _emit(emit(result, emit_config), output)
    if not result.verified:
        raise typer.Exit(int(ExitCode.FINDINGS))


@app.command()
@handle_errors
def run(
    spec: SpecArg,
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
    format: format_opt("run") = "table",
    csv: Annotated[
        Path | None, typer.Option("--csv", help="Also write one CSV row per mode")
    ] = None,
    output: OutputOpt = None,
    strict: StrictOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Make and verify the plan, then train for real under eager, the torchtitan baselines and
    the plan; compare throughput, each ratio with its spread over rounds.

    It cannot simulate: a spec that does not fit this machine is refused (exit 2) with the
    memory estimate and how to shrink it."""
    from gbdoctor.report.plan_table import render_plan_table
    from gbdoctor.report.run_formats import render_run, write_csv
    from gbdoctor.run import run_modes

    _preflight(format, "run", output, csv)
    loaded = _load(spec, set_, world_size=world_size)
    chosen = [m.strip() for m in modes.split(",") if m.strip()] if modes else None

    def show_plan(result: Any) -> None:
        err_console.print(render_plan_table(result), markup=False, highlight=False)

    with _ProgressBar() as bar:
        report = run_modes(
            loaded,
            modes=chosen,
            steps=steps,
            warmup=warmup,
            rounds=rounds,
            backend=backend,
            plan_path=str(plan_file) if plan_file else None,
            make_plan=not no_plan,
            batch_size=batch_size,
            seq_len=seq_len,
            nproc=nproc,
            progress=bar,
            on_plan=show_plan,
        )
    _emit(render_run(report, format), output)
    if csv is not None:
        write_csv(report, csv)
    if strict and report.has_findings:
        raise typer.Exit(int(ExitCode.FINDINGS))


@app.command()
@handle_errors
def gate(
    specs: Annotated[
        list[Path] | None, typer.Argument(help="Spec TOMLs to scan and gate", show_default=False)
    ] = None,
    baseline: Annotated[
        Path,
        typer.Option(
            "--baseline", "-b", help="Baseline JSON (gbdoctor gate --update-baseline writes it)"
        ),
    ] = Path("gbdoctor-baseline.json"),
    scan_json: Annotated[
        list[Path] | None,
        typer.Option(
            "--scan", help="Use a saved `scan --format json` instead of scanning (repeatable)"
        ),
    ] = None,
    update_baseline: Annotated[
        bool, typer.Option("--update-baseline", help="Write the baseline from this scan and pass")
    ] = False,
    strict_improvements: Annotated[
        bool,
        typer.Option(
            "--strict-improvements", help="Fail on improvements too (keep the baseline tight)"
        ),
    ] = False,
    recompiles: Annotated[
        bool,
        typer.Option(
            "--recompiles",
            help="Also fail when a kind recompiles more when its inputs change (the scan's "
            "recompile probe, which runs only with this flag), above all on every step",
        ),
    ] = False,
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    format: format_opt("gate") = "table",
    output: OutputOpt = None,
    simulate: SimulateOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Pre-merge check: exit 1 when graph breaks, new causes or eager fallbacks appear."""
    from gbdoctor.gate import (
        baseline_from_reports,
        check_gate,
        current_pins,
        dump_baseline,
        load_baseline,
        merge_baselines,
        pinned_dynamo,
    )
    from gbdoctor.records.io import check_writable, locked, write_atomic
    from gbdoctor.report import render_gate
    from gbdoctor.report.json import load_scan_json

    if not specs and not scan_json:
        raise typer.BadParameter("give at least one SPEC or --scan FILE")
    _preflight(format, "gate", output)
    # Everything that can be wrong with the inputs is found before the first scan starts.
    if update_baseline:
        check_writable(baseline, "baseline")
        previous = load_baseline(baseline) if baseline.exists() else None
        accepted = None
    else:
        accepted = previous = load_baseline(baseline)
    reports = [load_scan_json(path) for path in scan_json or []]
    loaded_specs = [
        _load(spec, set_, simulate=simulate, world_size=world_size) for spec in specs or []
    ]
    strategies = [_strategy(loaded, strategy, None) for loaded in loaded_specs]
    # Scans run under the Dynamo settings the baseline pins (nested_graph_breaks, ...), so
    # counts stay comparable across torch releases whose defaults differ.
    pins = (
        previous.dynamo_config
        if previous is not None and previous.dynamo_config
        else current_pins()
    )
    with pinned_dynamo(pins) as unknown:
        for name in unknown:
            err_console.print(
                f"warning: this torch has no Dynamo setting {name!r} the baseline pins",
                markup=False,
                highlight=False,
            )
        for loaded, chosen in zip(loaded_specs, strategies, strict=True):
            # The probe costs about two eager steps per kind: only when recompiles are gated.
            reports.append(_scan_with_progress(loaded, chosen, recompiles=recompiles))
            _notice(reports[-1].notes, output, format)
    if update_baseline:
        with locked(baseline):  # read-merge-write: a concurrent update must not lose an entry
            old = load_baseline(baseline) if baseline.exists() else None
            merged = merge_baselines(old, baseline_from_reports(reports, pins))
            write_atomic(baseline, dump_baseline(merged), "baseline")
        err_console.print(
            f"baseline written: {baseline}", markup=False, highlight=False, soft_wrap=True
        )
        return
    result = check_gate(
        reports,
        accepted,
        strict_improvements=strict_improvements,
        recompiles=recompiles,
    )
    _emit(render_gate(result, format), output)
    raise typer.Exit(result.exit_code)


@app.command()
@handle_errors
def diff(
    old: Annotated[Path, typer.Argument(help="Earlier `scan --format json` output")],
    new: Annotated[Path, typer.Argument(help="Later `scan --format json` output")],
    strict_improvements: Annotated[bool, typer.Option("--strict-improvements")] = False,
    format: format_opt("diff") = "table",
    output: OutputOpt = None,
) -> None:
    """Compare two saved scans (e.g. before/after a torch upgrade) with the gate's rules."""
    from gbdoctor.gate import diff_reports
    from gbdoctor.report import render_gate
    from gbdoctor.report.json import load_scan_json

    _preflight(format, "diff", output)
    result = diff_reports(
        load_scan_json(old), load_scan_json(new), strict_improvements=strict_improvements
    )
    _emit(render_gate(result, format), output)
    raise typer.Exit(result.exit_code)


def _scan_with_progress(
    spec: Any, strategy: Any, dedupe: bool = True, recompiles: bool | None = None
) -> Any:
    from gbdoctor.scan import scan as run_scan

    with _ProgressBar() as bar:
        return run_scan(spec, strategy=strategy, dedupe=dedupe, progress=bar, recompiles=recompiles)


def _scan_torchtitan(name: str, args: list[str], set_: list[str] | None, *, dedupe: bool) -> Any:
    from gbdoctor.errors import SpecError
    from gbdoctor.scan.torchtitan import scan_torchtitan
    from gbdoctor.setup.torchtitan_native import DEFAULT_BATCH_SIZE, DEFAULT_SEQ_LEN, parse_run

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
    with _ProgressBar() as bar:
        return scan_torchtitan(run, dedupe=dedupe, progress=bar)


def main(args: list[str] | None = None) -> None:
    """Console-script entry point. SIGTERM (what CI sends on cancel or timeout) unwinds like
    Ctrl-C: children are stopped, and the exit status is 143 (130 for Ctrl-C)."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    app(args)


if __name__ == "__main__":
    main()
