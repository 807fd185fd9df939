"""Cause taxonomy, Dynamo reason parsing and the classification rules.

This is the ONLY module that reads Dynamo's message text. Everything else handles records:
``capture.py`` turns log records into :class:`~gbdoctor.records.RawBreak` (using
:func:`parse_reason` for the gb_type, explanation, hints, context and HOP), and
:func:`classify` maps each one to a cause id from :data:`CAUSES`.

Three signals decide the cause (DESIGN.md section 6):

1. the ``gb_type`` (the first line of Dynamo's reason), looked up by its registry text; the
   registry shipped with the installed torch (``torch/_dynamo/graph_break_registry.json``)
   maps it to a stable id (``GB0059``) so renamed types still match;
2. whether the break sits inside an activation-checkpoint higher-order op;
3. where it happened: the setup component that installed the code (``raw.component``), the
   user frames and the module FQN.

The rules are ordered; the first that matches wins (:data:`RULE_ORDER`):

1. ``fsdp-hook``: component ``fsdp``; an FSDP2/FSDP/ZeRO-3 file among the innermost
   library frames; a ``disable`` reason "skipping FSDP hooks"; an FSDP gb_type.
2. ``ep-dispatch``: component ``ep``; or a data-dependent/collective break whose local
   frames (from the innermost ``forward`` on) name dispatch/combine/all_to_all code.
3. ``backward-hook``: hook gb_types needing compiled autograd (GB0083, GB0029, GB5821, ...);
   or component ``user-hook`` with backward-hook code on the stack.
4. ``inplace-in-sac``: inside a checkpoint HOP and a side-effect/mutation gb_type (GB0067,
   GB4413, GB1177, GB0041) or a message about mutation.
5. ``moe-load-balancing``: component ``load-balancing``; or a data-dependent break (or the
   ``Tensor.add_`` follow-on of one) in MoE routing code (a ``router`` module, or local
   frames about tokens_per_expert/expert_bias/counting).
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

import functools
import importlib.util
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from gbdoctor.errors import SpecError
from gbdoctor.records import Location, RawBreak

__all__ = [
    "CAUSES",
    "CAUSE_IDS",
    "EFFORTS",
    "OWNERS",
    "PLAN_ACTIONS",
    "RULE_ORDER",
    "Cause",
    "Reason",
    "RegistryEntry",
    "classify",
    "explain_cause",
    "gb_id_for",
    "gb_id_from_text",
    "load_registry",
    "parse_reason",
    "parse_reasons",
    "registry",
    "registry_path",
]

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
)
"""Fix kinds a planner can apply:

