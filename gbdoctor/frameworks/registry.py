"""Framework name -> framework (``[gbdoctor] framework``, ``Plan.framework``).

The built-in frameworks register here, in the order messages list them; a new framework adds
itself with :func:`register` (``docs/architecture.md``, "How to add a framework"). Framework
objects are light: they import torch and their framework's packages when first used, so spec
loading stays free of them.
"""

from __future__ import annotations

from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.interface import Framework

_REGISTRY: dict[str, Framework] = {}


def register(framework: Any) -> Any:
    """Add ``framework`` under its ``name`` (a later registration of the name replaces it)."""
    _REGISTRY[framework.name] = framework
    return framework


def _builtins() -> None:
    from gbdoctor.frameworks.accelerate import Accelerate
    from gbdoctor.frameworks.deepspeed import DeepSpeed
    from gbdoctor.frameworks.torchtitan import InstalledTorchtitan
    from gbdoctor.frameworks.torchtitan_v02 import TorchtitanV02

    register(TorchtitanV02())
    register(DeepSpeed())
    register(InstalledTorchtitan())
    register(Accelerate())


def framework_names() -> tuple[str, ...]:
    """Every registered framework's name, the default first."""
    return tuple(_REGISTRY)


def default_framework() -> Framework:
    return next(iter(_REGISTRY.values()))


def framework_named(name: str) -> Framework:
    """The framework called ``name``; SpecError (exit 2) for an unknown one."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise SpecError(
            f"{name!r} is not a training framework gbdoctor knows",
            hint=f"choose one of: {', '.join(_REGISTRY)}",
        ) from None


def framework_for(spec: Any) -> Framework:
    """The framework that sets ``spec`` up (``[gbdoctor] framework``)."""
    return framework_named(spec.gbdoctor.framework)


def spec_for_run(flag: str, name: str, args: Any, overrides: Any = (), **options: Any) -> Any:
    """The spec of a run named on the command line by a framework's own option (``flag``, e.g.
    ``--torchtitan MODULE:CONFIG``) with that framework's overrides (``args``), ``--set``
    capture settings (``overrides``) and ``simulate``/``world_size`` (which it may refuse)."""
    for framework in _REGISTRY.values():
        if getattr(framework, "flag", None) == flag:  # a framework that names runs so
            return framework.spec_for_run(name, args, overrides, **options)  # type: ignore[attr-defined]
    raise SpecError(f"no training framework is named by {flag}")


def all_frameworks() -> tuple[Framework, ...]:
    return tuple(_REGISTRY.values())


_builtins()
