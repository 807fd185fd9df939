"""``plan --emit-config torchtitan``: a train-config overlay and a drop-in ``apply_compile``
for torchtitan v0.2.x's parallelize functions."""

from __future__ import annotations

import pprint

from gbdoctor.frameworks.common.emit import core, header
from gbdoctor.records import Plan

# Under PP torchtitan v0.2 calls the parallelize function, so apply_compile, once per model
# part; a part keeps the global keys of its layers (a ModuleDict with the others deleted), so
# PLAN serves every stage as is. The stage table lets apply_compile refuse a part that is no
# stage of the plan's split (a plan made for another PP degree or schedule would silently
# leave layers without their recipe).
_STAGES = '''

STAGES = {stages}
"""Pipeline stage -> the layer keys its model part holds (gbdoctor's split, torchtitan's rules)."""


def stage_of(model_part):
    """The stage ``model_part`` is; ValueError when its layers are no stage of the plan."""
    keys = tuple(key for key, _ in _layer_items(model_part.layers))
    for stage, layers in STAGES.items():
        if keys == layers:
            return stage
    raise ValueError(
        f"model part with layers {{keys[:3]}}... is not a pipeline stage of this plan "
        "(made for another pipeline_parallel_degree or schedule): regenerate it with gbdoctor plan"
    )
'''


def emit_torchtitan(plan: Plan) -> str:
    overlay = (
        '[compile]\nenable = true\ncomponents = ["model", "loss"]\n'
        "# TOML cannot express per-block fullgraph: call apply_compile below from your\n"
        "# model's parallelize function in place of torchtitan's apply_compile."
    )
    stages = ""
    check = ""
    if plan.stages:
        table = {s.stage: tuple(f.rsplit(".", 1)[-1] for f in s.layers) for s in plan.stages}
        stages = _STAGES.format(stages=pprint.pformat(table, width=100, compact=True))
        check = "    stage_of(model)  # under PP: one call per model part, each a stage\n"
    body = (
        core(plan)
        + stages
        + f'''

def apply_compile(model, compile_config, ep_enabled=False, cudagraphs=False):
    """Drop-in for torchtitan v0.2.x's ``apply_compile(model, compile_config, ep_enabled)``;
    ``cudagraphs=True`` uses mode="reduce-overhead" on the CUDA-graph-ready blocks."""
{check}    return apply_gbdoctor_plan(model, backend=compile_config.backend, cudagraphs=cudagraphs)
'''
    )
    doc = (
        f"{header(plan, 'torchtitan')}\n\nTrain-config overlay (merge into your TOML):\n\n"
        + "\n".join("    " + line for line in overlay.splitlines())
    )
    return f'"""{doc}\n"""\n' + body