- ``isolate-child``: compile the clean children with fullgraph=True, leave the breaking child eager;
- ``split-ac``: wrap AC/SAC per child so a break in one child does not send the others to eager;
- ``flag:<name>``: set ``torch._dynamo.config.<name> = True``;
- ``move-out-of-region``: move the offending code (hook, update) outside the compiled region;
- ``model-change``: only the model author can fix it (edit the code).
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
        title="FSDP/ZeRO sharding hook inside the compiled region",
        explanation=(
            "Sharding hooks (FSDP2 fully_shard pre/post-forward, ZeRO-3 parameter gather) are "
            "torch._dynamo.disable'd, so a compiled region that contains a sharded module breaks."
        ),
        fixes=(
            "compile each block before fully_shard and never compile a module that contains "
            "separately sharded children (torchtitan's order: compile, then FSDP)",
            "compile the children of the sharded module (attention, feed_forward, ...) instead of "
            "its __call__, so that the FSDP hooks run outside every compiled region",
            "with EP, keep moe.experts (sharded on its own) eager and compile the other MoE "
            "children with fullgraph=True",
            "compile module.forward rather than the module, so nn.Module.__call__ runs the hooks eagerly",
        ),
        owner="training-setup",
        effort="easy",
        plan_actions=("isolate-child", "move-out-of-region"),
    ),
    Cause(
        id="ep-dispatch",
        title="Expert-parallel token dispatch/combine",
        explanation=(
            "EP dispatch/combine turns all-to-all split sizes into Python ints (.tolist(), a "
            "device-to-host sync), a data-dependent break in every MoE layer."
        ),
        fixes=(
            "set torch._dynamo.config.capture_scalar_outputs = True (torchtitan's apply_compile "
            "does) so the split sizes become SymInts and the all-to-all stays in the graph",
            "compile the MoE children but leave moe.experts, with its dispatch/combine hooks, eager",
            "use a fixed-capacity dispatch (padded, static split sizes) so no host sync is needed",
        ),
        owner="training-setup",
        effort="easy",
        plan_actions=("flag:capture_scalar_outputs", "isolate-child"),
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
            "update expert_bias outside the compiled region (an optimizer pre-step hook, as "
            "torchtitan does) and only accumulate tokens_per_expert in forward",
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
            "(torchtitan does) when the side effect need not be replayed in backward",
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

CAUSES: dict[str, Cause] = {c.id: c for c in _CAUSE_LIST}
"""Every cause, keyed by its kebab-case id (the JSON contract)."""

CAUSE_IDS: tuple[str, ...] = tuple(CAUSES)


def explain_cause(cause_id: str) -> Cause:
    """The :class:`Cause` for ``cause_id``; :class:`SpecError` naming the valid ids otherwise."""
    try:
        return CAUSES[cause_id]
    except KeyError:
        raise SpecError(
            f"unknown cause {cause_id!r}",
            hint=f"valid causes: {', '.join(CAUSE_IDS)}",
        ) from None


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True, kw_only=True, slots=True)
class RegistryEntry:
    """One gb_type of the installed torch's graph-break registry."""

    gb_id: str
    gb_type: str
    explanation: str
    """Dynamo's explanation template for this gb_type (may hold ``{placeholders}``)."""
    hints: tuple[str, ...]


def registry_path() -> Path | None:
    """``torch/_dynamo/graph_break_registry.json`` of the installed torch (no torch import)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("built-in", "namespace"):
        roots = [Path(spec.origin).parent]
    else:
        roots = [Path(p) for p in (spec.submodule_search_locations or ())]
    for root in roots:
        path = root / "_dynamo" / "graph_break_registry.json"
        if path.is_file():
            return path
    return None


def load_registry(path: Path | str) -> dict[str, RegistryEntry]:
    """Parse a registry file: every variant's ``Gb_type`` -> its id, explanation and hints.

    The file maps ``GBxxxx`` to a list of variants, newest first. Newest variants win over
    older ones when two ids share a name (torch calls that case undefined); among newest
    variants the lower id wins. Template names such as ``_gb_type`` are skipped.
    Raises ``OSError``/``ValueError`` on an unreadable file.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of GB ids")
    by_age: list[tuple[int, str, dict]] = []
    for gb_id, variants in data.items():
        if not isinstance(variants, list):
            continue
        for age, variant in enumerate(variants):
            if isinstance(variant, dict):
                by_age.append((age, str(gb_id), variant))
    by_age.sort(key=lambda item: (item[0], item[1]))
    out: dict[str, RegistryEntry] = {}
    for _, gb_id, variant in by_age:
        name = variant.get("Gb_type")
        if not isinstance(name, str) or not name.strip() or name.startswith("_"):
            continue
        name = name.strip()
        if name in out:
            continue
        hints = variant.get("Hints") or ()
        if isinstance(hints, str):
            hints = (hints,)
        out[name] = RegistryEntry(
            gb_id=gb_id,
            gb_type=name,
            explanation=str(variant.get("Explanation") or ""),
            hints=tuple(str(h) for h in hints),
        )
    return out


@functools.cache
def registry() -> dict[str, RegistryEntry]:
    """The installed torch's registry (cached); empty when the file is absent or unreadable."""
    path = registry_path()
    if path is None:
        return {}
    try:
        return load_registry(path)
    except (OSError, ValueError):
        return {}


_GB_URL = re.compile(r"/gb/gb(\d{4})\.html", re.IGNORECASE)


def gb_id_from_text(text: str) -> str | None:
    """The id in the graph-break site URL that ends Dynamo's message (``gb0059.html``)."""
    m = _GB_URL.search(text or "")
    return f"GB{m.group(1)}" if m else None


