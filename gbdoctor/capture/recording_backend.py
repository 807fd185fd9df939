"""The recording backend: a Dynamo backend that counts the graphs and ops of each compiled region,
then runs them as ``aot_eager`` does, reading every forward and backward ATen graph (what inductor
would compile) for CUDA-graph readiness (``capture/cudagraphs.py``)."""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from gbdoctor.capture import cudagraphs
from gbdoctor.capture.raw_capture import RawCapture

GraphCheck = Callable[
    [torch.fx.GraphModule, Sequence[Any], Sequence[int], "cudagraphs.GraphInfo"],
    list[Any],
]
"""(ATen graph, example inputs, static input indices, which graph) -> readiness findings."""


class Recording(Protocol):
    """What a recording backend records into (``CaptureSession``)."""

    graph_checks: list[GraphCheck]
    """More CUDA-graph readiness checks of every ATen graph, beside inductor's."""

    def recording(self) -> RawCapture | None:
        """The capture being recorded; None outside a capture or while it is paused."""
        ...

    def probing(self) -> bool:
        """Whether the recompile probe is replaying a block (its compiles are Dynamo's alone)."""
        ...


def make_recording_backend(session: Recording, region_of: Callable[[], str]) -> Any:
    """A Dynamo backend recording each graph into ``session``'s capture, as region
    ``region_of()``; outside a capture, or paused (the recompile probe's steps keep the counts
    those of the capture step), it only runs the graph: as aot_eager, or as Dynamo traced it
    while the probe replays a block (``Recording.probing``)."""
    # aot_eager, not the graph's own forward: AOTAutograd functionalizes checkpoint regions
    # and in-place buffer updates the way a real backend does, so backward behaves as in
    # training (a plain eager replay of a checkpoint HOP double-applies in-place updates).
    # Called with recording forward/backward compilers: those graphs are what inductor would
    # compile, so they are where CUDA-graph readiness is read (capture/cudagraphs.py).
    from torch._dynamo.backends.debugging import aot_eager as inner_backend

    def recording_backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        current = session.recording()
        if current is None and session.probing() and not _higher_order_ops(gm):
            # The recompile probe reads which guards fail, which Dynamo checks before it calls
            # a backend; what it compiles again then only has to run. AOTAutograd's joint
            # trace and partition were 2/3 of the probe's re-compile CPU (cProfile, issue 46).
            # The price: the shape guards AOTAutograd adds over the newly dynamic sizes (under
            # EP, that the split sizes sum to the routed tokens and are not 0 or 1) are not in
            # the re-compiled entry the probe's second step checks, so a second step failing
            # only one of them goes unseen; Dynamo's own guards are all there. On every bundled
            # spec the findings are unchanged (tests/test_recompile_goldens.py). A graph with a
            # higher-order op (an AC region) still goes through AOTAutograd: run as traced,
            # its backward fails on the in-place updates it re-applies (see above).
            return gm.forward
        if current is None:
            return inner_backend(gm, example_inputs)
        fqn = region_of()
        graphs = current.graphs.setdefault(fqn, [])
        graphs.append(count_ops(gm))
        index = len(graphs) - 1
        current.cudagraph_findings += cudagraphs.dynamo_graph_findings(
            gm, cudagraphs.GraphInfo(region=fqn, phase="dynamo", index=index)
        )
        names = tuple(
            cudagraphs.dynamo_input_name(n) for n in gm.graph.nodes if n.op == "placeholder"
        )
        compiled = inner_backend(
            gm,
            example_inputs,
            fw_compiler=_recording_compiler(
                current, fqn, index, "forward", names, session.graph_checks
            ),
            bw_compiler=_recording_compiler(
                current, fqn, index, "backward", checks=session.graph_checks
            ),
        )

        @functools.wraps(compiled)  # keeps ``_boxed_call``: Dynamo calls it the same way
        def run(*args: Any, **kwargs: Any) -> Any:
            target = session.recording()
            if target is not None:
                target.ran_compiled.add(region_of())
            return compiled(*args, **kwargs)

        return run

    return recording_backend


