"""The Accelerate planner: scan the run as configured, turn its breaks into fixes in Accelerate's
vocabulary (``fixes.py``), apply the settings fixes and prove them by re-preparing the model
through accelerate's own functions with the patched settings (a strict re-scan).

The plan keeps what the emitter and ``scan --plan`` need in its notes, as JSON after fixed
prefixes: the patched settings (what a re-scan applies), the Accelerate config overlay and the
TrainingArguments fields (what ``--emit-config accelerate`` writes).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from gbdoctor.errors import BaselineError
from gbdoctor.frameworks.accelerate.config import AccelerateSettings
from gbdoctor.frameworks.accelerate.fixes import Fix, fixed_settings, fixes
from gbdoctor.frameworks.accelerate.setup import AccelerateStrategy
from gbdoctor.frameworks.accelerate.spec import settings_of
from gbdoctor.frameworks.common.plan import clean
from gbdoctor.records import KindPlan, Plan, ScanReport, Spec

SETTINGS_NOTE = "patched accelerate settings: "
CONFIG_NOTE = "accelerate config overlay: "
TRAINER_NOTE = "TrainingArguments fields: "
CODE_NOTE = "code change: "


def with_settings(spec: Spec, settings: AccelerateSettings) -> Spec:
    run = spec.registry_run
    assert run is not None
    return dataclasses.replace(spec, registry_run=dataclasses.replace(run, args=settings.as_args()))


def changed(before: AccelerateSettings, after: AccelerateSettings) -> dict[str, Any]:
    return {
        f.name: getattr(after, f.name)
        for f in dataclasses.fields(before)
        if getattr(after, f.name) != getattr(before, f.name)
    }


def _nested(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def propose_accelerate_plan(
    spec: Spec,
    *,
    scan_fn: Callable[..., ScanReport],
    progress: Callable[[str, int, int], None] | None = None,
) -> Plan:
    say = progress or (lambda *_: None)
    settings = settings_of(spec)
    say("scan as configured", 0, 2)
    before = scan_fn(spec)
    found = fixes(settings, before)
    patched = fixed_settings(settings, found)
    after, rounds = before, 1
    if patched != settings:
        say("strict re-scan with the fixes applied", 1, 2)
        after, rounds = scan_fn(with_settings(spec, patched), strict=True), 2
    say("done", 2, 2)
    return _assemble(spec, settings, patched, found, before, after, rounds)


def _assemble(
    spec: Spec,
    settings: AccelerateSettings,
    patched: AccelerateSettings,
    found: list[Fix],
    before: ScanReport,
    after: ScanReport,
    rounds: int,
) -> Plan:
    from gbdoctor.frameworks.accelerate import NAME

    after_by_fqn = {b.fqn: b for b in after.blocks}
    kinds: dict[str, list[str]] = {}
    for block in before.blocks:
        kinds.setdefault(block.kind.split("#")[0], []).append(block.fqn)
    plans = []
    for kind, layers in sorted(kinds.items()):
        old = [b for b in before.blocks if b.fqn in layers]
        new = [after_by_fqn[f] for f in layers if f in after_by_fqn]
        plans.append(
            KindPlan(
                kind=kind,
                layers=tuple(layers),
                mode="accelerate",
                fullgraph=False,
                actions=tuple(f.text for f in found),
                reasons=tuple(f.text for f in found) or ("clean as configured",),
                breaks_before=sum(x.count for b in old for x in b.breaks),
                breaks_after=sum(x.count for b in new for x in b.breaks),
                events_before=sum(len(b.events) for b in old),
                events_after=sum(len(b.events) for b in new),
                verified=len(new) == len(old) and all(clean(b) for b in new),
            )
        )
    notes = [SETTINGS_NOTE + json.dumps(changed(settings, patched), sort_keys=True)]
    overlay = [pair for f in found for pair in f.accelerate_config]
    trainer = [pair for f in found for pair in f.training_arguments]
    notes.append(CONFIG_NOTE + json.dumps(_nested(overlay), sort_keys=True))
    notes.append(TRAINER_NOTE + json.dumps(_nested(trainer), sort_keys=True))
    notes += [CODE_NOTE + f.model_code for f in found if f.model_code]
    return Plan(
        spec=spec.key,
        model=f"{spec.model.name}/{spec.model.flavor}",
        torch_version=before.torch_version,
        baseline_strategy="accelerate",
        flags=(),
        flag_costs=(),
        kinds=tuple(plans),
        verified=all(k.verified for k in plans),
        rounds=rounds,
        suggestions=(),
        notes=tuple(notes),
        framework=NAME,
    )


def _note(plan: Plan, prefix: str) -> Any:
    for note in plan.notes:
        if note.startswith(prefix):
            return json.loads(note[len(prefix) :])
    raise BaselineError(
        f"plan {plan.spec}: no {prefix.rstrip(': ')!r} note",
        hint="make the plan with `gbdoctor plan --accelerate CONFIG --model MODEL --emit-config json`",
    )


def plan_strategy(plan: Plan) -> AccelerateStrategy:
    """The strategy that applies the plan's patched settings on top of the run's."""
    patch = _note(plan, SETTINGS_NOTE)
    args = tuple(f"{k}={json.dumps(v)}" for k, v in sorted(patch.items()))
    return AccelerateStrategy(
        "plan", settings=args, summary="gbdoctor plan: " + "; ".join(plan.suggestions)
    )


def emit_accelerate(plan: Plan) -> str:
    """The Accelerate config overlay (YAML) and, as comments, the TrainingArguments fields and
    code changes of ``plan``."""
    import yaml

    overlay = _note(plan, CONFIG_NOTE)
    trainer = _note(plan, TRAINER_NOTE)
    lines = [
        f"# gbdoctor plan for {plan.spec} ({'verified' if plan.verified else 'NOT verified'} by a strict re-scan)",
        "# Merge into the YAML `accelerate config` wrote:",
    ]
    lines += (
        yaml.safe_dump(overlay, sort_keys=True).splitlines()
        if overlay
        else ["# (no Accelerate config change)"]
    )
    lines.append("# Trainer users: these TrainingArguments fields instead:")
    lines.append("# " + (json.dumps(trainer, sort_keys=True) if trainer else "(none)"))
    lines += [f"# {note}" for note in plan.notes if note.startswith(CODE_NOTE)]
    return "\n".join(lines) + "\n"