def gb_id_for(gb_type: str, message: str = "") -> str | None:
    """Registry id for ``gb_type`` (``GB0059``); falls back to the URL in ``message``.

    None when the registry file is absent and the message has no URL, or the type is unknown.
    """
    entry = registry().get((gb_type or "").strip())
    if entry is not None:
        return entry.gb_id
    return gb_id_from_text(message) if message else None


# --------------------------------------------------------------------------- parsing


class Reason(NamedTuple):
    """Dynamo's reason text split into its parts (a plain tuple for callers)."""

    gb_type: str
    explanation: str
    hints: tuple[str, ...]
    context: str
    hop: str | None


DATA_DEPENDENT_BRANCHING = "Data-dependent branching"

_HEADER = re.compile(r"^Graph break\b.*\bin user code at ")
_REASON_PREFIX = "Graph Break Reason:"
_STOP = (
    "User code traceback:",
    "Stack variable source attribution:",
    "from user code:",
    "Set TORCHDYNAMO_VERBOSE=1",
)
_NEXT_REASON = "*** While handling this graph break, another graph break occurred: ***"
_FIELD = re.compile(
    r"^\s*(Higher Order Operator|Explanation|Hint|Developer debug context):\s?(.*)$"
)
_MORE = re.compile(r"^\s*For more details about this graph break")
_GUARD_DD = "Could not guard on data-dependent expression"


def parse_reasons(text: str) -> list[Reason]:
    """Every reason in a text: a log record can chain a second one (``graph break in loop``)."""
    return [_parse_one(chunk) for chunk in (text or "").split(_NEXT_REASON)]


def parse_reason(text: str) -> Reason:
    """Split one Dynamo reason (or a whole ``graph_breaks`` log record) into its parts.

    Layout: ``<gb_type>``, optional ``  Higher Order Operator: X``, ``  Explanation: ...``,
    repeated ``  Hint: ...``, ``  Developer debug context: ...``, then the "For more
    details" URL. The log record's header lines and trailing traceback are skipped; of a
    chained record only the first reason is read (:func:`parse_reasons` reads all). The
    ``generic_jump``/"Could not guard on data-dependent expression" form (no registry
    layout) becomes ``Data-dependent branching``. Never raises: odd text gives its first
    line as gb_type and empty fields.
    """
    return _parse_one((text or "").split(_NEXT_REASON)[0])


def _body_lines(text: str) -> list[str]:
    lines: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if any(stripped.startswith(s) for s in _STOP):
            break
        if _HEADER.match(stripped):
            continue
        if stripped.startswith(_REASON_PREFIX):
            rest = stripped[len(_REASON_PREFIX):].strip()
            # "Encountered graph break when attempting to trace CALL: ...:" is a header;
            # "Graph Break Reason: Data-dependent branching" carries the gb_type inline.
            if not rest or rest.endswith(":"):
                continue
            line = rest
        lines.append(line.rstrip())
    while lines and not lines[0].strip():
        lines.pop(0)
    return lines


def _parse_one(text: str) -> Reason:
    lines = _body_lines(text)
    if not lines:
        return Reason("", "", (), "", None)

    hop = None
    for line in lines:
        m = _FIELD.match(line)
        if m and m.group(1) == "Higher Order Operator":
            hop = m.group(2).strip() or None
            break

    first_field = next(
        (i for i, line in enumerate(lines) if (m := _FIELD.match(line)) and m.group(1) != "Higher Order Operator"),
        None,
    )
    if first_field is None:
        return _parse_unstructured(lines, hop)

    gb_type = ""
    for line in reversed(lines[:first_field]):
        if line.strip() and not _FIELD.match(line):
            gb_type = line.strip()
            break

    explanation: list[str] = []
    hints: list[list[str]] = []
    context: list[str] = []
    current: list[str] | None = None
    for line in lines[first_field:]:
        if _MORE.match(line):
            break
        m = _FIELD.match(line)
        if m:
            name, value = m.group(1), m.group(2).strip()
            if name == "Explanation":
                current = explanation
            elif name == "Hint":
                hints.append([])
                current = hints[-1]
            elif name == "Developer debug context":
                current = context
            else:
                current = None
                continue
            if value:
                current.append(value)
        elif not line.strip():
            current = None
        elif current is not None:
            current.append(line.strip())
    return Reason(
        gb_type=gb_type,
        explanation="\n".join(explanation),
        hints=tuple("\n".join(h) for h in hints if h),
        context="\n".join(context),
        hop=hop,
    )


