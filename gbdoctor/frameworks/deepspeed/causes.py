"""What DeepSpeed adds to the cause taxonomy: the ``zero-hook`` cause, a break in ZeRO-3's own
hooks (where those are: ``FrameworkHooks`` of the framework, ``causes.hooks``).

Light: no torch import (frameworks load when the command line is built)."""

from __future__ import annotations

from gbdoctor.causes.contributions import CauseKnowledge
from gbdoctor.causes.taxonomy import Cause

ZERO_HOOK = Cause(
    id="zero-hook",
    title="DeepSpeed ZeRO-3 hook inside the compiled region",
    explanation=(
        "ZeRO-3 installs parameter gather/release (pre/post-forward) and pre-backward hooks on "
        "every sub-module; they are torch.compiler.disable'd or untraceable, so a region that "
        "contains ZeRO-managed sub-modules (engine.compile(), block.compile()) runs in pieces "
        "and recompiles as the hooks' guards change from module to module."
    ),
    fixes=(
        "compile between the hooks: make each block a ZeRO-3 leaf module "
        "(zero_optimization.leaf_module.classes, or deepspeed.utils.set_z3_leaf_modules) so "
        "ZeRO hooks only the block, and compile the block's forward instead of its __call__",
        "use ZeRO-1 or ZeRO-2 (no parameter partitioning, no hooks in forward) when the "
        "parameters fit on every rank: engine.compile() then captures one graph",
        'on CUDA, DeepCompile ("compile": {"deepcompile": true} + engine.compile()) puts '
        "ZeRO-3's gather/release into the graph itself",
        "engine.compile(compiled_autograd_enabled=True) traces the backward hooks with the "
        "backward (the forward hooks still break)",
    ),
    owner="training-setup",
    effort="easy",
    plan_actions=("compile-between-hooks", "move-out-of-region"),
)

DEEPSPEED_CAUSES = CauseKnowledge(causes=(ZERO_HOOK,))
"""DeepSpeed's ``cause_knowledge`` (``CauseContributor``)."""
