"""The Python every plan emitter writes: the plan's per-layer recipes and Dynamo flags, and the
``apply_gbdoctor_plan`` code that applies them (``_core``), under a header that says what the plan
is (``_header``). Each framework's emitter wraps it in that framework's calls."""

from __future__ import annotations

import pprint

from gbdoctor.records import Plan


def layer_recipes(plan: Plan) -> dict[str, dict[str, object]]:
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


CORE = '''
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


def header(plan: Plan, what: str) -> str:
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
    lines.extend(plan.stage_lines())
    for cost in plan.flag_costs:
        lines.append(f"flag {cost}")
    return "\n".join(lines)


def core(plan: Plan) -> str:
    return CORE.format(
        plan=pprint.pformat(layer_recipes(plan), width=100, sort_dicts=False),
        flags=pprint.pformat(dict(plan.flags), width=100),
    )


def emit_python(plan: Plan) -> str:
    return (
        f'"""{header(plan, "plain PyTorch")}\n\nUsage: apply AC (apply_split_ac for split blocks), then\napply_gbdoctor_plan(model), then FSDP."""\n'
        + core(plan)
    )
