"""The ``gbdoctor`` command line: a thin typer app over the library API.

Each command parses, calls the library, renders and returns an exit code. Errors from the
library (``GbdoctorError``) become one line ``Error: ...`` plus ``Hint: ...`` on stderr and the
documented exit code; ``--debug`` (or ``GBDOCTOR_DEBUG=1``) adds the traceback.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from gbdoctor.errors import DEBUG_ENV, ExitCode, GbdoctorError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors")]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Exit 1 when any break, event or error is found")
]


def _debug_enabled(debug: bool) -> bool:
    return debug or os.environ.get(DEBUG_ENV) == "1"


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


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map library errors to one line and an exit code (traceback only with --debug)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = _debug_enabled(bool(kwargs.get("debug")))
        try:
            with _debug_env(debug):
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.BadParameter):
            raise
        except GbdoctorError as exc:
            if debug:
                err_console.print(traceback.format_exc(), markup=False, highlight=False)
                remote = getattr(exc, "remote_traceback", None)
                if remote:
                    err_console.print(remote, markup=False, highlight=False)
            err_console.print(f"Error: {exc.message}", markup=False, highlight=False)
            if exc.hint:
                err_console.print(f"Hint: {exc.hint}", markup=False, highlight=False)
            raise typer.Exit(int(exc.exit_code)) from None
        except KeyboardInterrupt:
            err_console.print("Interrupted.")
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 - last line of defence: no raw traceback
            if debug:
                err_console.print(traceback.format_exc(), markup=False, highlight=False)
            first = (str(exc).strip().splitlines() or [""])[0]
            err_console.print(
                f"Error: internal error: {type(exc).__name__}: {first}",
                markup=False,
                highlight=False,
            )
            err_console.print(
                "Hint: rerun with --debug and report the traceback", markup=False, highlight=False
            )
            raise typer.Exit(int(ExitCode.ENVIRONMENT)) from None

    return wrapper


def _load(spec: Path, overrides: list[str] | None) -> Any:
    from gbdoctor.spec import load_spec

    return load_spec(spec, overrides or ())


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        err_console.print(f"wrote {output}")


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


@app.command()
@handle_errors
def scan(
    spec: SpecArg,
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="Scan with a gbdoctor plan.json applied")
    ] = None,
    format: Annotated[
        str, typer.Option("--format", "-f", help="table|json|markdown|junit|github")
    ] = "table",
    output: OutputOpt = None,
    strict: StrictOpt = False,
    simulate: Annotated[
        bool, typer.Option("--simulate", help="Meta tensors + fake process group")
    ] = False,
    no_dedupe: Annotated[
        bool, typer.Option("--no-dedupe", help="Capture every layer, not one per kind")
    ] = False,
    debug: DebugOpt = False,
) -> None:
    """Capture every graph break of every block under the spec's training setup."""
    from gbdoctor.report import render
    from gbdoctor.summary import has_findings

    loaded = _load(spec, (set_ or []) + (["gbdoctor.simulate=true"] if simulate else []))
    report = _scan_with_progress(loaded, _strategy(loaded, strategy, plan), dedupe=not no_dedupe)
    _emit(render(report, format), output)
    if strict and has_findings(report):
        raise typer.Exit(int(ExitCode.FINDINGS))


