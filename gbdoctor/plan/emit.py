"""Emitters: a verified plan as a plan file, a torchtitan overlay + apply_compile, DeepSpeed
config and calls, or plain PyTorch code. All Python emitted here is valid code (tests compile
it, and run the plain-PyTorch one on a model)."""

from __future__ import annotations

import json
import pprint

from gbdoctor.errors import SpecError
from gbdoctor.plan.planner import dump_plan
from gbdoctor.records import Plan

EMITTERS = ("json", "torchtitan", "deepspeed", "python")


def _layer_recipes(plan: Plan) -> dict[str, dict[str, object]]:
    """Layer key ("3") -> recipe, for verified kinds only (an unverified kind is left as is)."""
    recipes: dict[str, dict[str, object]] = {}
    for kind in plan.kinds:
        if not kind.verified:
            continue
        for fqn in kind.layers:
            recipes[fqn.rsplit(".", 1)[-1]] = {
                "mode": str(kind.mode),  # a plain string: pprint writes an enum's repr
                "fullgraph": kind.fullgraph,
                "eager": list(kind.eager),
                "compiled_forward": list(kind.compiled_forward),
                "split_ac": kind.split_ac,
                "cudagraphs": kind.cudagraph_ready,
            }
    return dict(sorted(recipes.items(), key=lambda kv: (len(kv[0]), kv[0])))


_CORE = '''
import torch
import torch._dynamo
import torch.nn as nn

PLAN = {plan}
"""Layer key -> how that block is compiled (verified by gbdoctor; unverified kinds are absent)."""

DYNAMO_FLAGS = {flags}


def _set_layer(layers, key, module):
    if isinstance(layers, nn.ModuleDict):
        layers[key] = module
    else:
        layers[int(key)] = module


def _layer_items(layers):
    if isinstance(layers, nn.ModuleDict):
        return list(layers.items())
    return [(str(i), block) for i, block in enumerate(layers)]


def _compile_children(parent, prefix, eager, fullgraph, backend, mode=None):
    """Compile every child without an eager module inside; recurse into the others."""
    for name, child in list(parent.named_children()):
        path = prefix + name
        if path in eager:
            continue
        if any(e.startswith(path + ".") for e in eager):
            inner = getattr(child, "_checkpoint_wrapped_module", child)
            _compile_children(inner, path + ".", eager, fullgraph, backend, mode)
            continue
        if not any(True for _ in child.parameters()) and not list(child.children()):
            continue
        setattr(parent, name, torch.compile(child, backend=backend, fullgraph=fullgraph, mode=mode))


def _compile_forwards(block, paths, fullgraph, backend, mode=None):
    """Compile each listed eager module's own forward: nn.Module.__call__ still runs its hooks
    (FSDP all-gather, EP dispatch/combine) eagerly around the compiled computation."""
    for path in paths:
        module = block
        for part in path.split("."):
            module = getattr(module, part)
            module = getattr(module, "_checkpoint_wrapped_module", module)
        module.forward = torch.compile(module.forward, backend=backend, fullgraph=fullgraph, mode=mode)


def apply_split_ac(model, wrap, wrap_plain=None):
    """For blocks the plan splits: wrap each child with ``wrap`` (e.g. your SAC wrapper) instead
    of the whole block; children holding an eager module get ``wrap_plain`` (full AC)."""
    for key, block in _layer_items(model.layers):
        recipe = PLAN.get(key)
        if not recipe or not recipe["split_ac"]:
            continue
        for name, child in list(block.named_children()):
            if not any(True for _ in child.parameters()):
                continue
            holds_eager = any(e == name or e.startswith(name + ".") for e in recipe["eager"])
            setattr(block, name, (wrap_plain or wrap)(child) if holds_eager else wrap(child))


def apply_gbdoctor_plan(model, backend="inductor", cudagraphs=False):
    """Apply the plan's Dynamo flags and per-block compile (after AC, before FSDP).

    ``cudagraphs=True`` compiles the blocks gbdoctor found CUDA-graph ready with
    ``mode="reduce-overhead"`` (inductor's cudagraph trees; needs backend="inductor" and CUDA)."""
    for name, value in DYNAMO_FLAGS.items():
        setattr(torch._dynamo.config, name, value)
    for key, block in _layer_items(model.layers):
        recipe = PLAN.get(key)
        if recipe is None or recipe["mode"] == "none":
            continue
        mode = "reduce-overhead" if cudagraphs and recipe.get("cudagraphs") else None
        if recipe["mode"] == "block":
            compiled = torch.compile(block, backend=backend, fullgraph=recipe["fullgraph"], mode=mode)
            _set_layer(model.layers, key, compiled)
        else:
            inner = getattr(block, "_checkpoint_wrapped_module", block)
            _compile_children(inner, "", set(recipe["eager"]), recipe["fullgraph"], backend, mode)
            _compile_forwards(inner, recipe.get("compiled_forward", ()), recipe["fullgraph"], backend, mode)
    return model
'''


