"""The classification rules: a :class:`~gbdoctor.records.RawBreak` -> a cause id of the taxonomy.

``causes/`` is the ONLY package that reads Dynamo's message text. Everything else handles
records: ``capture/`` turns log records into :class:`~gbdoctor.records.RawBreak` (using
``causes.parse_reason`` for the gb_type, explanation, hints, context and HOP), and
:func:`classify` maps each one to a cause id of the taxonomy (``zero-hook`` is a framework's).

Three signals decide the cause (DESIGN.md section 6):

1. the ``gb_type`` (the first line of Dynamo's reason), looked up by its registry text; the
   registry shipped with the installed torch (``torch/_dynamo/graph_break_registry.json``)
   maps it to a stable id (``GB0059``) so renamed types still match;
2. whether the break sits inside an activation-checkpoint higher-order op;
3. where it happened: the setup component that installed the code (``raw.component``), the
   user frames and the module FQN.

The rules are ordered; the first that matches wins (:data:`RULE_ORDER`):

0. ``zero-hook``: component ``zero`` (DeepSpeed ZeRO-3's parameter gather/release and
   pre-backward hooks) or ``deepspeed`` (the engine's own module hooks); or a
   ``deepspeed/runtime/zero/`` file among the innermost library frames.
1. ``fsdp-hook``: component ``fsdp``; an FSDP2/FSDP file among the innermost
   library frames; a ``disable`` reason "skipping FSDP hooks"; an FSDP gb_type.
2. ``ep-dispatch``: component ``ep``; or a data-dependent/collective break whose local
   frames (from the innermost ``forward`` on) name dispatch/combine/all_to_all code.
   ``tensor-parallel``: component ``tp`` (a TP style's hook or DTensor redistribution on the
   stack), or a message about DTensor/AsyncCollectiveTensor/redistribute in a break no other
   setup component claims (never a mere DeviceMesh: EP looks its mesh up too).
   The component is the Locator's, else that of gbdoctor's setup module (``setup/ep.py``...)
   holding the innermost user frame: a break is attributed to the code it came from.
3. ``backward-hook``: hook gb_types needing compiled autograd (GB0083, GB0029, GB5821, ...);
   or component ``user-hook`` with backward-hook code on the stack.
4. ``inplace-in-sac``: inside a checkpoint HOP and a side-effect/mutation gb_type (GB0067,
   GB4413, GB1177, GB0041) or a message about mutation.
5. ``moe-load-balancing``: component ``load-balancing``; or a data-dependent break (or the
   ``Tensor.add_`` follow-on of one) in code that keeps routing statistics: measured by
   behaviour (``raw.routing_state``: inside an MoE layer found by structure, the source line
   counts tokens per expert or updates one of the layer's buffers in place, whatever the
   names), else a ``router`` module or local frames about tokens_per_expert/expert_bias/counting.
6. ``data-dependent``: GB0124, GB0033, GB0036/GB0037, GB0170, GB0109, ..., ``generic_jump``.
7. ``collective``: async_op, P2P, process-group/c10d gb_types and objects.
8. ``compiler-disabled``: GB0098/GB0099, or a runtime call of ``torch._dynamo.disable``.
9. ``explicit``: GB0025 ``torch._dynamo.graph_break()``.
10. ``python-side-effect``: print-like GB0059, GB0291, GB0296, GB4841 raised in logging,
    skipped logging/warnings functions, HOP side effects outside checkpointing.
11. ``error``: hard tracing errors (fake-tensor failures, observed exceptions, backend errors).
12. ``unsupported``: everything else. Nothing is dropped; the gb_type stays on the record.

No torch import here: the registry is read as a JSON file next to the installed torch package.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gbdoctor.causes.gb_registry import gb_id_for, is_torch_file
from gbdoctor.causes.hooks import NO_FRAMEWORK_HOOKS, FrameworkHooks
from gbdoctor.causes.parse import (
    DATA_DEPENDENT_BRANCHING,
    DATA_DEPENDENT_SPECIALIZATION,
    GUARD_DATA_DEPENDENT,
    parse_reason,
)
from gbdoctor.records import Component, Location, RawBreak

# --------------------------------------------------------------------------- gb_type groups


@dataclass(frozen=True, slots=True)
class _Group:
    """gb_types matched by registry text first, by registry id second (renamed types)."""

    names: frozenset[str]
    ids: frozenset[str]

    def __contains__(self, gb_type: object) -> bool:
        if not isinstance(gb_type, str):
            return False
        gb_type = gb_type.strip()
        if gb_type in self.names:
            return True
        gb_id = gb_id_for(gb_type)
        return gb_id is not None and gb_id in self.ids


def _group(**pairs: str) -> _Group:
    """``_group(GB0083="Module-level ...")``: id -> registry text."""
    return _Group(frozenset(pairs.values()), frozenset(pairs))


_BACKWARD_HOOK = _group(
    GB0083="Module-level backwards hooks require compiled autograd.",
    GB0029="Compilation of intermediate hooks requires compiled autograd",
    GB5821="register_post_accumulate_grad_hook on an intermediate tensor",
    GB7444="register_hook with stride-dependent code",
    GB0100="Storing Tensor hook handle in globals",
    GB0101="Storing Tensor hook handle in globals (inline call)",
    GB0013="Attempted to represent unregistered RemovableHandle",
)
_HOP_SIDE_EFFECT = _group(
    GB0067="HOP: Unsafe side effect",
    GB4413="HOP: Non-nullified side effect",
    GB1177="nn.Module mutation in HigherOrderOp",
    GB0041="Encountered input mutation during higher order op tracing",
)
_DATA_DEPENDENT = _group(
    GB0124="Unsupported Tensor.item() call with capture_scalar_outputs=False",
    GB0033="Data dependent operator",
    GB0036="Dynamic shape operator",
    GB0037="Dynamic shape operator (no meta kernel)",
    GB0170=DATA_DEPENDENT_BRANCHING,
    GB0035="Data-dependent branching with non-constant __bool__",
    GB0034="Data-dependent assertion failed (cannot compile partial graph)",
    GB0109="Tensor.tolist() with non-integer tensor",
    GB0246="Attempted to use `torch.nn.functional.one_hot` with data-dependent output shape",
)
_COLLECTIVE = _group(
    GB0172="async_op=True for distributed collectives",
    GB2696="P2P compilation disabled for isend/irecv",
    GB9300="P2P compilation disabled for batch_isend_irecv",
    GB1750="P2P compilation disabled for P2POp construction",
    GB3343="Cannot reconstruct P2POpVariable",
    GB9860="P2POp mutation",
    GB5210="Constant fold with a rank-relative device",
)
_FSDP = _group(GB0053="FSDP with use_orig_params=False")
_DISABLED = _group(
    GB0098="Skip calling `torch.compiler.disable()`d function",
    GB0099="Skip inlining `torch.compiler.disable()`d function",
    # torch 2.15's name for a runtime torch._dynamo.disable() call (GB0007 before it; see
    # causes/renames.py).
    GB0376="Call to `torch._dynamo.disable()`",
)
_SKIPPED = _group(
    GB0007="Attempted to call function marked as skipped",
    GB0008="Attempted to inline function marked as skipped",
)
_EXPLICIT = _group(GB0025="Call to `torch._dynamo.graph_break()`")
_BUILTIN = _group(GB0059="Failed to trace builtin operator")
_LOGGING = _group(
    GB0291="logging.Logger method not supported for non-export cases",
    GB0296="attempted to reorder a debugging function that can't actually be reordered",
)
_PYTHON_TYPE = _group(GB4841="Unsupported python_type() call")
_HARD_ERROR = _group(
    GB4315="RuntimeError when making fake tensor call",
    GB0112="TypeError when making fake tensor call",
    GB0064="Fake tensor propagation exception",
    GB0087="NotImplementedError/UnsupportedFakeTensorException when running FX node",
    GB0090="Operator does not support running with fake tensors",
    GB0088="Observed exception",
    GB0089="Observed exception (EXCEPT_HANDLER)",
    GB0219="Backend compiler exception",
)

# --------------------------------------------------------------------------- location signals


_FSDP_FILE = re.compile(r"torch/distributed/(fsdp|_composable/fsdp)/")
_C10D_FILE = re.compile(
    r"torch/distributed/(distributed_c10d|_functional_collectives|_symmetric_memory)"
)
_EP_NAME = re.compile(r"dispatch|combine|all_?to_?all|expert_parallel", re.IGNORECASE)
_ROUTING_NAME = re.compile(
    r"tokens_per_expert|expert_bias|load_balanc|histc|bincount|count", re.IGNORECASE
)
_COLLECTIVE_TEXT = re.compile(
    r"collective|c10d|process.?group|\bP2P|isend|irecv|all_to_all|all_reduce|all_gather|"
    r"reduce_scatter|DeviceMesh|rank-relative",
    re.IGNORECASE,
)
_COLLECTIVE_OBJECT = re.compile(
    r"class `(Work|ProcessGroup\w*|P2POp)`|Variable\((Work|ProcessGroup\w*|P2POp)\)|"
    r"torch\.distributed\.distributed_c10d|_c10d_functional"
)
_FSDP_REASON = re.compile(r"skipping FSDP hooks", re.IGNORECASE)
_MUTATION_GB = re.compile(r"mutat|side effect", re.IGNORECASE)
_MUTATION_TEXT = re.compile(
    r"\b(mutating|mutated|mutation of|mutations? (to|on|inside)|side effect)", re.IGNORECASE
)
_BUILTIN_NAME = re.compile(r"builtin operator `([\w.]+)`|^builtin ([\w.]+)")
_PRINT_LIKE = frozenset({"print", "input", "breakpoint", "pprint"})
_SKIP_MODULE = re.compile(r"module:\s*([\w.<> ]+?),\s*qualname:\s*([\w.<>]+)")
_LOGGING_MODULE = re.compile(r"^(logging|_?warnings)(\.|$)")


def _norm(path: str) -> str:
    return (path or "").replace("\\", "/")


def _user_frames(frames: tuple[Location, ...]) -> tuple[Location, ...]:
    return tuple(f for f in frames if not is_torch_file(f.file))


def _local_frames(raw: RawBreak) -> tuple[Location, ...]:
    """Non-torch frames from the innermost ``forward`` on: the code of the module that broke
    and what it called (hooks, helpers), not the training script that called the model."""
    user = _user_frames(raw.frames)
    for i in range(len(user) - 1, -1, -1):
        if user[i].function == "forward":
            return user[i:]
    return user


def _trailing_library_frames(raw: RawBreak, hooks: FrameworkHooks) -> tuple[Location, ...]:
    """The innermost frame plus the torch/sharding frames directly above it: the code that
    was running when Dynamo broke (an FSDP hook) rather than code that merely wraps the
    model further out (FSDP1's forward)."""
    out: list[Location] = []
    for f in reversed(raw.frames):
        out.append(f)
        path = _norm(f.file)
        if not (is_torch_file(path) or _FSDP_FILE.search(path) or hooks.owns(path)):
            break
    return tuple(out)


def _text(raw: RawBreak) -> str:
    return "\n".join((raw.gb_type, raw.explanation, raw.context, raw.message))


def _skip_target(raw: RawBreak) -> tuple[str, str]:
    """(module, qualname) of a GB0007/GB0008 "marked as skipped" context, or ('', '')."""
    for source in (raw.context, raw.message):
        m = _SKIP_MODULE.search(source or "")
        if m:
            return m.group(1).strip(), m.group(2).strip()
    return "", ""


def _in_checkpoint(raw: RawBreak) -> bool:
    hop = raw.hop or ""
    if not hop and raw.message:
        hop = parse_reason(raw.message).hop or ""
    return raw.in_checkpoint or "checkpoint" in hop


def _is_data_dependent(raw: RawBreak) -> bool:
    gb = raw.gb_type.strip()
    return (
        gb in _DATA_DEPENDENT
        or gb.startswith("generic_jump")
        or gb == DATA_DEPENDENT_SPECIALIZATION
        or GUARD_DATA_DEPENDENT in raw.message
    )


def _is_collective(raw: RawBreak) -> bool:
    if raw.gb_type in _COLLECTIVE or _COLLECTIVE_TEXT.search(raw.gb_type):
        return True
    if _COLLECTIVE_OBJECT.search(f"{raw.explanation}\n{raw.context}"):
        # e.g. "Unsupported method call: ... method `wait` of class `Work`" after async_op=True
        return True
    if raw.gb_type in _SKIPPED:
        module, _ = _skip_target(raw)
        if module.startswith("torch.distributed") and "fsdp" not in module:
            return True
    frames = raw.frames
    return bool(frames) and bool(_C10D_FILE.search(_norm(frames[-1].file)))


def _module_parts(fqn: str) -> list[str]:
    return [p for p in (fqn or "").lower().split(".") if p]


def _points_at_routing(raw: RawBreak) -> bool:
    if raw.routing_state:
        return True  # measured by structure + source line (Locator.routing_state), names aside
    parts = _module_parts(raw.module)
    if any("router" in p for p in parts):
        return True
    if parts and parts[-1] == "gate" and any("moe" in p or "expert" in p for p in parts):
        return True
    if any(_ROUTING_NAME.search(f.function) for f in _local_frames(raw)):
        return True
    return bool(re.search(r"tokens_per_expert|expert_bias", raw.context + raw.explanation))


# --------------------------------------------------------------------------- rules


_TP_WORDS = ("DTensor", "AsyncCollectiveTensor", "redistribute", "Placement")
"""Words of DTensor itself. Not "DeviceMesh": EP, FSDP and plain DP look meshes up too (torch
2.11's ``self.ep_mesh.get_group()`` broke in ``device_mesh.py``, issue 34), so a mesh in the
message says nothing about tensor parallelism."""
_TP_FILE = re.compile(r"torch/distributed/tensor/(parallel/|_redistribute\.py)")
"""TP styles' hooks and DTensor redistribution (``capture/locate.py``'s ``tp`` code)."""
_SETUP_FILE = re.compile(r"(?:^|/)gbdoctor/setup/(ep|balance|fsdp|tp)\.py$")
_SETUP_COMPONENTS = {
    "ep": Component.EP,
    "balance": Component.LOAD_BALANCING,
    "fsdp": Component.FSDP,
    "tp": Component.TP,
}
"""gbdoctor's own setup modules -> the component whose code they install."""


def _component(raw: RawBreak) -> str:
    """The setup component the break came from: ``raw.component`` (the Locator matched a frame
    to a hook it knows), else the component of gbdoctor's setup module holding the innermost
    user frame (the Locator misses a hook frame whose code object it never saw, such as a
    mesh lookup traced as its own frame), else ``raw.component``."""
    if raw.component not in (Component.MODEL, Component.TORCH, Component.USER_HOOK):
        return raw.component
    user = _user_frames(raw.frames)
    m = _SETUP_FILE.search(_norm(user[-1].file)) if user else None
    return _SETUP_COMPONENTS[m.group(1)] if m else raw.component


def _tensor_parallel(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    """A TP break needs TP on the stack: the ``tp`` component, TP's files among the innermost
    library frames, or DTensor's own words in a break no other setup component claims."""
    component = _component(raw)
    if component == Component.TP:
        return True
    if any(_TP_FILE.search(_norm(f.file)) for f in _trailing_library_frames(raw, hooks)):
        return True
    if component not in (Component.MODEL, Component.TORCH):
        return False
    text = f"{raw.context}\n{raw.explanation}"
    return any(word in text for word in _TP_WORDS)


def recompile_cause(reason: str) -> str | None:
    """Cause id of a recompile whose failed guard is TP's (a DTensor placement or mesh, or an
    input that was an AsyncCollectiveTensor on one call and a plain Tensor on another); None
    for other guards."""
    words = (*_TP_WORDS, "DeviceMesh")  # a guard on a mesh: only TP puts meshes in inputs
    return "tensor-parallel" if any(word in reason for word in words) else None


def _zero_hook(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    if raw.component in hooks.components:
        return True
    return any(hooks.owns(_norm(f.file)) for f in _trailing_library_frames(raw, hooks))


def _fsdp_hook(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    if _component(raw) == Component.FSDP:
        return True
    if any(_FSDP_FILE.search(_norm(f.file)) for f in _trailing_library_frames(raw, hooks)):
        return True
    if raw.gb_type in _FSDP or re.search(r"\bFSDP\b", raw.gb_type):
        return True
    return bool(_FSDP_REASON.search(_text(raw)))


def _ep_dispatch(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    if _component(raw) == Component.EP:
        return True
    if not (_is_data_dependent(raw) or _is_collective(raw)):
        return False
    return any(
        _EP_NAME.search(f.function) or _EP_NAME.search(Path(_norm(f.file)).stem)
        for f in _local_frames(raw)
    )


def _backward_hook(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    if raw.gb_type in _BACKWARD_HOOK:
        return True
    if raw.component != Component.USER_HOOK:
        return False
    if any("backward" in f.function.lower() for f in _local_frames(raw)):
        return True
    return bool(
        re.search(r"backward.?hook|BackwardHook|compiled.?autograd", _text(raw), re.IGNORECASE)
    )


def _inplace_in_sac(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    if not _in_checkpoint(raw):
        return False
    if raw.gb_type in _HOP_SIDE_EFFECT:
        return True
    if _MUTATION_GB.search(raw.gb_type):
        return True
    return bool(_MUTATION_TEXT.search(f"{raw.explanation}\n{raw.context}"))


def _moe_load_balancing(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    if _component(raw) == Component.LOAD_BALANCING:
        return True
    if _is_data_dependent(raw):
        return _points_at_routing(raw)
    if raw.gb_type in _SKIPPED:
        # After a bincount break inside ``with torch.no_grad():`` the resumed frame breaks
        # again on the in-place counter update (``Tensor.add_`` "marked as skipped").
        _, qualname = _skip_target(raw)
        return qualname.startswith("Tensor.") and qualname.endswith("_") and _points_at_routing(raw)
    return False


def _data_dependent(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    return _is_data_dependent(raw)


def _collective(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    return _is_collective(raw)


def _compiler_disabled(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    if raw.gb_type in _DISABLED:
        return True
    if raw.gb_type in _SKIPPED:
        # torch._dynamo.disable(fn) called at runtime inside the region (FSDP2's pattern,
        # minus the FSDP frames the first rule looks for).
        module, qualname = _skip_target(raw)
        return module.startswith("torch._dynamo") and qualname.split(".")[-1] == "disable"
    return False


def _explicit(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    return raw.gb_type in _EXPLICIT


def _python_side_effect(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    gb = raw.gb_type
    if gb in _LOGGING:
        return True
    if gb in _BUILTIN:
        for source in (raw.explanation, raw.context, raw.message):
            m = _BUILTIN_NAME.search(source or "")
            if m:
                name = (m.group(1) or m.group(2)).split(".")[-1]
                return name in _PRINT_LIKE
        return False
    if gb in _PYTHON_TYPE:
        in_logging = any("/logging/" in _norm(f.file) for f in raw.frames)
        return in_logging or bool(re.search(r"Logg(ing|er)", raw.context))
    if gb in _SKIPPED:
        module, qualname = _skip_target(raw)
        return bool(_LOGGING_MODULE.match(module)) or qualname in _PRINT_LIKE
    # Python state mutated in a hook or HOP body outside activation checkpointing.
    return gb in _HOP_SIDE_EFFECT


def _error(raw: RawBreak, hooks: FrameworkHooks) -> bool:
    return raw.gb_type in _HARD_ERROR


RULE_ORDER: tuple[tuple[str, Callable[[RawBreak, FrameworkHooks], bool]], ...] = (
    ("zero-hook", _zero_hook),
    ("fsdp-hook", _fsdp_hook),
    ("ep-dispatch", _ep_dispatch),
    ("tensor-parallel", _tensor_parallel),
    ("backward-hook", _backward_hook),
    ("inplace-in-sac", _inplace_in_sac),
    ("moe-load-balancing", _moe_load_balancing),
    ("data-dependent", _data_dependent),
    ("collective", _collective),
    ("compiler-disabled", _compiler_disabled),
    ("explicit", _explicit),
    ("python-side-effect", _python_side_effect),
    ("error", _error),
)
"""(cause id, predicate) in the order :func:`classify` tries them; ``unsupported`` is last."""


def classify(raw: RawBreak, hooks: FrameworkHooks | None = None) -> str:
    """The cause id of one captured break: the first rule of :data:`RULE_ORDER` that matches.
    ``hooks``: the hook library of the framework that set the model up (none by default).

    Where the RawBreak's gb_type is empty but its message is not, the message is parsed for
    it (and for explanation and context) first. Anything no rule claims is ``unsupported``.
    """
    if raw.message and not (raw.gb_type and raw.explanation and raw.context):
        parsed = parse_reason(raw.message)
        raw = replace(
            raw,
            gb_type=raw.gb_type or parsed.gb_type,
            explanation=raw.explanation or parsed.explanation,
            context=raw.context or parsed.context,
            hop=raw.hop or parsed.hop,
        )
    for cause_id, rule in RULE_ORDER:
        if rule(raw, hooks or NO_FRAMEWORK_HOOKS):
            return cause_id
    return "unsupported"
