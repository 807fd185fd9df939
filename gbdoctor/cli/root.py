"""The typer app: one-line usage errors, the app's own options (``--version``, ``--debug``),
every command registered in the order ``gbdoctor --help`` lists them, and ``main``."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Protocol, cast

import typer
from typer.core import TyperGroup

from gbdoctor.cli.causes import causes
from gbdoctor.cli.diff import diff
from gbdoctor.cli.exits import (
    Terminated,
    app_debug,
    handle_errors,
    install_signal_handlers,
    no_empty_cache_dirs,
    signal_exit,
    sigterm_unreported,
)
from gbdoctor.cli.gate import gate
from gbdoctor.cli.inspect import inspect
from gbdoctor.cli.options import with_registry_runs
from gbdoctor.cli.output import say
from gbdoctor.cli.plan import plan
from gbdoctor.cli.price import price
from gbdoctor.cli.report import report
from gbdoctor.cli.run import run
from gbdoctor.cli.scan import scan
from gbdoctor.cli.timeline import timeline
from gbdoctor.contain import adopt_orphans, end_now, end_process

# typer vendors click (``typer._click``) in recent releases and uses the real package in older
# ones: find click's base exception through a public class instead of importing either.
_ClickException: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


class _UsageError(Protocol):
    """What ``_OneLineErrors`` uses of a click exception (its type is found at run time)."""

    exit_code: int

    def show(self) -> None: ...


class _OneLineErrors(TyperGroup):
    """Usage errors (unknown option, bad value) as click's plain ``Error: ...`` line instead of
    typer's rich box, which wraps the message over several lines."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(
                args,
                prog_name,
                complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
        except _ClickException as exc:
            if not standalone_mode:
                raise
            usage_error = cast(_UsageError, exc)
            usage_error.show()
            if getattr(exc, "option_name", None) == "--debug":
                say("Hint: --debug is an option of gbdoctor itself: gbdoctor --debug COMMAND ...")
            sys.exit(usage_error.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            say("Aborted.")
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


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        import torch

        from gbdoctor.frameworks.torchtitan.config import (
            TORCHTITAN_VERSIONS_TESTED,
            torchtitan_version,
        )
        from gbdoctor.torch_compat import TESTED, supported_range

        try:
            own = version("gbdoctor")
        except PackageNotFoundError:
            own = "(not installed)"
        titan = torchtitan_version() or "not installed"
        typer.echo(
            f"gbdoctor {own}\n"
            f"torch {torch.__version__} (supported: {supported_range()}; tested: {', '.join(TESTED)})\n"
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
    app_debug[0] = debug


# ``--torchtitan MODULE:CONFIG`` passes torchtitan's own --section.key options through, on
# every command that takes a spec.
_SPEC_COMMANDS = (scan, inspect, plan, run, gate)
for _command in (scan, inspect, causes, plan, run, price, timeline, gate, diff, report):
    if _command in _SPEC_COMMANDS:
        app.command(context_settings={"ignore_unknown_options": True})(
            handle_errors(with_registry_runs(_command))
        )
        continue
    app.command()(handle_errors(_command))


def _without_local_rank(args: list[str]) -> list[str]:
    """The DeepSpeed launcher puts ``--local_rank=N`` before the command's own arguments (unless
    ``--no_local_rank``); the rank is read from the environment, so the option is dropped."""
    if args and args[0].startswith(("--local_rank=", "--local-rank=")):
        return args[1:]
    return args


def main(args: list[str] | None = None) -> None:
    """Console-script entry point. SIGTERM (what CI sends on cancel or timeout) unwinds like
    Ctrl-C: children are stopped, and the exit status is 143 (130 for Ctrl-C).

    Started by a launcher (torchrun, deepspeed, srun: docs/launchers.md), every process joins
    its process group: rank 0 runs the command, the others run its jobs, all exit alike."""
    install_signal_handlers()
    adopt_orphans()  # a process user code forks is ended with the command (contain.py)
    from gbdoctor.errors import GbdoctorError
    from gbdoctor.launcher import detect

    session = None
    try:
        found = detect()
        if found is not None:  # torch is imported only here: `diff`, `causes` do without it
            from gbdoctor.setup import launched

            session = launched.join(found)
    except GbdoctorError as exc:
        say(f"Error: {exc.message}")
        if exc.hint:
            say(f"Hint: {exc.hint}")
        sys.exit(int(exc.exit_code))
    except Terminated:  # while waiting for the launcher's other ranks (setup/rendezvous.py)
        end_now(signal_exit(signal.SIGTERM))
    except KeyboardInterrupt:
        end_now(signal_exit(signal.SIGINT))
    if session is not None and session.rank != 0:
        launched.serve(session)
    if session is not None:
        args = _without_local_rank(sys.argv[1:] if args is None else args)

    def command() -> None:
        with no_empty_cache_dirs():
            app(args)

    if session is not None:
        launched.lead(session, command)
    code = _run_to_the_end(command)
    try:
        end_process(code, on_signal=signal_exit)
    except Terminated:  # arrived before end_process took the signals over
        end_now(signal_exit(signal.SIGTERM))
    except KeyboardInterrupt:
        end_now(signal_exit(signal.SIGINT))


def _run_to_the_end(command: Callable[[], None]) -> int:
    """The command's exit status, also when a signal arrives outside its error handling
    (while arguments are parsed, or as it returns): one line, never a traceback."""
    try:
        command()
    except SystemExit as exc:
        if sigterm_unreported():
            return signal_exit(signal.SIGTERM)
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        say(str(exc.code))
        return 1
    except Terminated:
        return signal_exit(signal.SIGTERM)
    except KeyboardInterrupt:
        return signal_exit(signal.SIGINT)
    return signal_exit(signal.SIGTERM) if sigterm_unreported() else 0
