"""Framework name -> framework (``[gbdoctor] framework``, ``Plan.framework``).

Frameworks are plug-ins found through the ``gbdoctor.frameworks`` entry-point group: an
installed distribution registers one with ``[project.entry-points."gbdoctor.frameworks"]
NAME = "package.module:Class"`` (``docs/plugins.md``), and gbdoctor's built-ins register the same
way in its own ``pyproject.toml``. They are loaded on first use, built-ins first in the order
messages list them (the first is the default), then the others by name. Each is checked as it
loads: it imports, declares the :data:`~interface.PLUGIN_API_VERSION` it was written for,
implements the core :class:`~interface.Framework` and is registered under its own name; else
``PluginError`` (exit 2) names the plug-in and the fix.

A source checkout whose installed metadata predates an entry point (a built-in added since the
last ``pip install -e .``) still has every built-in: those the metadata lacks are loaded from
:data:`BUILTIN_ENTRY_POINTS`, which ``tests/frameworks/registry/test_framework_plugin.py``
keeps equal to ``pyproject.toml``'s.

Framework objects are light: they import torch and their framework's packages when first used,
so spec loading stays free of them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from gbdoctor.causes.contributions import CauseKnowledge, Taxonomy, combine
from gbdoctor.causes.hooks import NO_FRAMEWORK_HOOKS, FrameworkHooks
from gbdoctor.errors import PluginError, SpecError, first_line
from gbdoctor.frameworks.interface import (
    PLUGIN_API_VERSION,
    CauseContributor,
    Emitter,
    Framework,
    HasEmitters,
    HasRunModes,
    MetaModelBuilder,
    OwnHookLibrary,
    OwnPipeline,
    Planner,
    RegistryRuns,
    RunModes,
    Simulation,
    ZeroStages,
)
from gbdoctor.records import Spec

ENTRY_POINT_GROUP = "gbdoctor.frameworks"

BUILTIN_ENTRY_POINTS: tuple[tuple[str, str], ...] = (
    ("torchtitan", "gbdoctor.frameworks.torchtitan_v02:TorchtitanV02"),
    ("deepspeed", "gbdoctor.frameworks.deepspeed:DeepSpeed"),
    ("torchtitan-installed", "gbdoctor.frameworks.torchtitan:InstalledTorchtitan"),
    ("accelerate", "gbdoctor.frameworks.accelerate:Accelerate"),
)
"""gbdoctor's own entry points (name, ``module:attribute``), in the order messages list them."""

_OWN_DISTRIBUTION = "gbdoctor"

_REGISTRY: dict[str, Framework] = {}
_loaded = False

F = TypeVar("F", bound=Framework)


@dataclass(frozen=True)
class PluginSource:
    """Where a framework plug-in comes from: its entry point and the distribution that has it."""

    name: str
    value: str
    distribution: str

    def load_object(self) -> object:
        module_name, _, attribute = self.value.partition(":")
        obj: object = importlib.import_module(module_name)
        for part in attribute.split(".") if attribute else ():
            obj = getattr(obj, part)
        return obj


def register(framework: F) -> F:
    """Add ``framework`` under its ``name`` (a later registration of the name replaces it)."""
    _frameworks()
    _REGISTRY[framework.name] = framework
    return framework


def _discovered() -> list[PluginSource]:
    """The ``gbdoctor.frameworks`` entry points installed, one per (name, value)."""
    seen: dict[tuple[str, str], PluginSource] = {}
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = entry.dist.name if entry.dist is not None else "an unknown distribution"
        seen.setdefault((entry.name, entry.value), PluginSource(entry.name, entry.value, dist))
    return list(seen.values())


def plugin_sources(discovered: Sequence[PluginSource] | None = None) -> list[PluginSource]:
    """Every framework to load, in registry order: the built-ins (from the installed metadata,
    or from :data:`BUILTIN_ENTRY_POINTS` where it lacks them), then the others by name."""
    found = _discovered() if discovered is None else list(discovered)
    builtin_names = [name for name, _ in BUILTIN_ENTRY_POINTS]
    sources = [
        next(
            (s for s in found if s.name == name and s.value == value),
            PluginSource(name, value, _OWN_DISTRIBUTION),
        )
        for name, value in BUILTIN_ENTRY_POINTS
    ]
    builtin_values = set(BUILTIN_ENTRY_POINTS)
    others = sorted(
        (s for s in found if (s.name, s.value) not in builtin_values),
        key=lambda s: (s.name, s.distribution, s.value),
    )
    for source in others:
        if source.name in builtin_names or sum(s.name == source.name for s in others) > 1:
            owners = [s.distribution for s in (*sources, *others) if s.name == source.name]
            raise PluginError(
                f"framework plug-in {source.name!r} is registered twice "
                f"(by {' and '.join(dict.fromkeys(owners))})",
                hint="uninstall one of the distributions",
            )
    return sources + others


