"""CUDA-graph readiness of compiled regions, read from the FX graphs a scan captures.

A CUDA graph replays recorded kernels on fixed memory. What decides whether a compiled region
can be captured and replayed is visible in its graphs, without a GPU:

- Dynamo's graph (Torch-level, as the code wrote it) shows where code asks for the host device:
  ``.to("cpu")``/``.cpu()`` and tensor factories with no ``device``.
- AOTAutograd's forward and backward graphs (ATen-level, what inductor compiles) show host
  reads (``_local_scalar_dense`` from ``.item()``/``.tolist()``), data-dependent shapes
  (unbacked symbols), RNG state operators, collectives, in-place writes into graph inputs, and
  which inputs are static (parameters and buffers: same address every call) and which must be
  copied into the recorded buffers on every replay.

Each finding has a kind, the graph node, its source line, and an effect: it ``blocks`` capture
(inductor would skip cudagraphs), costs a ``copy`` per replay, forces a ``re-record`` when a
value changes, or is ``allowed`` with a caveat. The verdicts mirror inductor's own checks
(``torch/_inductor/cudagraph_utils.py``, ``utils.get_first_incompatible_cudagraph_node``).
A block kind's verdict from its findings is ``capture.cudagraph_verdict``'s.

Device reasoning on a CPU scan. On CPU every tensor is a CPU tensor, so "this graph touches a
CPU tensor" says nothing. The question asked is "would this node be on the host when training
runs on CUDA?": a transfer whose source line names the host (``.cpu()``, ``"cpu"``) and a
factory call without ``device=`` (which defaults to the CPU) would; everything derived from
the inputs would follow them onto the GPU. On a CUDA scan the real devices are used instead.
A host read (``.item()``) is a sync on CUDA however the scan ran; on CPU a ``.to("cpu")`` of a
CPU tensor is a no-op that leaves no ATen node, which is why transfers are read from Dynamo's
graph.
"""

from __future__ import annotations

import linecache
import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from gbdoctor.capture.locate import innermost_user_location
from gbdoctor.records import (
    BlockerEffect,
    BlockerKind,
    CudaGraphFinding,
    Location,
)

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_HOST_READS = {
    "aten._local_scalar_dense.default",
    "aten.item.default",
    "aten.equal.default",
    "aten.is_nonzero.default",
    "aten._assert_scalar.default",
}
_RNG_HOPS_FORBIDDEN = {"run_and_save_rng_state", "run_with_rng_state"}
"""Inductor refuses these in a cudagraph (``FORBIDDEN_CUDAGRAPH_OPS``)."""
_RNG_HOPS_SAFE = {"graphsafe_run_with_rng_state"}
_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "_dtensor")
_FACTORIES = {
    torch.arange,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.tensor,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.linspace,
    torch.eye,
    torch.as_tensor,
}


@dataclass(frozen=True)
class GraphInfo:
    """One graph as the capture saw it: which region, which phase, which inputs are static."""

    region: str
    phase: str
    """``dynamo`` (Torch-level), ``forward`` or ``backward`` (ATen-level)."""
    index: int
    """The region's graph number (a break splits a region into several)."""

    @property
    def label(self) -> str:
        return f"{self.phase} {self.index}"


def _target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target
    name = getattr(target, "name", None)
    if callable(name):  # OpOverload.name() -> "aten::mm"; str() gives "aten.mm.default"
        return str(target)
    return getattr(target, "__name__", str(target))


def _location(node: torch.fx.Node | None) -> Location | None:
    seen: set[int] = set()
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        trace = node.meta.get("stack_trace") or ""
        frames = tuple(
            Location(file=f, line=int(n), function=fn) for f, n, fn in _FRAME.findall(trace)
        )
        if frames:
            return innermost_user_location(frames)
        # A node the functionalization pass added (``copy_`` back into an input) has no trace:
        # take the one of the value it writes.
        node = next((a for a in node.args[1:2] if isinstance(a, torch.fx.Node)), None)
    return None


def _source_line(node: torch.fx.Node) -> str:
    """The statement at the node's innermost frame (and the next two lines: a call split over
    lines names its arguments below the frame's line)."""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return ""
    file, line, _ = frames[-1]
    return " ".join(linecache.getline(file, int(line) + k).strip() for k in range(3))


