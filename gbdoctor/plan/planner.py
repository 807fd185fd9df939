"""``plan``: propose a compile plan for a spec and prove it by re-scanning (the spec's
framework's planner, ``Framework.propose_plan``), apply a plan (``Framework.plan_strategy``),
and read and write plan files.

Real or simulated is decided once here (``scan.estimate.decide``, as for ``scan``) and kept, so
every verification re-scan runs the same way: a simulated plan is verified by simulated
re-scans.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from gbdoctor.errors import BaselineError, SpecError
from gbdoctor.frameworks.interface import Planner
from gbdoctor.frameworks.registry import (
    all_frameworks,
    can_simulate,
    framework_for,
    framework_named,
    framework_names,
    planner_of,
)
from gbdoctor.records import (
    PLAN_SCHEMA_VERSION,
    READABLE_PLAN_SCHEMA_VERSIONS,
    Plan,
    ScanReport,
    Spec,
)
from gbdoctor.records.io import (
    check_schema_version,
    dumps,
    load_record,
    parse_json_object,
    read_text,
)


def propose_plan(
    spec: Spec,
    *,
    scan_fn: Callable[..., ScanReport] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Plan:
    """Scan, propose, verify (the spec's framework's planner), and return the plan."""
    from gbdoctor.scan import scan
    from gbdoctor.scan.estimate import decide, pin

    framework = framework_for(spec)
    if scan_fn is None:
        scan_fn = scan
        if can_simulate(framework):
            decision = decide(spec)
            spec = pin(spec, decision)
            # Re-scans keep the first decision (and its reason, for the notice).
            scan_fn = functools.partial(scan, decision=decision)
    return planner_of(framework).propose_plan(spec, scan_fn=scan_fn, progress=progress)


def plan_strategy(plan: Plan, spec: Spec | None = None, *, identity: str | None = None) -> Any:
    """The setup strategy that applies ``plan`` (used by scan --plan, run --plan, verification),
    from the plan's framework.

    With ``identity`` (a loaded plan file) the strategy applies the plan strictly: the model's
    block kinds and the plan's must be the same, and every module the plan leaves eager must
    exist (``setup.apply`` refuses a stale or foreign plan), and reports record the identity.
    A plan applies to specs of its own framework only (SpecError, exit 2)."""
    framework = framework_named(plan.framework)
    if spec is not None and plan.framework != spec.gbdoctor.framework:
        raise SpecError(
            f"plan {identity or plan.spec} is a {framework.title} plan; spec {spec.path} has "
            f"framework '{spec.gbdoctor.framework}'",
            hint="make the plan for this spec with `gbdoctor plan SPEC --emit-config json -o FILE`",
        )
    strategy = planner_of(framework, "scan --plan").plan_strategy(plan)
    return replace(strategy, plan=identity) if identity else strategy


def plan_identity(path: str | Path, text: str) -> str:
    """How reports name the plan they applied: file name and content hash (no directory, so
    the same plan gives the same report wherever it lives)."""
    return f"{Path(path).name} sha256:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def read_plan(path: str | Path) -> tuple[Plan, str]:
    """Read and check a plan JSON file: (plan, identity). BaselineError (exit 2) for a missing,
    unreadable, binary, malformed or impossible plan: unknown keys, wrong types, negative counts,
    a flags entry that is not [name, bool], a Dynamo flag that does not exist, an unknown mode."""
    import torch

    from gbdoctor.torch_compat import dynamo_config

    hint = "regenerate the plan with `gbdoctor plan SPEC --emit-config json -o FILE`"
    name = str(path)
    text = read_text(path, "plan", hint=hint)
    data = parse_json_object(text, name, hint=hint)
    check_schema_version(data, READABLE_PLAN_SCHEMA_VERSIONS, name, "plan", hint=hint)
    plan = load_record(Plan, data | {"schema_version": PLAN_SCHEMA_VERSION}, name, counts=True)
    for flag, _ in plan.flags:
        if not hasattr(dynamo_config(), flag):
            raise BaselineError(
                f"{name}: $.flags: {flag!r} is not a torch._dynamo.config setting of torch "
                f"{torch.__version__}",
                hint=hint,
            )
    if not plan.kinds:
        raise BaselineError(f"{name}: $.kinds: the plan has no block kinds", hint=hint)
    names = framework_names()
    if plan.framework not in names:
        raise BaselineError(
            f"{name}: $.framework: {plan.framework!r} is not one of {', '.join(names)}",
            hint=hint,
        )
    for other in all_frameworks():
        # A framework's own plan section is there exactly when the plan is that framework's.
        section = other.plan_section if isinstance(other, Planner) else None
        if section and (plan.framework == other.name) != (getattr(plan, section) is not None):
            raise BaselineError(
                f"{name}: $.{section}: a plan has it exactly when its framework is '{other.name}'",
                hint=hint,
            )
    framework = framework_named(plan.framework)
    planner = planner_of(framework)
    planner.check_plan(plan, name, hint)
    modes = planner.plan_modes
    for i, kind in enumerate(plan.kinds):
        if kind.mode not in modes:
            raise BaselineError(
                f"{name}: $.kinds[{i}].mode: {kind.mode!r} is not one of {', '.join(modes)}",
                hint=hint,
            )
    return plan, plan_identity(path, text)


def load_plan(path: str | Path) -> Plan:
    """Read a plan JSON file; BaselineError (exit 2) when missing or malformed (see read_plan)."""
    return read_plan(path)[0]


def dump_plan(plan: Plan) -> str:
    return dumps(plan)