def _parse_unstructured(lines: list[str], hop: str | None) -> Reason:
    first = lines[0].strip()
    body = "\n".join(lines)
    if first.startswith("generic_jump") or _GUARD_DD in body:
        explanation = next((ln.strip() for ln in lines if _GUARD_DD in ln), "")
        caused_by = next((ln.strip() for ln in lines if ln.strip().startswith("Caused by:")), "")
        context = first if first.startswith("generic_jump") else caused_by
        return Reason(DATA_DEPENDENT_BRANCHING, explanation, (), context, hop)
    rest = [ln.strip() for ln in lines[1:] if ln.strip() and not _MORE.match(ln)]
    return Reason(first, "\n".join(rest), (), "", hop)


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

_FSDP_FILE = re.compile(
    r"torch/distributed/(fsdp|_composable/fsdp)/|deepspeed/runtime/zero/"
)
_C10D_FILE = re.compile(r"torch/distributed/(distributed_c10d|_functional_collectives|_symmetric_memory)")
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
_MUTATION_TEXT = re.compile(r"\b(mutating|mutated|mutation of|mutations? (to|on|inside)|side effect)", re.IGNORECASE)
_BUILTIN_NAME = re.compile(r"builtin operator `([\w.]+)`|^builtin ([\w.]+)")
_PRINT_LIKE = frozenset({"print", "input", "breakpoint", "pprint"})
_SKIP_MODULE = re.compile(r"module:\s*([\w.<> ]+?),\s*qualname:\s*([\w.<>]+)")
_LOGGING_MODULE = re.compile(r"^(logging|_?warnings)(\.|$)")


def _norm(path: str) -> str:
    return (path or "").replace("\\", "/")


@functools.cache
def _torch_dir() -> str | None:
    path = registry_path()
    return _norm(str(path.parent.parent)) + "/" if path else None


def _is_torch_file(path: str) -> bool:
    path = _norm(path)
    root = _torch_dir()
    if root and path.startswith(root):
        return True
    return bool(re.search(r"(site|dist)-packages/torch/", path))


def _user_frames(frames: tuple[Location, ...]) -> tuple[Location, ...]:
    return tuple(f for f in frames if not _is_torch_file(f.file))


def _local_frames(raw: RawBreak) -> tuple[Location, ...]:
    """Non-torch frames from the innermost ``forward`` on: the code of the module that broke
    and what it called (hooks, helpers), not the training script that called the model."""
    user = _user_frames(raw.frames)
    for i in range(len(user) - 1, -1, -1):
        if user[i].function == "forward":
            return user[i:]
    return user


def _trailing_library_frames(raw: RawBreak) -> tuple[Location, ...]:
    """The innermost frame plus the torch/sharding frames directly above it: the code that
    was running when Dynamo broke (an FSDP hook) rather than code that merely wraps the
    model further out (FSDP1's forward)."""
    out: list[Location] = []
    for f in reversed(raw.frames):
        out.append(f)
        path = _norm(f.file)
        if not (_is_torch_file(path) or _FSDP_FILE.search(path)):
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
    return gb in _DATA_DEPENDENT or gb.startswith("generic_jump") or _GUARD_DD in raw.message


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
    parts = _module_parts(raw.module)
    if any("router" in p for p in parts):
        return True
    if parts and parts[-1] == "gate" and any("moe" in p or "expert" in p for p in parts):
        return True
    if any(_ROUTING_NAME.search(f.function) for f in _local_frames(raw)):
        return True
    return bool(re.search(r"tokens_per_expert|expert_bias", raw.context + raw.explanation))


# --------------------------------------------------------------------------- rules