def _header(plan: Plan, what: str) -> str:
    status = "verified" if plan.verified else "PARTLY UNVERIFIED (unverified kinds are left out)"
    lines = [
        f"Generated by `gbdoctor plan` ({what}) for {plan.spec} ({plan.model}), torch {plan.torch_version}.",
        f"Plan status: {status}.",
    ]
    for kind in plan.kinds:
        lines.append(
            f"- {kind.kind} ({len(kind.layers)} layer(s)): {kind.mode}"
            f"{' eager=' + kind.eager_summary() if kind.eager else ''}"
            f"{' split-AC' if kind.split_ac else ''}; breaks {kind.breaks_before} -> {kind.breaks_after}; "
            f"{'verified' if kind.verified else 'NOT verified: ' + kind.detail}"
        )
        if kind.cudagraphs:
            ready = "CUDA-graph ready" if kind.cudagraph_ready else "not CUDA-graph ready"
            lines.append(f"  {kind.kind} is {ready}: {kind.cudagraphs}")
    for cost in plan.flag_costs:
        lines.append(f"flag {cost}")
    return "\n".join(lines)


def _core(plan: Plan) -> str:
    return _CORE.format(
        plan=pprint.pformat(_layer_recipes(plan), width=100, sort_dicts=False),
        flags=pprint.pformat(dict(plan.flags), width=100),
    )


def emit_python(plan: Plan) -> str:
    return (
        f'"""{_header(plan, "plain PyTorch")}\n\nUsage: apply AC (apply_split_ac for split blocks), then\napply_gbdoctor_plan(model), then FSDP."""\n'
        + _core(plan)
    )


def emit_torchtitan(plan: Plan) -> str:
    overlay = (
        '[compile]\nenable = true\ncomponents = ["model", "loss"]\n'
        "# TOML cannot express per-block fullgraph: call apply_compile below from your\n"
        "# model's parallelize function in place of torchtitan's apply_compile."
    )
    body = (
        _core(plan)
        + '''

def apply_compile(model, compile_config, ep_enabled=False, cudagraphs=False):
    """Drop-in for torchtitan v0.2.x's ``apply_compile(model, compile_config, ep_enabled)``;
    ``cudagraphs=True`` uses mode="reduce-overhead" on the CUDA-graph-ready blocks."""
    return apply_gbdoctor_plan(model, backend=compile_config.backend, cudagraphs=cudagraphs)
'''
    )
    doc = (
        f"{_header(plan, 'torchtitan')}\n\nTrain-config overlay (merge into your TOML):\n\n"
        + "\n".join("    " + line for line in overlay.splitlines())
    )
    return f'"""{doc}\n"""\n' + body