def finding(
    kind: BlockerKind,
    effect: BlockerEffect,
    info: GraphInfo,
    node: torch.fx.Node | None,
    detail: str,
) -> CudaGraphFinding:
    return CudaGraphFinding(
        kind=kind,
        effect=effect,
        region=info.region,
        graph=info.label,
        node=node.name if node is not None else "",
        target=_target_name(node) if node is not None else "",
        location=_location(node),
        detail=detail,
    )


def _adder(
    out: list[CudaGraphFinding], info: GraphInfo
) -> Callable[[BlockerKind, BlockerEffect, torch.fx.Node, str], None]:
    """``add(kind, effect, node, detail)``: append that finding of graph ``info`` to ``out``."""

    def add(kind: BlockerKind, effect: BlockerEffect, node: torch.fx.Node, detail: str) -> None:
        out.append(finding(kind, effect, info, node, detail))

    return add


def _is_cuda(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cuda"


def _unbacked(value: Any) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        return bool(free_unbacked_symbols(value))
    except Exception:  # noqa: BLE001 - values free_unbacked_symbols cannot walk
        return False


def _symbolic_shape(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape)


# ------------------------------------------------------------------------------ Torch level


def dynamo_graph_findings(gm: torch.fx.GraphModule, info: GraphInfo) -> list[CudaGraphFinding]:
    """Host-device requests in Dynamo's graph: transfers to the CPU and factories without a device."""
    out: list[CudaGraphFinding] = []
    add = _adder(out, info)
    on_cuda = any(
        _is_cuda(n.meta.get("example_value")) for n in gm.graph.nodes if n.op == "placeholder"
    )
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.target in ("to", "cpu"):
            device = _to_device(node)
            explicit = node.target == "cpu" or "cpu" in _source_line(node)
            if device != "cpu" or not (explicit or on_cuda):
                continue
            if node.kwargs.get("non_blocking", False):
                add(
                    BlockerKind.CPU_TENSOR,
                    BlockerEffect.BLOCKS,
                    node,
                    "copies a tensor to the host: a CPU tensor inside the graph "
                    "(non_blocking, so no sync, but the graph spans two devices)",
                )
            else:
                add(
                    BlockerKind.HOST_SYNC,
                    BlockerEffect.BLOCKS,
                    node,
                    "blocking device-to-host copy: the host waits for the GPU",
                )
        elif (
            node.op == "call_function"
            and node.target in _FACTORIES
            and "device" not in node.kwargs
            and not on_cuda
        ):
            add(
                BlockerKind.CPU_TENSOR,
                BlockerEffect.BLOCKS,
                node,
                f"torch.{node.target.__name__} without device=: a CPU tensor when "
                "training runs on CUDA (pass device= from an input tensor)",
            )
    return out


def _to_device(node: torch.fx.Node) -> str | None:
    if node.target == "cpu":
        return "cpu"
    for arg in (*node.args[1:], node.kwargs.get("device")):
        if isinstance(arg, (str, torch.device)):
            return torch.device(arg).type
    return None


# ------------------------------------------------------------------------------ ATen level


_SOURCE_ITEM = re.compile(
    r"(?:\.__dict__\['_modules'\]|\._modules|\._parameters|\._buffers)\['([^']+)'\]"
)
_LOCAL = re.compile(r"^L\['([^']+)'\]")
_TORCH_WRAPPERS = frozenset(("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module"))
"""Attributes torch's own wrappers insert into a module path (checkpoint_wrapper, torch.compile,
FSDP1); torch.distributed.checkpoint leaves them out of its FQNs the same way."""


def dynamo_input_name(node: torch.fx.Node) -> str:
    """The path a Dynamo graph input is read from, from the compiled frame's locals:
    ``self.feed_forward.w3.weight`` for the source
    ``L['self']._modules['feed_forward']._modules['w3']._parameters['weight']`` (which Dynamo's
    placeholder name mangles to ``l_self_modules_feed_forward_modules_w3_parameters_weight_``),
    ``args[0]`` for ``L['args'][0]``. The placeholder's name where Dynamo recorded no source."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", None)
    if callable(name):  # a method in older torch, a property in newer
        name = name()
    if not isinstance(name, str):
        return node.name
    path = _LOCAL.sub(r"\1", _SOURCE_ITEM.sub(r".\1", name))
    return ".".join(part for part in path.split(".") if part not in _TORCH_WRAPPERS)


def input_label(placeholders: Sequence[torch.fx.Node], input_names: Sequence[str], i: int) -> str:
    """How a finding names input ``i`` of an ATen graph: the path Dynamo read it from
    (:func:`dynamo_input_name`: ``self.feed_forward.w1.weight``) where the caller has one name per
    placeholder, else the placeholder's (``primals_3``)."""
    if input_names and len(input_names) == len(placeholders):
        return input_names[i]
    return placeholders[i].name


@dataclass(frozen=True)
class WatchedInput:
    """The real tensor behind one static input of a forward graph, seen on its first call."""

    tensor: weakref.ref[torch.Tensor]
    info: GraphInfo
    node: torch.fx.Node
    shown: str


def released_static_inputs(watched: Sequence[WatchedInput]) -> list[CudaGraphFinding]:
    """Static inputs whose memory was freed by the end of the captured steps (storage resized to
    0 while the tensor lives on, as FSDP2's reshard does): a cudagraph records
    their address, the next gather allocates them elsewhere, and cudagraph trees record again
    ("static input data pointer changed"; torch 2.11 stops after
    ``cudagraph_unexpected_rerecord_limit`` and skips the function, 2.13 no longer counts these
    and re-records on). Measured on an H200 (docs/gpu.md): 28 re-recordings in 12 steps
    of llama4's dense blocks under FSDP2, ``reduce-overhead`` at 0.44x the plain compile's
    throughput. A tensor already collected says nothing (it may have been a temporary)."""
    out: list[CudaGraphFinding] = []
    for w in watched:
        tensor = w.tensor()
        if tensor is None or tensor.untyped_storage().nbytes() > 0:
            continue
        out.append(
            finding(
                BlockerKind.RELEASED_STATIC_INPUT,
                BlockerEffect.BLOCKS,
                w.info,
                w.node,
                f"{w.shown}: a parameter whose memory the setup frees after each step (FSDP2's "
                "reshard): gathered again at another address, so cudagraph "
                "trees record the graph again whenever the address differs "
                "(pytorch/pytorch#183451); keep it resident or gather it inside the compiled "
                "graph",
            )
        )
    return out


def aten_graph_findings(
    gm: torch.fx.GraphModule,
    inputs: Sequence[Any],
    static: Iterable[int],
    info: GraphInfo,
    input_names: Sequence[str] = (),
) -> list[CudaGraphFinding]:
    """Findings in one AOTAutograd forward or backward graph.

    ``static``: indices of the inputs a cudagraph may assume keep their address (forward:
    parameters and buffers, from AOTAutograd's metadata; backward: everything but the tangents,
    which are the saved outputs of a cudagraphed forward, as inductor assumes)."""
    static = set(static)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {n: i for i, n in enumerate(placeholders)}
    out: list[CudaGraphFinding] = []
    add = _adder(out, info)
    on_cuda = any(_is_cuda(n.meta.get("val")) for n in placeholders)
    for i, node in enumerate(placeholders):
        if node.users and all(
            _target_name(u) in _RNG_HOPS_FORBIDDEN | _RNG_HOPS_SAFE for u in node.users
        ):
            continue  # the saved RNG state of a recomputed op: reported with that op
        value = node.meta.get("val", inputs[i] if i < len(inputs) else None)
        shown = input_label(placeholders, input_names, i)
        if isinstance(value, (torch.SymInt, int)) and not isinstance(value, bool):
            unbacked = _unbacked(value)
            add(
                BlockerKind.SYMINT_INPUT,
                BlockerEffect.BLOCKS if unbacked else BlockerEffect.RERECORD,
                node,
                "data-dependent integer input (an unbacked symbol): a new value every step"
                if unbacked
                else "symbolic integer input: one recording per distinct value",
            )
        elif isinstance(value, torch.Tensor):
            if _unbacked(value):
                add(
                    BlockerKind.DYNAMIC_SHAPE,
                    BlockerEffect.BLOCKS,
                    node,
                    "input with a data-dependent size",
                )
            elif _symbolic_shape(value):
                add(
                    BlockerKind.DYNAMIC_SHAPE,
                    BlockerEffect.RERECORD,
                    node,
                    "input with a symbolic size: one recording per distinct shape",
                )
            if i not in static:
                add(
                    BlockerKind.INPUT_COPY,
                    BlockerEffect.COPY,
                    node,
                    f"{shown}: not a static input (activations are not, nor are buffers of "
                    "FSDP-managed modules): copied into the recorded buffer on every replay "
                    "(free if a preceding cudagraph produced it)",
                )
        elif (
            value is not None
            and not isinstance(value, (torch.Generator, bool))
            and "ScriptObject" not in type(value).__name__
        ):  # a process group: opaque, allowed
            add(
                BlockerKind.SYMINT_INPUT,
                BlockerEffect.BLOCKS,
                node,
                f"non-tensor input of type {type(value).__name__}",
            )
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = _target_name(node)
        if name in _HOST_READS:
            add(
                BlockerKind.HOST_SYNC,
                BlockerEffect.BLOCKS,
                node,
                "reads a tensor value on the host (.item()/.tolist()): a device sync",
            )
            continue
        if name in _RNG_HOPS_FORBIDDEN:
            if on_cuda:
                add(
                    BlockerKind.RNG_STATE,
                    BlockerEffect.BLOCKS,
                    node,
                    "saves/restores the RNG state on the host (inductor refuses it in a "
                    "cudagraph; graphsafe_rng_functionalization is off or several devices)",
                )
            else:
                # CPU generators have no graph-safe variant; on one CUDA device the partitioner
                # emits graphsafe_run_with_rng_state instead (functorch graphsafe_rng_functionalization).
                add(
                    BlockerKind.RNG_STATE,
                    BlockerEffect.ALLOWED,
                    node,
                    "RNG state threaded through a recomputed op (checkpoint): on CUDA it "
                    "becomes graphsafe_run_with_rng_state, capturable with the generator "
                    "registered to the graph; on the CPU it is run_and_save_rng_state",
                )
            continue
        if name in _RNG_HOPS_SAFE:
            add(
                BlockerKind.RNG_STATE,
                BlockerEffect.ALLOWED,
                node,
                "RNG state threaded through the graph-safe generator: capturable when the "
                "generator is registered with the graph",
            )
            continue
        if (
            isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in node.target.tags
        ):
            add(
                BlockerKind.RNG_STATE,
                BlockerEffect.ALLOWED,
                node,
                "random op: replays reuse the captured seed offsets unless the generator's "
                "state is registered with the graph (inductor does this)",
            )
            continue
        namespace = getattr(node.target, "namespace", "")
        if namespace in _COLLECTIVE_NAMESPACES and "wait" not in name:
            add(
                BlockerKind.COLLECTIVE,
                BlockerEffect.ALLOWED,
                node,
                "collective: capturable with NCCL if every rank replays the same graphs "
                "(not with gloo)",
            )
            continue
        if _mutates_placeholder(node, index):
            target_input = node.args[0]
            j = index[target_input]
            shown = input_label(placeholders, input_names, j)
            if j in static:
                add(
                    BlockerKind.MUTATED_INPUT,
                    BlockerEffect.ALLOWED,
                    node,
                    f"writes in place into {shown}, a static input: allowed "
                    "while its address never changes (replays write the same memory)",
                )
            else:
                add(
                    BlockerKind.MUTATED_INPUT,
                    BlockerEffect.BLOCKS,
                    node,
                    f"writes in place into {shown}, a non-static input "
                    "(inductor skips: 'mutated inputs')",
                )
            continue
        value = node.meta.get("val")
        if _unbacked(value):
            add(
                BlockerKind.DYNAMIC_SHAPE,
                BlockerEffect.BLOCKS,
                node,
                "data-dependent shape or value (unbacked symbol): inductor disables cudagraphs",
            )
        elif on_cuda and isinstance(value, torch.Tensor) and value.device.type == "cpu":
            add(BlockerKind.CPU_TENSOR, BlockerEffect.BLOCKS, node, "CPU tensor in a CUDA graph")
    return out


def _mutates_placeholder(node: torch.fx.Node, index: dict[torch.fx.Node, int]) -> bool:
    if not node.args or node.args[0] not in index:
        return False
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write
