"""User code must not end the process: ``sys.exit()`` / ``os._exit()`` in a model become errors.

A spec runs user code (a custom model's module at import, its ``build(flavor)``, the model's
``forward`` and hooks). If that code called ``sys.exit(0)`` or ``os._exit(0)`` while gbdoctor ran
it in-process, ``scan`` and ``gate`` would end with exit status 0 and no output: a gate that
passes by accident. :func:`exits_guarded` turns both into :class:`UserCodeExit` (exit 3) naming
the call and the line that made it. No torch import here.

``os._exit`` cannot be intercepted when native code calls the C ``_exit``; multi-rank jobs still
catch that case, because a rank that ends without a result is reported (``setup.dist``).

It also says which factory targets a spec may name: a ``.py`` file, or an importable module of the
user's own that is neither the standard library nor an installed distribution, whose callable is
defined there (``stdlib_target``, ``installed_distribution``, ``defined_in``). docs/security.md
gives the threat model: a spec downloaded with a repository must not run a command by being
scanned, and every installed package's callables (``torch.utils.collect_env:run``,
``sympy:sympify``) are callables that take a string.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Iterator, Mapping
from importlib import metadata
from types import FrameType, TracebackType
from typing import Any

from gbdoctor.errors import ExitCode, GbdoctorError

__all__ = [
    "OWN_CODE_HINT",
    "TRUSTED_FACTORY_ENV",
    "UserCodeExit",
    "defined_in",
    "exits_guarded",
    "foreign_factory",
    "installed_distribution",
    "installed_file",
    "raised_at",
    "stdlib_file",
    "stdlib_target",
]

_STDLIB = os.path.normcase(sysconfig.get_paths()["stdlib"]) + os.sep
_PACKAGE = os.path.normcase(os.path.dirname(os.path.abspath(__file__))) + os.sep


class UserCodeExit(GbdoctorError):
    """User code (a model or its factory) tried to end the process."""

    exit_code = ExitCode.ENVIRONMENT


class _ExitCalled(BaseException):
    """Raised in place of ``os._exit`` while the guard is active (BaseException: user code's
    ``except Exception`` must not swallow it)."""

    def __init__(self, code: Any, where: str) -> None:
        super().__init__(code)
        self.code = code
        self.where = where


def _describe(filename: str, line: int, function: str) -> str:
    path = os.path.abspath(filename)
    cwd = os.getcwd() + os.sep
    shown = os.path.relpath(path, cwd) if path.startswith(cwd) else path
    return f"{shown}:{line} (in {function})"


def _user_frame(frames: list[tuple[str, int, str]]) -> str:
    """The innermost frame outside the standard library and gbdoctor (``exit()`` is defined in
    the stdlib's ``_sitebuiltins``); the innermost frame when there is none."""
    for filename, line, function in reversed(frames):
        if filename.startswith("<"):  # "<frozen _sitebuiltins>" (exit()), "<string>"
            continue
        norm = os.path.normcase(os.path.abspath(filename))
        if not norm.startswith(_STDLIB) and not norm.startswith(_PACKAGE):
            return _describe(filename, line, function)
    return _describe(*frames[-1]) if frames else "an unknown place"


def _traceback_frames(tb: TracebackType | None) -> list[tuple[str, int, str]]:
    out = []
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return out


def _stack_frames(frame: FrameType | None) -> list[tuple[str, int, str]]:
    out = []
    while frame is not None:
        out.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return out[::-1]


def raised_at(exc: BaseException) -> str:
    """Where user code raised ``exc``: its innermost frame outside the standard library and
    gbdoctor, as ``file:line (in function)``."""
    return _user_frame(_traceback_frames(exc.__traceback__))


_HINT = (
    "a model, its factory and its hooks must return or raise, never exit the process; "
    "gbdoctor fails instead of reporting a result it did not produce"
)


@contextlib.contextmanager
def exits_guarded() -> Iterator[None]:
    """Run the body with ``sys.exit``/``exit()``/``os._exit`` from user code raising
    :class:`UserCodeExit` (exit 3) that says where the code exited."""
    real_exit = os._exit

    def guarded_exit(code: int) -> None:  # what user code calls instead of os._exit
        raise _ExitCalled(code, _user_frame(_stack_frames(sys._getframe(1))))

    os._exit = guarded_exit  # type: ignore[assignment]
    try:
        yield
    except SystemExit as exc:
        where = _user_frame(_traceback_frames(exc.__traceback__))
        raise UserCodeExit(f"user code called sys.exit({exc.code!r}) at {where}", _HINT) from None
    except _ExitCalled as exc:
        raise UserCodeExit(
            f"user code called os._exit({exc.code!r}) at {exc.where}", _HINT
        ) from None
    finally:
        os._exit = real_exit  # type: ignore[assignment]


# --------------------------------------------------------------------------- factory targets

_REFUSED_MODULES = frozenset({"builtins", "__main__", "__future__"})


def stdlib_target(module: str) -> bool:
    """Whether a ``package.module`` factory target names the standard library or builtins.

    Those modules define no model, and ``os:system`` or ``builtins:exec`` would run the spec's
    ``flavor`` string as a command or as code, so a spec may not name them (issue #18)."""
    top = module.strip().split(".", 1)[0]
    return top in _REFUSED_MODULES or top in sys.stdlib_module_names


TRUSTED_FACTORY_ENV = "GBDOCTOR_TRUSTED_FACTORY_PACKAGES"
"""Comma-separated top-level packages of installed distributions whose callables a spec's
factory may name: the user's explicit opt-in, outside any spec (a spec cannot trust itself)."""


@functools.cache
def _site_directories() -> tuple[str, ...]:
    dirs = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    with contextlib.suppress(AttributeError):  # virtualenv's old site.py lacks both
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    return tuple(os.path.normcase(os.path.realpath(d)) + os.sep for d in sorted(dirs))


@functools.cache
def _distributions_by_package() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


def installed_distribution(module: str) -> str | None:
    """The installed distribution ``module``'s top-level package comes from, else None.

    Decided without importing anything: by the installed distributions' file lists, and by
    where the import system would load the package from (site-packages). A package the user
    opted into through ``GBDOCTOR_TRUSTED_FACTORY_PACKAGES`` counts as the user's own."""
    top = module.strip().split(".", 1)[0]
    if top in _trusted_packages():
        return None
    names = _distributions_by_package().get(top)
    if names:
        return names[0]
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: finds, imports nothing
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    if spec is not None and spec.origin:
        locations.append(spec.origin)
    for location in locations:
        real = os.path.normcase(os.path.realpath(location))
        if any(real.startswith(d) for d in _site_directories()):
            return top
    return None


def stdlib_file(path: str) -> bool:
    """Whether a factory file lies inside the standard library's directory."""
    return os.path.normcase(os.path.realpath(path)).startswith(
        os.path.normcase(os.path.realpath(_STDLIB))
    )


def installed_file(path: str) -> str | None:
    """The installed package a factory file belongs to (its top-level name under a
    site-packages directory: ``.../site-packages/torch/utils/collect_env.py`` is ``torch``),
    else None; a package trusted through ``GBDOCTOR_TRUSTED_FACTORY_PACKAGES`` is None."""
    real = os.path.normcase(os.path.realpath(path))
    for directory in _site_directories():
        if real.startswith(directory):
            top = real[len(directory) :].split(os.sep, 1)[0].removesuffix(".py")
            return None if top in _trusted_packages() else top
    return None


def _trusted_packages() -> set[str]:
    return {name.strip() for name in os.environ.get(TRUSTED_FACTORY_ENV, "").split(",")}


OWN_CODE_HINT = (
    "point the factory at your own file or package, which defines build(flavor) -> nn.Module"
)


def foreign_factory(target: str, *, is_path: bool) -> tuple[str, str] | None:
    """Why a factory target (a module name, or a resolved ``.py`` path) is not the user's own
    code, as (problem, hint: the problem a predicate, "names X, which ..."); None when it may
    be imported. Decided without importing
    anything from it, so the spec loader refuses it before any command runs code
    (docs/security.md): the standard library, builtins, or a module or file of an installed
    distribution the user did not trust explicitly."""
    if is_path and stdlib_file(target):
        return f"names {target!r}, which is part of the Python standard library", OWN_CODE_HINT
    if not is_path and stdlib_target(target):
        return (
            f"names the standard-library or builtin module {target!r}, not a model factory",
            OWN_CODE_HINT,
        )
    top = installed_file(target) if is_path else target.strip().split(".", 1)[0]
    package = top if is_path else installed_distribution(target)
    if top is None or package is None:
        return None
    package = _distributions_by_package().get(top, [package])[0]
    return (
        f"names {target!r}, which belongs to the installed package {package!r}, not to your "
        "model code; a "
        "spec may not run an installed package's callables (it would call one with the "
        "flavor string)",
        f"point the factory at your own file or package; if {top} is your model package, "
        f"trust it explicitly: {TRUSTED_FACTORY_ENV}={top}",
    )


def defined_in(obj: Any, module_name: str) -> bool:
    """Whether ``obj`` (a function, class or callable instance) was defined in ``module_name``
    or in another module of the same top-level package (``pkg:build`` re-exporting
    ``pkg.models.build`` is fine; a file that imports ``os.system`` as ``build`` is not)."""
    owner = getattr(obj, "__module__", None)
    if not isinstance(owner, str):
        return False
    return owner == module_name or owner.split(".", 1)[0] == module_name.split(".", 1)[0]
