"""``plan --emit-config torchtitan`` for a torchtitan >= 0.3 plan: a config-registry module.

What a 0.3 user applies: a function deriving from their own config function (compile on), and,
when the plan changes anything per layer or sets Dynamo flags, a wrapper around the model's
``parallelize_fn`` that applies them after torchtitan's own compile (the config cannot say it
per block). Train with it by naming the module: ``--module <module> --config <name>_gbdoctor``
plus the same overrides (torchtitan imports a dotted module path's config functions directly).
The wrapper's body is ``layer_plan.apply_layer_plan``'s own source: the code a plan scan runs.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import pprint

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.torchtitan.layer_plan import apply_layer_plan
from gbdoctor.frameworks.torchtitan.plan import layer_plan_strategy
from gbdoctor.records import Plan

_PREFIX = "torchtitan:"


def emit_config_registry(plan: Plan) -> str:
    module, config, args = split_label(plan.spec)
    strategy = layer_plan_strategy(plan)
    verified = [k for k in plan.kinds if k.verified]
    layers = tuple(
        lm
        for lm in strategy.layers
        if any(lm[0] == f.rsplit(".", 1)[-1] for k in verified for f in k.layers)
    )
    wrap = bool(layers or plan.flags)
    lines = [
        f"torchtitan {'run' if not args else 'run (with its overrides)'}: {module}:{config}"
        + "".join(f" {a}" for a in args),
        f"gbdoctor plan: {'verified' if plan.verified else 'NOT fully verified'} on torch "
        f"{plan.torch_version}; unverified kinds are left as torchtitan sets them up.",
    ]
    for k in plan.kinds:
        how = "eager" if k.mode == "eager" else f"compiled whole, fullgraph={k.fullgraph}"
        state = "verified" if k.verified else f"not verified ({k.detail[:100]})"
        lines.append(f"  {k.kind} ({len(k.layers)} layer(s)): {how}; {state}")
    lines += list(plan.stage_lines())
    if plan.stages:
        lines.append(
            "Under PP the wrapper runs once per model part; LAYERS is keyed by the global layer "
            "keys, so each part applies its own stage's layers."
        )
    lines += [
        "",
        "Train with it (this file importable, e.g. on PYTHONPATH):",
        f"  --module <this module> --config {config}_gbdoctor" + "".join(f" {a}" for a in args),
    ]
    doc = "\n".join(lines)
    body = f'''"""{doc}
"""

from __future__ import annotations

import functools
import importlib

_base_config = getattr(importlib.import_module({_registry_module(module)!r}), {config!r})

LAYERS = {pprint.pformat(layers, width=90)}
"""(layer of model.layers, "eager" | "nofullgraph") changed after torchtitan's own compile."""

DYNAMO_FLAGS = {pprint.pformat(tuple(plan.flags), width=90)}


{inspect.getsource(apply_layer_plan).rstrip()}


def _with_plan(parallelize_fn):
    @functools.wraps(parallelize_fn)
    def parallelize(model, **kwargs):
        model = parallelize_fn(model, **kwargs)
        apply_layer_plan(model, LAYERS, DYNAMO_FLAGS, kwargs["compile_config"].backend)
        return model

    return parallelize


def {config}_gbdoctor():
    config = _base_config()
    config.compile.enable = True
'''
    if wrap:
        body += (
            "    config.model_spec.parallelize_fn = _with_plan(config.model_spec.parallelize_fn)\n"
        )
    body += "    return config\n"
    return body


def split_label(spec: str) -> tuple[str, str, tuple[str, ...]]:
    """(module, config, overrides) of a torchtitan run's spec label (``Spec.path``)."""
    name, *args = spec.removeprefix(_PREFIX).split(" ")
    module, _, config = name.partition(":")
    if not spec.startswith(_PREFIX) or not module or not config.isidentifier():
        raise SpecError(
            f"plan spec {spec!r} does not name a torchtitan run",
            hint="make the plan with `gbdoctor plan --torchtitan MODULE:CONFIG ...`",
        )
    return module, config, tuple(args)


def _registry_module(module: str) -> str:
    """Where ``--module NAME`` finds its config functions: torchtitan's own model or experiment
    (read from its installed layout, without importing it), else the module as given."""
    if "." in module:
        return module
    found = importlib.util.find_spec("torchtitan")
    for root in (found.submodule_search_locations or []) if found else []:
        for package in ("models", "experiments"):
            if os.path.exists(os.path.join(root, package, module, "config_registry.py")):
                return f"torchtitan.{package}.{module}.config_registry"
    return module
