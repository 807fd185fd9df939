"""The shared options turned into library inputs: the spec with ``--set``, ``--simulate`` and
``--world-size`` applied, and the compile strategy from ``--strategy`` or ``--plan``."""

from __future__ import annotations

import importlib.machinery
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from gbdoctor.frameworks import Framework
    from gbdoctor.records import ScanReport, Spec


def load_spec_options(
    spec: Path,
    overrides: list[str] | None,
    *,
    simulate: bool = False,
    world_size: int | None = None,
) -> Spec:
    """The spec file with ``--set`` overrides; ``--simulate`` and ``--world-size`` are the
    ``[gbdoctor]`` keys they stand for, applied after the user's overrides."""
    from gbdoctor.spec import load_spec

    extra = ["gbdoctor.simulate=true"] if simulate else []
    extra += [f"gbdoctor.world_size={world_size}"] if world_size is not None else []
    return load_spec(spec, [*(overrides or ()), *extra])


def load_spec_args(
    args: list[str] | None,
    run: tuple[str, str] | None,
    overrides: list[str] | None,
    *,
    simulate: bool = False,
    world_size: int | None = None,
) -> Spec:
    """One spec from the command line: a TOML file (``args`` holds its path), or with a
    framework's run option (``run``: its flag and value, e.g. ``--torchtitan MODULE:CONFIG``) the
    run it names (``args``: that framework's own arguments, which the command passes through
    unparsed)."""
    if run is not None:
        from gbdoctor.frameworks.registry import spec_for_run

        flag, name = run
        return spec_for_run(
            flag,
            name,
            tuple(args or ()),
            tuple(overrides or ()),
            simulate=simulate,
            world_size=world_size,
        )
    return load_spec_options(spec_path(args), overrides, simulate=simulate, world_size=world_size)


def spec_path(args: list[str] | None) -> Path:
    """The one SPEC.toml of ``args``; an option-like leftover is a framework override given
    without the run it belongs to."""
    if not args or len(args) != 1 or args[0].startswith("-"):
        from gbdoctor.frameworks.registry import command_line_runs

        runs = " or ".join(r.flag for r in command_line_runs())
        options = [a for a in args or [] if a.startswith("-")]
        unknown = f"no such option: {' '.join(options)}; " if options else ""
        raise typer.BadParameter(
            f"{unknown}give one SPEC.toml (other options are a framework's own arguments: they "
            f"need {runs} and follow it)"
        )
    return Path(args[0])


def choose_strategy(
    spec: Spec, strategy: str | None, plan: Path | None, framework: Framework
) -> Any:
    """What the scan compiles with: a saved plan (``--plan``), a named preset (``--strategy``,
    checked against the presets of ``framework``, the spec's, as the command resolved it once
    for the strategy and the library), or None for the spec's own choice."""
    if plan is not None:
        if strategy is not None:
            raise typer.BadParameter("--plan and --strategy are mutually exclusive")
        from gbdoctor.plan import plan_strategy, read_plan

        loaded_plan, identity = read_plan(plan)
        return plan_strategy(loaded_plan, spec, identity=identity)
    if strategy is not None:
        presets: Collection[str] = framework.strategies
        if strategy not in presets:
            raise typer.BadParameter(
                f"unknown strategy {strategy!r}; choose from {', '.join(presets)}"
            )
    return strategy


def read_priced_scan(path: Path) -> ScanReport:
    """A ``gbdoctor price -f json`` output (a scan report with prices), for ``--price FILE``."""
    from gbdoctor.errors import BaselineError
    from gbdoctor.report.json import load_scan_json

    report = load_scan_json(path)
    if report.price is None:
        raise BaselineError(
            f"{path}: a scan without prices",
            hint="give the JSON output of `gbdoctor price SPEC -f json -o FILE`",
        )
    return report


@dataclass(frozen=True)
class ModelCode:
    """A file the spec's model imports, or (``tree``) a directory all of whose files may be."""

    path: Path
    tree: bool = False

    def holds(self, file: Path) -> bool:
        """``file`` (resolved) is code inside this tree: a module, stub, bytecode or extension
        (a report a user keeps in the package folder is not code, and may be rewritten)."""
        return file.is_relative_to(self.path) and file.suffix in _CODE_SUFFIXES


_CODE_SUFFIXES = frozenset((*importlib.machinery.all_suffixes(), ".pyi", ".pth"))


def model_code(spec: Spec) -> tuple[ModelCode, ...]:
    """What a spec's factory imports, found without importing it: a factory file, the ``.py``
    files beside it (it may import its siblings: ``models.custom`` puts its folder on
    ``sys.path``) and the outermost package around it; a factory module's top-level package
    (its whole tree) or module file. Empty for a built-in model."""
    import importlib.util

    factory = spec.model.factory
    if not factory:
        return ()
    target = factory.rpartition(":")[0]
    if target.endswith(".py") or "/" in target or os.sep in target:
        file = Path(os.path.realpath(target))
        found = [ModelCode(file), *(ModelCode(p) for p in _siblings(file.parent))]
        package = file.parent
        while (package.parent / "__init__.py").is_file() and package.parent != package:
            package = package.parent
        if (package / "__init__.py").is_file():
            found.append(ModelCode(package, tree=True))
        return tuple(found)
    try:
        # A top-level name only: finding it imports nothing (a dotted one imports its parents).
        found_spec = importlib.util.find_spec(target.split(".")[0])
    except (ImportError, ValueError):
        return ()
    if found_spec is None:
        return ()
    if found_spec.submodule_search_locations:
        return tuple(
            ModelCode(Path(os.path.realpath(p)), tree=True)
            for p in found_spec.submodule_search_locations
        )
    return (ModelCode(Path(os.path.realpath(found_spec.origin))),) if found_spec.origin else ()


def _siblings(folder: Path) -> list[Path]:
    try:
        return [Path(os.path.realpath(p)) for p in folder.glob("*.py")]
    except OSError:
        return []