def emit_deepspeed(plan: Plan) -> str:
    if plan.deepspeed is not None:
        return emit_deepspeed_plan(plan)
    whole = (
        all(k.mode == "block" for k in plan.kinds) and len({k.fullgraph for k in plan.kinds}) <= 1
    )
    fullgraph = plan.kinds[0].fullgraph if plan.kinds else False
    ds_config = {"compile": {"deepcompile": False}}
    body = (
        _core(plan)
        + f'''

DS_CONFIG_COMPILE = {json.dumps(ds_config)}
"""Merge into your DeepSpeed config."""


def compile_engine(engine, backend="inductor"):
    """Apply the plan to a DeepSpeed engine.

    {
            "Every block is compiled whole, so engine.compile can do it."
            if whole
            else "The plan compiles blocks differently, which engine.compile (whole module) cannot express:"
            " the blocks of engine.module are compiled per the plan instead."
        }
    """
    for name, value in DYNAMO_FLAGS.items():
        setattr(torch._dynamo.config, name, value)
    {
            "engine.compile(backend=backend, compile_kwargs={'fullgraph': " + repr(fullgraph) + "})"
            if whole
            else "apply_gbdoctor_plan(engine.module, backend=backend)"
        }
    return engine
'''
    )
    return f'"""{_header(plan, "DeepSpeed")}\n"""\n' + body


_DS_BODY = '''
import copy

import torch

DS_CONFIG = {config}
"""Merge into your DeepSpeed config (every key is accepted by DeepSpeed's own config classes)."""


def merge_config(config):
    """Your DeepSpeed config dict with DS_CONFIG merged in (nested tables merged, lists extended)."""
    out = copy.deepcopy(config)

    def merge(dst, src):
        for key, value in src.items():
            if isinstance(value, dict) and isinstance(dst.get(key), dict):
                merge(dst[key], value)
            elif isinstance(value, list) and isinstance(dst.get(key), list):
                dst[key] = dst[key] + [v for v in value if v not in dst[key]]
            else:
                dst[key] = copy.deepcopy(value)

    merge(out, DS_CONFIG)
    return out


def compile_engine(engine, backend="inductor"):
    """The plan's compile call; once, after deepspeed.initialize(config=merge_config(...))."""
{call}
    return engine
'''


def emit_deepspeed_plan(plan: Plan) -> str:
    """A DeepSpeed plan as a config fragment DeepSpeed accepts plus the compile call that goes
    with it. DeepCompile is never emitted: it needs CUDA, and the plan was verified without it."""
    ds = plan.deepspeed
    assert ds is not None
    config: dict[str, object] = {}
    if ds.leaf_modules:
        config["zero_optimization"] = {"leaf_module": {"classes": list(ds.leaf_modules)}}
    if ds.mode == "engine":
        call = (
            f"    engine.compile(backend=backend, compile_kwargs={{'fullgraph': {ds.fullgraph!r}}})"
        )
    else:
        call = (
            "    # Between the hooks: each block's forward, not its __call__ (ZeRO's hooks stay eager).\n"
            "    for block in engine.module.layers:\n"
            f"        block.forward = torch.compile(block.forward, backend=backend, fullgraph={ds.fullgraph!r})"
        )
    lines = [
        _header(plan, "DeepSpeed"),
        f"ZeRO stage {ds.zero_stage}; compile: {ds.mode}, fullgraph={ds.fullgraph}.",
    ]
    if ds.remaining:
        lines.append("Breaks the plan does not remove:")
        lines += [f"- {r}" for r in ds.remaining]
    lines += [f"Also: {s}" for s in plan.suggestions]
    doc = "\n".join(lines).replace('"""', "'''")
    body = _DS_BODY.format(config=pprint.pformat(config, width=100, sort_dicts=True), call=call)
    return f'"""{doc}\n"""\n' + body


def emit(plan: Plan, fmt: str) -> str:
    if fmt == "json":
        return dump_plan(plan)
    if fmt == "python":
        return emit_python(plan)
    if fmt == "torchtitan":
        return emit_torchtitan(plan)
    if fmt == "deepspeed":
        return emit_deepspeed(plan)
    raise SpecError(f"unknown --emit-config {fmt!r}", hint=f"choose from {', '.join(EMITTERS)}")
