"""Emitters: a verified plan as a plan file, as plain PyTorch code, or as the code of the
framework it is for (each framework's ``emitters``: a torchtitan overlay + apply_compile,
DeepSpeed config and calls). All Python emitted is valid code (tests compile it, and run the
plain-PyTorch one on a model)."""

from __future__ import annotations

from collections.abc import Callable

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.common.emit import emit_python
from gbdoctor.frameworks.registry import all_frameworks, emitters_of, framework_named
from gbdoctor.plan.planner import dump_plan
from gbdoctor.records import Plan

# Two frameworks may offer a format under one name (both torchtitans emit "torchtitan"): the
# plan's own framework's emitter is used, else the first framework's that offers it.
_FRAMEWORK_EMITTERS: dict[str, Callable[[Plan], str]] = {}
for _framework in all_frameworks():
    for _name, _emitter in emitters_of(_framework).items():
        _FRAMEWORK_EMITTERS.setdefault(_name, _emitter)
EMITTERS = ("json", *_FRAMEWORK_EMITTERS, "python")


def emit(plan: Plan, fmt: str) -> str:
    if fmt == "json":
        return dump_plan(plan)
    if fmt == "python":
        return emit_python(plan)
    own = emitters_of(framework_named(plan.framework))
    if fmt in own:
        return own[fmt](plan)
    if fmt in _FRAMEWORK_EMITTERS:
        return _FRAMEWORK_EMITTERS[fmt](plan)
    raise SpecError(f"unknown --emit-config {fmt!r}", hint=f"choose from {', '.join(EMITTERS)}")