def _strategy(spec: Any, strategy: str | None, plan: Path | None) -> Any:
    if plan is not None:
        if strategy is not None:
            raise typer.BadParameter("--plan and --strategy are mutually exclusive")
        from gbdoctor.plan import load_plan, plan_strategy

        return plan_strategy(load_plan(plan), spec)
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
    format: Annotated[str, typer.Option("--format", "-f", help="table|json")] = "table",
    output: OutputOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Show the model as set up: AC wrappers, compiled regions, FSDP sharding, hooks."""
    from gbdoctor.report.inspect import render_inspect
    from gbdoctor.scan.inspect import inspect_spec

    loaded = _load(spec, set_)
    with contextlib.redirect_stdout(sys.stderr):
        report = inspect_spec(loaded, strategy=_strategy(loaded, strategy, None))
    _emit(render_inspect(report, format), output)


@app.command()
@handle_errors
def causes(
    cause_id: Annotated[str | None, typer.Argument(help="Explain one cause id")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="table|json")] = "table",
    debug: DebugOpt = False,
) -> None:
    """List the cause ids gbdoctor classifies breaks into, or explain one."""
    from gbdoctor.report.causes_table import render_causes

    _emit(render_causes(cause_id, format), None)


@app.command()
@handle_errors
def plan(
    spec: SpecArg,
    set_: SetOpt = None,
    emit_config: Annotated[
        str | None, typer.Option("--emit-config", help="json|torchtitan|deepspeed|python")
    ] = None,
    output: OutputOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Propose a per-block compile/wrapping plan, verify it by re-scanning, emit it.

    Exit 1 when some block kind could not be verified (it is then left out of emitted code)."""
    from gbdoctor.plan import propose_plan
    from gbdoctor.plan.emit import EMITTERS, emit
    from gbdoctor.report.plan_table import render_plan_table

    if emit_config is not None and emit_config not in EMITTERS:
        raise typer.BadParameter(f"--emit-config must be one of {', '.join(EMITTERS)}")
    loaded = _load(spec, set_)
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
            help="Comma-separated subset of eager,titan-v0.2.0,titan-v0.2.2,block-fullgraph,plan",
        ),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", help="Measured steps per mode")] = 5,
    warmup: Annotated[
        int, typer.Option("--warmup", help="Warm-up steps per mode (compile happens here)")
    ] = 2,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend", help="inductor|aot_eager (default: aot_eager on CPU, inductor on CUDA)"
        ),
    ] = None,
    plan_file: Annotated[
        Path | None, typer.Option("--plan", help="A gbdoctor plan.json: adds the 'plan' mode")
    ] = None,
    nproc: Annotated[
        int | None, typer.Option("--nproc", help="Ranks (must match the spec's world size)")
    ] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="table|json|markdown")] = "table",
    csv: Annotated[
        Path | None, typer.Option("--csv", help="Also write one CSV row per mode")
    ] = None,
    output: OutputOpt = None,
    strict: StrictOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Train for real under eager, the torchtitan baselines and the plan; compare throughput."""
    from gbdoctor.report.run_formats import render_run, write_csv
    from gbdoctor.run import run_modes

    loaded = _load(spec, set_)
    chosen = [m.strip() for m in modes.split(",") if m.strip()] if modes else None
    with _ProgressBar() as bar:
        report = run_modes(
            loaded,
            modes=chosen,
            steps=steps,
            warmup=warmup,
            backend=backend,
            plan_path=str(plan_file) if plan_file else None,
            nproc=nproc,
            progress=bar,
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
        bool, typer.Option("--recompiles", help="Also fail when a kind's graph count rises")
    ] = False,
    set_: SetOpt = None,
    strategy: StrategyOpt = None,
    format: Annotated[
        str, typer.Option("--format", "-f", help="table|json|markdown|junit|github")
    ] = "table",
    output: OutputOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Pre-merge check: exit 1 when graph breaks, new causes or eager fallbacks appear."""
    from gbdoctor.gate import (
        baseline_from_reports,
        check_gate,
        dump_baseline,
        load_baseline,
        merge_baselines,
    )
    from gbdoctor.report import render_gate
    from gbdoctor.report.json import load_scan_json

    if not specs and not scan_json:
        raise typer.BadParameter("give at least one SPEC or --scan FILE")
    reports = [load_scan_json(path) for path in scan_json or []]
    for spec in specs or []:
        loaded = _load(spec, set_)
        reports.append(_scan_with_progress(loaded, _strategy(loaded, strategy, None)))
    if update_baseline:
        old = load_baseline(baseline) if baseline.exists() else None
        baseline.write_text(dump_baseline(merge_baselines(old, baseline_from_reports(reports))))
        err_console.print(f"baseline written: {baseline}")
        return
    result = check_gate(
        reports,
        load_baseline(baseline),
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
    format: Annotated[
        str, typer.Option("--format", "-f", help="table|json|markdown|junit|github")
    ] = "table",
    output: OutputOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Compare two saved scans (e.g. before/after a torch upgrade) with the gate's rules."""
    from gbdoctor.gate import diff_reports
    from gbdoctor.report import render_gate
    from gbdoctor.report.json import load_scan_json

    result = diff_reports(
        load_scan_json(old), load_scan_json(new), strict_improvements=strict_improvements
    )
    _emit(render_gate(result, format), output)
    raise typer.Exit(result.exit_code)


def _scan_with_progress(spec: Any, strategy: Any, dedupe: bool = True) -> Any:
    from gbdoctor.scan import scan as run_scan

    with _ProgressBar() as bar:
        return run_scan(spec, strategy=strategy, dedupe=dedupe, progress=bar)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