def _higher_order_ops(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph calls a higher-order op (a checkpoint region, a wrapped subgraph)."""
    from torch._ops import HigherOrderOperator

    return any(
        isinstance(n.target, HigherOrderOperator) for n in gm.graph.nodes if n.op == "call_function"
    )


def _recording_compiler(
    current: RawCapture,
    fqn: str,
    index: int,
    phase: str,
    input_names: tuple[str, ...] = (),
    checks: Sequence[GraphCheck] = (),
) -> Any:
    """An AOTAutograd forward/backward compiler that reads the graph for CUDA-graph readiness
    and then runs it as aot_eager does. Static inputs as inductor's cudagraph path takes them:
    forward, AOTAutograd's ``static_input_indices`` (parameters, buffers); backward, every input
    before the tangents (saved by a cudagraphed forward)."""
    from functorch.compile import make_boxed_func
    from torch._guards import TracingContext

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        if phase == "forward":
            context = TracingContext.try_get()
            metadata = getattr(context, "fw_metadata", None) if context is not None else None
            static = list(getattr(metadata, "static_input_indices", None) or [])
        else:
            static = list(range(_count_fixed_backward_inputs(gm)))
        try:
            info = cudagraphs.GraphInfo(region=fqn, phase=phase, index=index)
            found = cudagraphs.aten_graph_findings(gm, example_inputs, static, info, input_names)
            seen = {(f.node, f.kind, f.effect) for f in found}
            for check in checks:  # a finding inductor's check made already is not repeated
                found += [
                    f
                    for f in check(gm, example_inputs, static, info)
                    if (f.node, f.kind, f.effect) not in seen
                ]
            current.cudagraph_findings += found
            current.aten_graphs += 1
            current.aten_graphs_by_region[fqn] = current.aten_graphs_by_region.get(fqn, 0) + 1
        except Exception:  # noqa: BLE001 - readiness is advisory; never fail the capture for it
            logging.getLogger(__name__).debug("could not analyse a %s graph", phase, exc_info=True)
            return make_boxed_func(gm.forward)
        if phase != "forward" or not static:
            return make_boxed_func(gm.forward)
        return _watching_static_inputs(gm, static, info, input_names, current)

    return compile_graph


def _watching_static_inputs(
    gm: torch.fx.GraphModule,
    static: Sequence[int],
    info: cudagraphs.GraphInfo,
    input_names: tuple[str, ...],
    current: RawCapture,
) -> Any:
    """The forward graph, boxed, watching the real tensors behind its static inputs on its first
    call (``RawCapture.static_inputs``): whether their memory survives the step is only seen at
    run time, when the capture ends (``cudagraphs.released_static_inputs``)."""
    from functorch.compile import make_boxed_func

    forward = make_boxed_func(gm.forward)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    watched = False

    def run(args: list[Any]) -> Any:
        nonlocal watched
        if not watched:
            watched = True
            for i in static:
                value = args[i] if i < len(args) else None
                if isinstance(value, torch.Tensor) and value.numel() > 0:
                    shown = cudagraphs.input_label(placeholders, input_names, i)
                    current.static_inputs.append(
                        cudagraphs.WatchedInput(weakref.ref(value), info, placeholders[i], shown)
                    )
        return forward(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _count_fixed_backward_inputs(gm: torch.fx.GraphModule) -> int:
    """Inputs of a backward graph before its first tangent (inductor's ``count_tangents``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        if "tangents" in node.name:
            return i
    return len(placeholders)


def count_ops(gm: torch.fx.GraphModule) -> int:
    """``call_function`` nodes, including those inside higher-order-op bodies (a checkpoint
    region is one HOP node in the outer graph; its ops live in a nested GraphModule)."""
    total = 0
    for sub in gm.modules():
        if isinstance(sub, torch.fx.GraphModule):
            total += sum(1 for n in sub.graph.nodes if n.op == "call_function")
    return total