def load_plugin(source: PluginSource) -> Framework:
    """The framework of one entry point, checked: it imports, its API version is this
    gbdoctor's, it implements the core interface and carries the entry point's name."""
    where = f"framework plug-in {source.name!r} ({source.value}, from {source.distribution})"
    fix = f"reinstall {source.distribution}, or uninstall it"
    try:
        obj = source.load_object()
        # The entry point names the framework's class (or a factory of no arguments).
        framework = obj() if callable(obj) else obj
    except Exception as exc:  # noqa: BLE001 - any failure of third-party code is one line
        message = f"{where} cannot be loaded: {type(exc).__name__}: {first_line(exc)}"
        raise PluginError(message, fix) from exc
    version = getattr(framework, "api_version", None)
    if version != PLUGIN_API_VERSION:
        declared = "declares no api_version" if version is None else f"is for API {version!r}"
        raise PluginError(
            f"{where} {declared}; this gbdoctor supports plug-in API {PLUGIN_API_VERSION}",
            f"install a release of {source.distribution} written for plug-in API "
            f"{PLUGIN_API_VERSION}, or the gbdoctor it was written for",
        )
    missing = ", ".join(m for m in core_members() if not _has_member(framework, m))
    if missing:
        raise PluginError(
            f"{where} does not implement gbdoctor.frameworks.interface.Framework: it lacks "
            + missing,
            fix,
        )
    framework = cast(Framework, framework)  # every core member is there (read statically)
    if framework.name != source.name:
        raise PluginError(
            f"{where} is named {framework.name!r}, not its entry point's name",
            f"name the entry point {framework.name!r} in {source.distribution}'s metadata",
        )
    return framework


def _has_member(obj: object, name: str) -> bool:
    """``obj`` has ``name``, read without running a property (a lazy one imports torch)."""
    try:
        inspect.getattr_static(obj, name)
    except AttributeError:
        return False
    return True


def core_members() -> tuple[str, ...]:
    """The members every framework has (:class:`~interface.Framework`), in declaration order."""
    names = [*Framework.__annotations__]
    names += [n for n in vars(Framework) if not n.startswith("_") and n not in names]
    return tuple(names)


def _frameworks() -> dict[str, Framework]:
    global _loaded
    if not _loaded:
        _loaded = True
        try:
            loaded = [load_plugin(source) for source in plugin_sources()]
        except BaseException:
            _loaded = False  # the next call reports it again, not an empty registry
            raise
        # Registrations made before the first load (``register``) stay, after the plug-ins.
        earlier = dict(_REGISTRY)
        _REGISTRY.clear()
        _REGISTRY.update({f.name: f for f in loaded})
        _REGISTRY.update(earlier)
    return _REGISTRY


def framework_names() -> tuple[str, ...]:
    """Every registered framework's name, the default first."""
    return tuple(_frameworks())


def default_framework() -> Framework:
    return next(iter(_frameworks().values()))


def framework_named(name: str) -> Framework:
    """The framework called ``name``; SpecError (exit 2) for an unknown one."""
    frameworks = _frameworks()
    try:
        return frameworks[name]
    except KeyError:
        raise SpecError(
            f"{name!r} is not a training framework gbdoctor knows",
            hint=f"choose one of: {', '.join(frameworks)}",
        ) from None


def framework_for(spec: Spec) -> Framework:
    """The framework that sets ``spec`` up (``[gbdoctor] framework``)."""
    return framework_named(spec.gbdoctor.framework)


def registry_run_frameworks() -> tuple[RegistryRuns, ...]:
    """The frameworks that name runs by their own config registry (a ``flag`` on commands)."""
    return tuple(f for f in _frameworks().values() if isinstance(f, RegistryRuns))


