"""``plan``: propose a compile plan for a spec and prove it by re-scanning (the spec's
framework's planner, ``Framework.propose_plan``), apply a plan (``Framework.plan_strategy``),
and read and write plan files.

Real or simulated is decided once (``scan.scan_decision``, as for ``scan``; by the command when
it scanned first) and kept, so every verification re-scan runs the same way: a simulated plan is
verified by simulated re-scans, and no re-scan decides again (builds the model on meta,
estimates its memory). A scan the command already made (``price``'s) answers the planner's
request for that same capture (``PriorScan``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gbdoctor.errors import BaselineError, SpecError
from gbdoctor.frameworks.interface import Framework, Planner
from gbdoctor.frameworks.registry import (
    all_frameworks,
    framework_for,
    framework_named,
    framework_names,
    planner_of,
)
from gbdoctor.records import (
    PLAN_SCHEMA_VERSION,
    READABLE_PLAN_SCHEMA_VERSIONS,
    Decision,
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


@dataclass(frozen=True)
class PriorScan:
    """A scan the command already made before it plans (``price`` scans the spec as set up):
    where the planner asks for the same capture (same spec, strategy and options), it gets this
    report instead of capturing it again."""

    report: ScanReport
    spec: Spec
    """As given to ``scan`` (before the decision is pinned)."""
    strategy: Any = None
    """As given to ``scan``: None (the spec's own), a preset's name, or a strategy."""
    recompiles: bool | None = None
    """As given to ``scan`` (None: ``job.probe_by_default``)."""


def propose_plan(
    spec: Spec,
    *,
    scan_fn: Callable[..., ScanReport] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    decision: Decision | None = None,
    prior: PriorScan | None = None,
    framework: Framework | None = None,
) -> Plan:
    """Scan, propose, verify (the spec's framework's planner), and return the plan.

    ``decision``: the command's own ``scan.scan_decision(spec)`` (``price`` made it for its
    scan), else decided here once; every re-scan keeps it. ``prior``: a scan the command made
    (``price``'s), reused where the planner asks for that same capture. ``framework``: the
    spec's, where the command resolved it; None: resolved here, once for every re-scan."""
    from gbdoctor.scan import scan, scan_decision
    from gbdoctor.scan.estimate import pin

    if framework is None:
        framework = framework_for(spec)
    if scan_fn is None:
        if decision is None:
            decision = scan_decision(spec, framework)
        # Re-scans keep the first decision (and its reason, for the notice) and the framework.
        scan_fn = functools.partial(scan, decision=decision, framework=framework)
        if prior is not None:
            scan_fn = _reusing(scan_fn, prior, pin(prior.spec, decision), framework)
        spec = pin(spec, decision)
    return planner_of(framework).propose_plan(spec, scan_fn=scan_fn, progress=progress)


def _reusing(
    scan_fn: Callable[..., ScanReport], prior: PriorScan, pinned: Spec, framework: Framework
) -> Callable[..., ScanReport]:
    """``scan_fn``, answering the capture ``prior`` already made with its report. ``pinned``:
    the prior scan's spec with the decision pinned, as ``scan`` scanned it."""
    from gbdoctor.scan.job import probe_by_default, strategy_for

    def resolved(spec: Spec, strategy: Any, recompiles: bool | None) -> tuple[Any, bool]:
        if strategy is None or isinstance(strategy, str):
            strategy = strategy_for(framework, spec, strategy)
        return strategy, probe_by_default() if recompiles is None else recompiles

    made = resolved(prior.spec, prior.strategy, prior.recompiles)

    def scan_or_reuse(
        spec: Spec,
        *,
        strategy: Any = None,
        strict: bool = False,
        recompiles: bool | None = None,
        **options: Any,
    ) -> ScanReport:
        if spec == pinned and not strict and not options:
            if resolved(spec, strategy, recompiles) == made:
                return prior.report
        return scan_fn(spec, strategy=strategy, strict=strict, recompiles=recompiles, **options)

    return scan_or_reuse


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
