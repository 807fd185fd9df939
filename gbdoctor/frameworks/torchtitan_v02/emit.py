"""``plan --emit-config torchtitan``: a train-config overlay and a drop-in ``apply_compile``
for torchtitan v0.2.x's parallelize functions."""

from __future__ import annotations

from gbdoctor.frameworks.common.emit import core, header
from gbdoctor.records import Plan


def emit_torchtitan(plan: Plan) -> str:
    overlay = (
        '[compile]\nenable = true\ncomponents = ["model", "loss"]\n'
        "# TOML cannot express per-block fullgraph: call apply_compile below from your\n"
        "# model's parallelize function in place of torchtitan's apply_compile."
    )
    body = (
        core(plan)
        + '''

def apply_compile(model, compile_config, ep_enabled=False, cudagraphs=False):
    """Drop-in for torchtitan v0.2.x's ``apply_compile(model, compile_config, ep_enabled)``;
    ``cudagraphs=True`` uses mode="reduce-overhead" on the CUDA-graph-ready blocks."""
    return apply_gbdoctor_plan(model, backend=compile_config.backend, cudagraphs=cudagraphs)
'''
    )
    doc = (
        f"{header(plan, 'torchtitan')}\n\nTrain-config overlay (merge into your TOML):\n\n"
        + "\n".join("    " + line for line in overlay.splitlines())
    )
    return f'"""{doc}\n"""\n' + body
