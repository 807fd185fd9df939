"""The cause taxonomy: every documented cause of graph breaks, its fixes and its plan actions.

``Cause.plan_actions`` is what a planner reads to decide what it may do about a break of that
cause (``Taxonomy.plan_actions``); ``gbdoctor causes`` lists the taxonomy. The causes here name
no framework: a framework adds its own causes and the precedents of these fixes
(``contributions``).
"""

from __future__ import annotations

from dataclasses import dataclass

# --------------------------------------------------------------------------- causes

OWNERS = ("model", "training-setup", "pytorch")
"""Who can fix it: the model author, whoever owns the training setup, or PyTorch itself."""

EFFORTS = ("easy", "moderate", "hard")

PLAN_ACTIONS = (
    "isolate-child",
    "split-ac",
    "flag:capture_scalar_outputs",
    "flag:capture_dynamic_output_shape_ops",
    "flag:compiled_autograd",
    "flag:skip_fwd_side_effects_in_bwd_under_checkpoint",
    "move-out-of-region",
    "model-change",
    "compile-between-hooks",
)
"""Fix kinds a planner can apply:

- ``isolate-child``: compile the clean children with fullgraph=True, leave the breaking child eager;
- ``split-ac``: wrap AC/SAC per child so a break in one child does not send the others to eager;
- ``flag:<name>``: set ``torch._dynamo.config.<name> = True``;
- ``move-out-of-region``: move the offending code (hook, update) outside the compiled region;
- ``model-change``: only the model author can fix it (edit the code);
- ``compile-between-hooks``: compile a hooked module's ``forward`` (not its ``__call__``), so its
  hooks run eagerly around the compiled region: a ZeRO-3 leaf block's forward, or the forward of
  an expert store that FSDP (its own ``fully_shard``) and EP (dispatch/combine) hook into.
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cause:
    """One documented cause of graph breaks. ``id`` is part of the JSON contract."""

    id: str
    title: str
    explanation: str
    """One line: why this code breaks the graph."""
    fixes: tuple[str, ...]
    """Concrete fixes, most effective first."""
    owner: str
    """``model``, ``training-setup`` or ``pytorch``."""
    effort: str
    """``easy``, ``moderate`` or ``hard``."""
    plan_actions: tuple[str, ...]
    """Machine-readable fix kinds from :data:`PLAN_ACTIONS`, preferred first."""


_CAUSE_LIST = (
    Cause(
        id="backward-hook",
        title="Backward hook inside the compiled region",
        explanation=(
            "A module full-backward hook (or a gradient hook registered inside forward) needs "
            "compiled autograd; without it Dynamo breaks the graph at the hooked call."
        ),
        fixes=(
            "set torch._dynamo.config.compiled_autograd = True so the hook is traced with the backward",
            "register the hook on a module outside the compiled region, or compile the hooked "
            "module's children instead of the hooked module",
            "replace the module backward hook by tensor.register_hook(...) on the module output "
            "inside forward (a side-effect-free tensor hook is traced without a break)",
            "leave the hooked child eager and compile its siblings with fullgraph=True",
        ),
        owner="training-setup",
        effort="moderate",
        plan_actions=("flag:compiled_autograd", "isolate-child", "move-out-of-region"),
    ),
    Cause(
        id="fsdp-hook",
        title="FSDP sharding hook inside the compiled region",
        explanation=(
            "Sharding hooks (FSDP2 fully_shard pre/post-forward) are torch._dynamo.disable'd, so a "
            "compiled region that contains a sharded module breaks."
        ),
        fixes=(
            "compile each block before fully_shard and never compile a module that contains "
            "separately sharded children",
            "compile the children of the sharded module (attention, feed_forward, ...) instead of "
            "its __call__, so that the FSDP hooks run outside every compiled region",
            "with EP, keep moe.experts (sharded on its own) eager and compile the other MoE "
            "children with fullgraph=True",
            "compile module.forward rather than the module, so nn.Module.__call__ runs the hooks eagerly",
        ),
        owner="training-setup",
        effort="easy",
        plan_actions=("isolate-child", "compile-between-hooks", "move-out-of-region"),
    ),
    Cause(
        id="ep-dispatch",
        title="Expert-parallel token dispatch/combine",
        explanation=(
            "EP dispatch/combine turns all-to-all split sizes into Python ints (.tolist(), a "
            "device-to-host sync), a data-dependent break in every MoE layer."
        ),
        fixes=(
            "set torch._dynamo.config.capture_scalar_outputs = True so the split sizes become "
            "SymInts and the all-to-all stays in the graph",
            "compile the MoE children but leave moe.experts, with its dispatch/combine hooks, eager",
            "use a fixed-capacity dispatch (padded, static split sizes) so no host sync is needed",
        ),
        owner="training-setup",
        effort="easy",
        plan_actions=("flag:capture_scalar_outputs", "isolate-child", "compile-between-hooks"),
    ),
    Cause(
        id="moe-load-balancing",
        title="MoE load-balancing bookkeeping in forward",
        explanation=(
            "Counting tokens per expert with a data-dependent op (bincount, nonzero, .item()) or "
            "updating expert_bias in forward breaks the graph inside the router."
        ),
        fixes=(
            "count with a fixed-size op: torch.histc(expert_idx.float(), bins=num_experts, "
            "min=0, max=num_experts - 1) instead of torch.bincount",
            "update expert_bias outside the compiled region, in an optimizer pre-step hook, and "
            "only accumulate tokens_per_expert in forward",
            "set torch._dynamo.config.capture_dynamic_output_shape_ops = True (and "
            "capture_scalar_outputs) when the data-dependent op must stay",
            "leave the router eager and compile the rest of the block",
        ),
        owner="model",
        effort="easy",
        plan_actions=(
            "flag:capture_dynamic_output_shape_ops",
            "flag:capture_scalar_outputs",
            "move-out-of-region",
            "isolate-child",
        ),
    ),
    Cause(
        id="inplace-in-sac",
        title="Mutation inside an activation-checkpoint region",
        explanation=(
            "A Python attribute, module state or input mutated inside a checkpointed (AC/SAC) "
            "region cannot be replayed on recompute, so the WHOLE region runs eager."
        ),
        fixes=(
            "set torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True "
            "when the side effect need not be replayed in backward",
            "move the mutation (call counters, caches, tokens_per_expert/expert_bias updates) "
            "out of the checkpointed function",
            "wrap AC/SAC per child so only the child with the mutation falls back to eager",
            "use out-of-place ops inside SAC regions (in-place edits of tensors SAC cached are "
            "an error in eager and double-count under recompute)",
        ),
        owner="model",
        effort="moderate",
        plan_actions=(
            "flag:skip_fwd_side_effects_in_bwd_under_checkpoint",
            "split-ac",
            "move-out-of-region",
        ),
    ),
    Cause(
        id="data-dependent",
        title="Data-dependent value or shape",
        explanation=(
            "A value or shape depends on tensor data (.item(), .tolist(), nonzero, bincount, "
            "branching on a tensor), so Dynamo leaves the graph to compute it."
        ),
        fixes=(
            "set torch._dynamo.config.capture_scalar_outputs = True (EP split sizes, .item())",
            "set torch._dynamo.config.capture_dynamic_output_shape_ops = True (nonzero, "
            "bincount, boolean-mask indexing)",
            "replace bincount/nonzero with fixed-size ops such as histc",
            "use torch.cond / torch.where instead of Python branching on tensor values",
        ),
        owner="model",
        effort="moderate",
        plan_actions=(
            "flag:capture_scalar_outputs",
            "flag:capture_dynamic_output_shape_ops",
            "isolate-child",
            "model-change",
        ),
    ),
    Cause(
        id="python-side-effect",
        title="Python side effect (print, logging)",
        explanation="print(), logging and similar Python I/O cannot go in a graph, so Dynamo breaks around them.",
        fixes=(
            "remove the print/logging call from forward, or guard it with "
            "`if not torch.compiler.is_compiling():`",
            "add the logging function to torch._dynamo.config.ignore_logging_functions (a bound "
            "method such as logger.info must be added itself)",
            "add print to torch._dynamo.config.reorderable_logging_functions (only works when "
            "every argument is a tensor, a constant or a format string)",
        ),
        owner="model",
        effort="easy",
        plan_actions=("model-change", "isolate-child"),
    ),
    Cause(
        id="tensor-parallel",
        title="Tensor-parallel hook or DTensor redistribution inside the compiled region",
        explanation=(
            "A TP style's input/output hook (PrepareModuleInput, SequenceParallel, column/row-wise "
            "layouts) or a DTensor redistribute ran inside the compiled region and could not be "
            "traced; recompiles come from guards on DTensor placements and on "
            "AsyncCollectiveTensor-vs-Tensor inputs."
        ),
        fixes=(
            "apply TP before compile and compile each block whole, so the styles' hooks are "
            "traced with the block",
            "keep use_local_output consistent across a block boundary so the block always sees the "
            "same input class (plain Tensor or DTensor), not an AsyncCollectiveTensor on some steps",
            "raise torch._dynamo.config.recompile_limit for TP+EP models",
        ),
        owner="training-setup",
        effort="moderate",
        plan_actions=("isolate-child", "move-out-of-region"),
    ),
    Cause(
        id="collective",
        title="Distributed collective Dynamo cannot trace",
        explanation=(
            "A collective that cannot be rewritten to a functional collective (async_op=True, "
            "P2P isend/irecv, raw process-group calls) breaks the graph."
        ),
        fixes=(
            "use functional collectives (torch.distributed._functional_collectives) or call the "
            "collective with async_op=False",
            "set TORCHDYNAMO_ENABLE_P2P_COMPILATION=1 for isend/irecv/batch_isend_irecv",
            "move the communication into a hook or child module left eager",
        ),
        owner="training-setup",
        effort="moderate",
        plan_actions=("isolate-child", "move-out-of-region"),
    ),
    Cause(
        id="compiler-disabled",
        title="Call to a torch.compiler.disable()d function",
        explanation="The code calls a function wrapped with torch.compiler.disable, which always runs eager and splits the graph.",
        fixes=(
            "remove the torch.compiler.disable wrapper if the function traces now",
            "call the disabled function outside the compiled region (before or after the block)",
            "turn the function into a custom op (torch.library.custom_op) so it stays opaque "
            "inside the graph",
        ),
        owner="model",
        effort="easy",
        plan_actions=("isolate-child", "model-change"),
    ),
    Cause(
        id="explicit",
        title="Explicit torch._dynamo.graph_break()",
        explanation="The code asks for a graph break with torch._dynamo.graph_break().",
        fixes=(
            "remove the torch._dynamo.graph_break() call",
            "if it fences off untraceable code, fix or isolate that code instead",
        ),
        owner="model",
        effort="easy",
        plan_actions=("model-change", "isolate-child"),
    ),
    Cause(
        id="unsupported",
        title="Construct Dynamo cannot trace",
        explanation=(
            "Dynamo hit code it cannot trace (a C extension, a function marked as skipped, an "
            "unsupported Python feature); the gb_type names it."
        ),
        fixes=(
            "wrap the call in a custom op (torch.library.custom_op), or mark it with "
            "torch.compiler.allow_in_graph if it is traceable",
            "move the call out of forward (compute it once at init or outside the compiled region)",
            "follow Dynamo's hints kept on the break and the graph-break site page of its gb id",
        ),
        owner="pytorch",
        effort="hard",
        plan_actions=("isolate-child", "model-change"),
    ),
    Cause(
        id="error",
        title="Block could not be traced",
        explanation=(
            "Tracing raised an error (fake-tensor failure, exception in user code, backend "
            "failure), so no graph was produced for the block."
        ),
        fixes=(
            "run the block eagerly (torch.compiler.set_stance('force_eager')) to check that it "
            "works without compile",
            "check the dtypes and devices the kernels require (e.g. torch._grouped_mm needs bf16)",
            "if eager works, report the error to PyTorch with the gb_type and message",
        ),
        owner="pytorch",
        effort="hard",
        plan_actions=("isolate-child",),
    ),
)

GENERIC_CAUSES: dict[str, Cause] = {c.id: c for c in _CAUSE_LIST}
"""Every cause no framework contributes, keyed by its kebab-case id (the JSON contract). The
whole taxonomy adds the frameworks' (``contributions.combine``,
``frameworks.registry.cause_taxonomy``)."""


_SCALAR_GB = {
    "Unsupported Tensor.item() call with capture_scalar_outputs=False",
    "Data dependent operator",
}
_SHAPE_GB = {"Dynamic shape operator"}
_SIDE_EFFECT_GB = {"HOP: Unsafe side effect"}


def flags_removing(gb_type: str, *, in_checkpoint: bool) -> tuple[str, ...]:
    """The Dynamo flags (``flag:<name>`` plan actions, without the prefix) that remove a break of
    this gb_type, or ``()``. Keyed by gb_type, not cause: within one cause (``data-dependent``)
    ``.item()`` is removed by ``capture_scalar_outputs`` while data-dependent branching is not."""
    if gb_type in _SCALAR_GB or gb_type.startswith("Unsupported Tensor.item()"):
        return ("capture_scalar_outputs",)
    if gb_type in _SHAPE_GB:
        return ("capture_scalar_outputs", "capture_dynamic_output_shape_ops")
    if gb_type in _SIDE_EFFECT_GB and in_checkpoint:
        return ("skip_fwd_side_effects_in_bwd_under_checkpoint",)
    return ()
