"""Error hierarchy and exit codes.

Library code raises these; only the CLI (``cli.exits.handle_errors``) maps them to an exit code
and a one-line message (``Error: ...`` plus ``Hint: ...``). Findings (exit 1) and failures (2, 3)
never share a code.
"""

from __future__ import annotations

from enum import IntEnum

DEBUG_ENV = "GBDOCTOR_DEBUG"
"""``GBDOCTOR_DEBUG=1`` (set by ``--debug``, inherited by spawned ranks): tracebacks on stderr."""


class ExitCode(IntEnum):
    OK = 0
    FINDINGS = 1  # gate failed, or --strict found breaks/events/errors
    BAD_INPUT = 2  # spec, override, factory, baseline, usage
    ENVIRONMENT = 3  # process group, worker crash or timeout, unsupported torch


class GbdoctorError(Exception):
    """Base class: ``message`` names the problem, ``hint`` names the fix."""

    exit_code: ExitCode = ExitCode.ENVIRONMENT

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class SpecError(GbdoctorError):
    """The spec file, an override or a model factory is wrong."""

    exit_code = ExitCode.BAD_INPUT


class BaselineError(GbdoctorError):
    """A baseline, plan or scan JSON file is missing or malformed."""

    exit_code = ExitCode.BAD_INPUT


class PluginError(GbdoctorError):
    """An installed framework plug-in cannot be used: it fails to import, was written for
    another plug-in API version, or does not implement the framework interface."""

    exit_code = ExitCode.BAD_INPUT


class SetupError(GbdoctorError):
    """The training setup (process group, sharding, workers) could not be built or run."""

    exit_code = ExitCode.ENVIRONMENT


class DeadlineError(SetupError):
    """Ranks had not finished when their job's time limit passed (``gbdoctor.timeout_s``)."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message; a line that ends with ``:`` (wrapped
    backend errors: "backend='inductor' raised:") gets the next line appended."""
    text = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    first = text[0] if text else ""
    if first.endswith(":") and len(text) > 1:
        first = f"{first} {text[1]}"
    return first


def exception_line(exc: BaseException, limit: int = 400) -> str:
    """``Type: first line`` of ``exc``, at most ``limit`` characters: how one-line errors and
    failure records quote an exception."""
    line = first_line(exc)
    text = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
