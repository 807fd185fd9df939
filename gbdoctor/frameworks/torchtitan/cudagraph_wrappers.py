"""Readiness for torchtitan's own CUDA-graph wrappers, predicted on CPU.

torchtitan 0.3 has two, both around the whole training step rather than one compiled region:

- ``distributed/cudagraph.py`` (the core ``Trainer``, on unless ``training.disable_cuda_graphs``):
  wraps ``_forward_backward_body``. Every tensor argument (the token ids, the labels,
  ``global_valid_tokens`` and the tensors of the extra kwargs, a ``BlockMask`` flattened by its
  ``CUDAGraphInputSpec``) is copied into the recorded buffers on every replay; shapes, dtypes
  and devices must stay the same and non-tensor arguments equal, or it raises.
- ``experiments/graph_trainer/cudagraph.py`` (``cudagraph_pass``, on unless listed in
  ``compile.disable_passes``): wraps graph_trainer's traced step graph. Parameters and buffers
  are static; the same batch tensors are copied; ``is_cudagraphable`` decides, node by node,
  what cannot be captured (host reads, symbolic shapes, unpinned host copies, host-only ops,
  ``_grouped_mm`` below sm_100); its ``CUDAGraphWrapper`` accepts tensor, int, float,
  Generator and opaque inputs only.

Per compiled region, ``wrapper_graph_check`` runs the installed ``is_cudagraphable`` and the
wrapper's input validation on every ATen graph the scan captures (a capture session graph
check, beside inductor's own readiness); any blocking finding stops a wrapper that captures the
whole step. ``step_copies_note`` says what the wrappers would copy per replay, with sizes, from
the batch torchtitan's own ``post_dataloading_process`` built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from gbdoctor.capture.cudagraphs import GraphInfo, finding
from gbdoctor.records import BlockerEffect, BlockerKind, CudaGraphFinding

_PASS = "graph_trainer's cudagraph_pass"
_HOST_COPIES = ("aten.copy_.default", "aten._to_copy.default")


def _on_cpu(gm: torch.fx.GraphModule) -> bool:
    values = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    return not tensors or all(t.device.type == "cpu" for t in tensors)


def _reason(node: torch.fx.Node, cpu_scan: bool) -> tuple[BlockerKind, str] | None:
    """Why the installed ``is_cudagraphable`` rejected ``node`` (None: only because this scan
    runs on the CPU, where every op is a host op; on CUDA it would be captured)."""
    from torchtitan.experiments.graph_trainer.cudagraph import _has_dynamic_shape

    name = str(node.target)
    if name == "aten._local_scalar_dense.default":
        return BlockerKind.HOST_SYNC, "reads a tensor value on the host (.item()/.tolist())"
    if _has_dynamic_shape(node.meta.get("val")) or any(
        _has_dynamic_shape(n.meta.get("val")) for n in node.all_input_nodes
    ):
        return BlockerKind.DYNAMIC_SHAPE, "symbolic (data-dependent) shape: runs outside the graph"
    devices = {
        v.device.type
        for n in (node, *node.all_input_nodes)
        if isinstance(v := n.meta.get("val"), torch.Tensor)
    }
    if name in _HOST_COPIES and len(devices) > 1:
        return BlockerKind.CPU_TENSOR, "copy between the host and the GPU from unpinned memory"
    if cpu_scan:
        return None
    return BlockerKind.CPU_TENSOR, "host-only op (every tensor it touches is on the CPU)"


def wrapper_graph_check(
    gm: torch.fx.GraphModule, inputs: Sequence[Any], static: Sequence[int], info: GraphInfo
) -> list[CudaGraphFinding]:
    """The installed graph_trainer ``is_cudagraphable`` on every node of one ATen graph, and its
    ``CUDAGraphWrapper`` input validation on every non-tensor input."""
    from torchtitan.experiments.graph_trainer.cudagraph import CUDAGraphWrapper, is_cudagraphable

    cpu_scan = _on_cpu(gm)
    out: list[CudaGraphFinding] = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        value = node.meta.get("val", inputs[i] if i < len(inputs) else None)
        if isinstance(value, (torch.Tensor, torch.SymInt, int, float)) or value is None:
            continue  # tensors and (symbolic) sizes: judged on the nodes that use them
        try:
            CUDAGraphWrapper._validate_inputs(None, [value])  # type: ignore[arg-type]
        except ValueError:
            out.append(
                finding(
                    BlockerKind.SYMINT_INPUT,
                    BlockerEffect.BLOCKS,
                    info,
                    node,
                    f"{_PASS}: its CUDAGraphWrapper refuses a {type(value).__name__} input "
                    "(tensor, int, float, Generator or opaque only)",
                )
            )
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        try:
            capturable = is_cudagraphable(node)
        except (RuntimeError, AssertionError, AttributeError):
            # aten._grouped_mm: it asks torch.cuda.get_device_capability(), and there is none.
            out.append(
                finding(
                    BlockerKind.HOST_SYNC,
                    BlockerEffect.ALLOWED,
                    info,
                    node,
                    f"{_PASS}: runs {node.target} outside the graph below sm_100 (hidden host "
                    "copies); captured on sm_100 and newer",
                )
            )
            continue
        if capturable:
            continue
        reason = _reason(node, cpu_scan)
        if reason is not None:
            kind, why = reason
            out.append(finding(kind, BlockerEffect.BLOCKS, info, node, f"{_PASS}: {why}"))
    return out


def _bytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def step_copies_note(config: Any, inputs: Any, labels: Any, extra: dict[str, Any]) -> str:
    """What torchtitan's CUDA-graph wrappers would copy per replay for this batch, flattened by
    the installed ``CUDAGraphInputSpec`` as ``wrap_with_cuda_graph`` flattens it."""
    from torchtitan.distributed.cudagraph import CUDAGraphInputSpec

    parts = [("inputs", [inputs]), ("labels", [labels])]
    parts.append(("global_valid_tokens", [torch.tensor(labels.numel())]))
    for key in sorted(extra):
        parts.append((key, CUDAGraphInputSpec(extra[key]).flatten(extra[key])))
    copied: list[str] = []
    fixed: list[str] = []
    total = 0
    for key, leaves in parts:
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        fixed += [f"{key}: {type(v).__name__}" for v in leaves if not isinstance(v, torch.Tensor)]
        if tensors:
            size = sum(t.numel() * t.element_size() for t in tensors)
            total += size
            shape = list(tensors[0].shape) if len(tensors) == 1 else f"{len(tensors)} tensors"
            copied.append(f"{key} {shape} {_bytes(size)}")
    if getattr(config.compile, "mode", None) == "aot_fx_trace":  # graph_trainer's own step
        off = "cudagraph_pass" in config.compile.disable_passes
        which = "graph_trainer's cudagraph_pass " + (
            "off (compile.disable_passes)" if off else "on"
        )
    else:
        off = config.training.disable_cuda_graphs
        which = "the step wrapper " + ("off (training.disable_cuda_graphs)" if off else "on")
    return (
        f"torchtitan's CUDA-graph wrapper captures the whole step ({which}): per replay it "
        f"copies {len(copied)} batch input(s), {_bytes(total)} at "
        f"the capture shape: {', '.join(copied)}; parameters and buffers are static; a changed "
        "shape, dtype or device raises"
        + (f"; non-tensor inputs that must stay equal: {', '.join(fixed)}" if fixed else "")
        + "; any region's blocking finding stops it"
    )
