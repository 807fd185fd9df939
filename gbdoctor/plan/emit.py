"""Emitters: a verified plan as a plan file, as plain PyTorch code, or as the code of the
framework it is for (each framework's ``emitters``: a torchtitan overlay + apply_compile,
DeepSpeed config and calls). All Python emitted is valid code (tests compile it, and run the
plain-PyTorch one on a model)."""

from __future__ import annotations

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.common.emit import emit_python
from gbdoctor.frameworks.registry import all_frameworks
from gbdoctor.plan.planner import dump_plan
from gbdoctor.records import Plan

_FRAMEWORK_EMITTERS = {
    name: emitter for framework in all_frameworks() for name, emitter in framework.emitters.items()
}
EMITTERS = ("json", *_FRAMEWORK_EMITTERS, "python")


def emit(plan: Plan, fmt: str) -> str:
    if fmt == "json":
        return dump_plan(plan)
    if fmt == "python":
        return emit_python(plan)
    if fmt in _FRAMEWORK_EMITTERS:
        return _FRAMEWORK_EMITTERS[fmt](plan)
    raise SpecError(f"unknown --emit-config {fmt!r}", hint=f"choose from {', '.join(EMITTERS)}")