def cause_taxonomy() -> Taxonomy:
    """The whole cause taxonomy: the generic one with every framework's additions
    (:class:`~interface.CauseContributor`), in registry order. Read by reports too: when a
    plug-in cannot load, the built-ins' (as :func:`command_line_runs` does), so that reading a
    result never fails on a plug-in; a contribution that contradicts the taxonomy is the
    plug-in's error (exit 2)."""
    try:
        frameworks = all_frameworks()
    except PluginError:
        own = (PluginSource(name, value, _OWN_DISTRIBUTION) for name, value in BUILTIN_ENTRY_POINTS)
        frameworks = tuple(load_plugin(source) for source in own)
    added: list[CauseKnowledge] = []
    for framework in frameworks:
        if isinstance(framework, CauseContributor):
            try:
                combine((*added, framework.cause_knowledge))
            except ValueError as exc:
                raise PluginError(
                    f"framework plug-in {framework.name!r} adds to the cause taxonomy what "
                    f"contradicts it: {exc}",
                    "fix its cause_knowledge, or uninstall it",
                ) from None
            added.append(framework.cause_knowledge)
    return combine(added)


def command_line_runs() -> tuple[RegistryRuns, ...]:
    """The frameworks whose ``flag`` every command that takes a spec offers (each with
    :class:`~interface.RegistryRuns`), in registry order. Read as the command line is built: when
    a plug-in cannot load, the built-ins' answer, and the command reports the plug-in in one
    line as soon as it reads frameworks."""
    try:
        frameworks = all_frameworks()
    except PluginError:
        own = (PluginSource(name, value, _OWN_DISTRIBUTION) for name, value in BUILTIN_ENTRY_POINTS)
        frameworks = tuple(load_plugin(source) for source in own)
    return tuple(f for f in frameworks if isinstance(f, RegistryRuns))


def spec_for_run(
    flag: str,
    name: str,
    args: Sequence[str],
    overrides: Sequence[str] = (),
    *,
    simulate: bool = False,
    world_size: int | None = None,
) -> Spec:
    """The spec of a run named on the command line by a framework's own option (``flag``, e.g.
    ``--torchtitan MODULE:CONFIG``) with that framework's overrides (``args``), ``--set``
    capture settings (``overrides``) and ``simulate``/``world_size`` (which it may refuse)."""
    for framework in registry_run_frameworks():
        if framework.flag == flag:
            return framework.spec_for_run(
                name, args, overrides, simulate=simulate, world_size=world_size
            )
    raise SpecError(f"no training framework is named by {flag}")


def all_frameworks() -> tuple[Framework, ...]:
    return tuple(_frameworks().values())


# ------------------------------------------------------------------ optional capabilities


def can_simulate(framework: Framework) -> bool:
    """Whether a spec of ``framework`` too large for local ranks may be simulated."""
    return isinstance(framework, Simulation) and framework.simulates


def runs_own_pipeline(framework: Framework) -> bool:
    """Whether ``framework`` runs pipeline parallelism through its own pipeline code."""
    return isinstance(framework, OwnPipeline) and framework.own_pipeline


def meta_model(framework: Framework, spec: Spec) -> Any:
    """``spec``'s model on the meta device (nothing allocated), for memory estimates and FLOP
    counts: built by ``framework`` where it builds its own models (:class:`MetaModelBuilder`,
    the installed torchtitan), else by ``models.build_model`` at the spec's training length."""
    if isinstance(framework, MetaModelBuilder):
        return framework.meta_model(spec)
    from gbdoctor.models import build_model

    return build_model(spec.model, device="meta", max_seq_len=spec.training.seq_len)


def planner_of(framework: Framework, command: str = "plan") -> Planner:
    """``framework``'s planner; SpecError (exit 2) for a framework without one."""
    if not isinstance(framework, Planner):
        raise SpecError(
            f"framework '{framework.name}' has no planner: `gbdoctor {command}` needs one",
            hint="scan the spec instead, or use a framework with a planner",
        )
    return framework


def run_modes_of(framework: Framework) -> RunModes:
    """What ``run`` measures for ``framework``; SpecError (exit 2) for one without run modes."""
    if not isinstance(framework, HasRunModes):
        raise SpecError(
            f"framework '{framework.name}' has no run modes: `gbdoctor run` cannot train it",
            hint="scan the spec instead, or use a framework with run modes",
        )
    return framework.run_modes


def hooks_of(framework: Framework) -> FrameworkHooks:
    """Where ``framework``'s own library hooks the model (none without the capability)."""
    return framework.hook_library if isinstance(framework, OwnHookLibrary) else NO_FRAMEWORK_HOOKS


def zero_stage_of(framework: Framework, spec: Spec) -> int | None:
    """The ZeRO stage ``spec`` sets up under ``framework`` (None without the capability)."""
    return framework.zero_stage(spec) if isinstance(framework, ZeroStages) else None


def emitters_of(framework: Framework) -> Mapping[str, Emitter]:
    """The ``plan --emit-config`` formats ``framework`` adds (none without the capability)."""
    return framework.emitters if isinstance(framework, HasEmitters) else {}
