"""Emitters: a verified plan as a plan file, as plain PyTorch code, or as the code of the
framework it is for (each framework's ``emitters``: a torchtitan overlay + apply_compile,
DeepSpeed config and calls). All Python emitted is valid code (tests compile it, and run the
plain-PyTorch one on a model)."""

from __future__ import annotations

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.common.emit import emit_python
from gbdoctor.frameworks.registry import all_frameworks, framework_named
from gbdoctor.plan.planner import dump_plan
from gbdoctor.records import Plan

# Two frameworks may offer a format under one name (both torchtitans emit "torchtitan"): the
# plan's own framework's emitter is the one used.
EMITTERS = tuple(
    dict.fromkeys(
        ["json", *(name for framework in all_frameworks() for name in framework.emitters), "python"]
    )
)


def emit(plan: Plan, fmt: str) -> str:
    if fmt == "json":
        return dump_plan(plan)
    if fmt == "python":
        return emit_python(plan)
    own = framework_named(plan.framework)
    if fmt in own.emitters:
        return own.emitters[fmt](plan)
    if fmt in EMITTERS:
        raise SpecError(
            f"--emit-config {fmt} is not for {own.title} plans",
            hint=f"choose from {', '.join(['json', *own.emitters, 'python'])}",
        )
    raise SpecError(f"unknown --emit-config {fmt!r}", hint=f"choose from {', '.join(EMITTERS)}")
