"""``plan --emit-config deepspeed``: a DeepSpeed plan as a config fragment DeepSpeed accepts
plus the compile call that goes with it; a torchtitan plan as code that compiles an engine's
blocks per the plan."""

from __future__ import annotations

import json
import pprint

from gbdoctor.frameworks.common.emit import core, header
from gbdoctor.records import Plan


def emit_deepspeed(plan: Plan) -> str:
    if plan.deepspeed is not None:
        return emit_deepspeed_plan(plan)
    whole = (
        all(k.mode == "block" for k in plan.kinds) and len({k.fullgraph for k in plan.kinds}) <= 1
    )
    fullgraph = plan.kinds[0].fullgraph if plan.kinds else False
    ds_config = {"compile": {"deepcompile": False}}
    body = (
        core(plan)
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
    return f'"""{header(plan, "DeepSpeed")}\n"""\n' + body


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
        header(plan, "DeepSpeed"),
        f"ZeRO stage {ds.zero_stage}; compile: {ds.mode}, fullgraph={ds.fullgraph}.",
    ]
    if ds.remaining:
        lines.append("Breaks the plan does not remove:")
        lines += [f"- {r}" for r in ds.remaining]
    lines += [f"Also: {s}" for s in plan.suggestions]
    doc = "\n".join(lines).replace('"""', "'''")
    body = _DS_BODY.format(config=pprint.pformat(config, width=100, sort_dicts=True), call=call)
    return f'"""{doc}\n"""\n' + body