def _fsdp_hook(raw: RawBreak) -> bool:
    if raw.component == "fsdp":
        return True
    if any(_FSDP_FILE.search(_norm(f.file)) for f in _trailing_library_frames(raw)):
        return True
    if raw.gb_type in _FSDP or re.search(r"\bFSDP\b", raw.gb_type):
        return True
    return bool(_FSDP_REASON.search(_text(raw)))


def _ep_dispatch(raw: RawBreak) -> bool:
    if raw.component == "ep":
        return True
    if not (_is_data_dependent(raw) or _is_collective(raw)):
        return False
    return any(
        _EP_NAME.search(f.function) or _EP_NAME.search(Path(_norm(f.file)).stem)
        for f in _local_frames(raw)
    )


def _backward_hook(raw: RawBreak) -> bool:
    if raw.gb_type in _BACKWARD_HOOK:
        return True
    if raw.component != "user-hook":
        return False
    if any("backward" in f.function.lower() for f in _local_frames(raw)):
        return True
    return bool(re.search(r"backward.?hook|BackwardHook|compiled.?autograd", _text(raw), re.IGNORECASE))


def _inplace_in_sac(raw: RawBreak) -> bool:
    if not _in_checkpoint(raw):
        return False
    if raw.gb_type in _HOP_SIDE_EFFECT:
        return True
    if _MUTATION_GB.search(raw.gb_type):
        return True
    return bool(_MUTATION_TEXT.search(f"{raw.explanation}\n{raw.context}"))


def _moe_load_balancing(raw: RawBreak) -> bool:
    if raw.component == "load-balancing":
        return True
    if _is_data_dependent(raw):
        return _points_at_routing(raw)
    if raw.gb_type in _SKIPPED:
        # After a bincount break inside ``with torch.no_grad():`` the resumed frame breaks
        # again on the in-place counter update (``Tensor.add_`` "marked as skipped").
        _, qualname = _skip_target(raw)
        return qualname.startswith("Tensor.") and qualname.endswith("_") and _points_at_routing(raw)
    return False


def _data_dependent(raw: RawBreak) -> bool:
    return _is_data_dependent(raw)


def _collective(raw: RawBreak) -> bool:
    return _is_collective(raw)


def _compiler_disabled(raw: RawBreak) -> bool:
    if raw.gb_type in _DISABLED:
        return True
    if raw.gb_type in _SKIPPED:
        # torch._dynamo.disable(fn) called at runtime inside the region (FSDP2's pattern,
        # minus the FSDP frames the first rule looks for).
        module, qualname = _skip_target(raw)
        return module.startswith("torch._dynamo") and qualname.split(".")[-1] == "disable"
    return False


def _explicit(raw: RawBreak) -> bool:
    return raw.gb_type in _EXPLICIT


def _python_side_effect(raw: RawBreak) -> bool:
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


def _error(raw: RawBreak) -> bool:
    return raw.gb_type in _HARD_ERROR


RULE_ORDER: tuple[tuple[str, Callable[[RawBreak], bool]], ...] = (
    ("fsdp-hook", _fsdp_hook),
    ("ep-dispatch", _ep_dispatch),
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


def classify(raw: RawBreak) -> str:
    """The cause id of one captured break: the first rule of :data:`RULE_ORDER` that matches.

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
        if rule(raw):
            return cause_id
    return "unsupported"



_TRACEBACK_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')


def parse_graph_break_log(message: str) -> tuple[str, tuple[Location, ...]] | None:
    """A ``graph_breaks`` log record -> (reason text, user traceback frames outermost first).

    Used only when the structured interception in ``capture.py`` is unavailable. Returns None
    for records that are not graph-break records.
    """
    if "Graph Break Reason:" not in (message or ""):
        return None
    reason = message.split("Graph Break Reason:", 1)[1]
    body, _, trace = reason.partition("User code traceback:")
    frames = tuple(Location(file=m["file"], line=int(m["line"]), function=m["fn"])
                   for m in (_TRACEBACK_FRAME.match(line) for line in trace.splitlines()) if m)
    return body.strip(), frames
