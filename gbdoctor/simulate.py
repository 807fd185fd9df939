"""Simulated scans: production-size specs on one machine, with nothing allocated at full size.

``gbdoctor scan SPEC --simulate`` (and, with a notice, any spec whose world size exceeds what
this machine can run as local ranks, see ``local_world_limit``) scans rank 0 of the spec's world
in this process:

- the process group is PyTorch's ``fake`` backend at the spec's world size: collectives return at
  once without peers, so the real FSDP2 and EP code (the same ``apply_setup``) runs unchanged;
- the model is built on the meta device, then its parameters and buffers become fake tensors
  (meta-backed, on ``cpu``) before the setup is applied; the warm-up step and every capture run
  under that fake mode, so every eager op and every compiled graph computes shapes only;
- values that depend on data that does not exist come from a documented stand-in, *uniform
  routing*: each MoE's token counts (``torch.histc`` over the chosen experts) are the tokens
  spread evenly over the experts, identical on every rank. Those few small integer tensors carry
  real values through the ops that use them (the all-to-all of counts, the sums, ``.tolist()``),
  so EP's device-to-host sync and split sizes run the real code path and yield
  ``tokens * top_k / ep`` per rank. Floating-point values read on the host (the loss) are NaN.

Nothing here re-implements FSDP2, EP or AC; it only swaps the tensors and the process group.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import replace
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from gbdoctor.errors import SetupError
from gbdoctor.records import ModelSpec, ScanReport, Spec

Progress = Callable[[str, int, int], None]

_aten = torch.ops.aten
_MAX_TRACKED_NUMEL = 1 << 16
"""Tensors with more elements never carry stand-in values (counts are per-expert sized)."""


# ------------------------------------------------------------------------------ when


def local_world_limit() -> int:
    """Most ranks a real (non-simulated) scan spawns on this machine: two per CPU core.

    Every local rank holds a full copy of the model and its own Dynamo; past about two per core
    a CPU machine thrashes, and a production world (64, 256 ranks) could never run at all.
    """
    return max(2, 2 * (os.cpu_count() or 1))


def simulation_reason(spec: Spec) -> str | None:
    """Why ``spec`` is scanned simulated (None: scan it on real ranks)."""
    world = spec.parallelism.world_size
    if spec.gbdoctor.simulate:
        return "requested"
    limit = local_world_limit()
    if world > limit:
        return (f"world size {world} exceeds the {limit} ranks this machine can run locally "
                f"(2 per CPU core), so the scan was simulated automatically")
    return None


# ------------------------------------------------------------------------------ process group


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0) -> Iterator[None]:
    """Rank ``rank`` of a ``world_size`` process group on PyTorch's fake backend (no peers)."""
    import torch.distributed as dist
    # Importing registers the "fake" backend with torch.distributed.
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise SetupError("a torch.distributed process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ tensors


class SimulatedValueError(RuntimeError):
    """A host read of an integer whose value depends on data the simulation does not have."""


class UniformRouting:
    """The uniform-routing stand-in for the values EP must read on the host, on a fake mode.

    Installed on a ``FakeTensorMode`` instance (not a subclass: higher-order ops such as
    checkpoint look their fake rules up by the mode's exact type), it sees every op on that
    mode's tensors. The output of ``histc`` (the MoE token count) gets a stand-in value: its
    input's elements spread evenly over the bins. Ops whose tensor inputs all carry values compute
    their outputs' values on the real (small) tensors; collectives assume every rank holds the
    same values as this one. ``.item()`` / ``.tolist()`` of a tensor with a value returns it; of
    any other floating-point tensor, NaN; of any other integer tensor, an error.
    """

    def __init__(self) -> None:
        self.values: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.stand_in_reads = 0
        """Host reads answered from stand-in values."""
        self.nan_reads = 0
        """Host reads of floating-point values without one (answered NaN)."""

    def install(self, mode: FakeTensorMode) -> FakeTensorMode:
        fake_dispatch = mode.dispatch

        def dispatch(func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is _aten._local_scalar_dense.default or func is _aten.item.default:
                return self._host_read(func, args[0])
            out = fake_dispatch(func, types, args, kwargs)
            try:
                self._propagate(func, args, kwargs, out)
            except Exception:  # noqa: BLE001 - a value we cannot compute is simply not tracked
                self._forget_mutated(func, args, kwargs)
            return out

        mode.dispatch = dispatch  # type: ignore[method-assign]
        return mode


    # ------------------------------------------------------------------ host reads
    def _host_read(self, func: Any, tensor: Any) -> Any:
        if not isinstance(tensor, FakeTensor):  # a real tensor (an RNG state, a mesh): read it
            with unset_fake_temporarily():
                return func(tensor)
        value = self.values.get(tensor)
        if value is not None:
            self.stand_in_reads += 1
            return value.item()
        if tensor.is_floating_point():
            self.nan_reads += 1
            return math.nan
        raise SimulatedValueError(
            f"simulation has no value for a data-dependent {tensor.dtype} read on the host "
            f"({func}); only MoE token counts (uniform routing) have a stand-in")

    # ------------------------------------------------------------------ propagation
    def _propagate(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        if func is _aten.histc.default:
            self._uniform_counts(args, kwargs, out)
            return
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        if not tensors or not any(t in self.values for t in tensors):
            self._forget_mutated(func, args, kwargs)
            return
        if not all(t in self.values for t in tensors):
            self._forget_mutated(func, args, kwargs)
            return
        real = self._real_result(func, args, kwargs)
        outs, _ = tree_flatten(out)
        reals, _ = tree_flatten(real)
        if len(outs) != len(reals):
            return
        for fake, value in zip(outs, reals):
            if isinstance(fake, FakeTensor) and isinstance(value, torch.Tensor) \
                    and tuple(fake.shape) == tuple(value.shape) and value.numel() <= _MAX_TRACKED_NUMEL:
                self.values[fake] = value

    def _uniform_counts(self, args: Any, kwargs: Any, out: Any) -> None:
        """``histc(selected experts)`` under uniform routing: n elements spread over the bins."""
        bins = int(kwargs.get("bins", args[1] if len(args) > 1 else 100))
        n = args[0].numel()
        base, extra = divmod(n, bins)
        counts = torch.full((bins,), base, dtype=torch.int64)
        counts[:extra] += 1
        self.values[out] = counts.to(out.dtype)

    def _real_result(self, func: Any, args: Any, kwargs: Any) -> Any:
        real = lambda x: self.values[x] if isinstance(x, torch.Tensor) else x  # noqa: E731
        rargs, rkwargs = tree_map(real, args), tree_map(real, kwargs)
        namespace = getattr(func, "namespace", "")
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        if namespace in ("_c10d_functional", "c10d_functional", "c10d"):
            return _collective_values(name, rargs, rkwargs)
        with unset_fake_temporarily():
            if "device" in rkwargs and rkwargs["device"] is not None:
                rkwargs = dict(rkwargs, device="cpu")
            return func(*rargs, **rkwargs)

    def _forget_mutated(self, func: Any, args: Any, kwargs: Any) -> None:
        schema = getattr(func, "_schema", None)
        if schema is None or not schema.is_mutable:
            return
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                for t in tree_flatten(value)[0]:
                    if isinstance(t, torch.Tensor):
                        self.values.pop(t, None)


def simulation_mode() -> tuple[FakeTensorMode, UniformRouting]:
    """A fresh fake mode (no shape env: sizes stay concrete) with the routing stand-in.

    Non-fake inputs are allowed: the few real tensors that meet fake ones are small host state
    (the CPU RNG state that checkpointed regions save and restore, device-mesh rank tables).
    """
    routing = UniformRouting()
    return routing.install(FakeTensorMode(allow_non_fake_inputs=True)), routing


def _group_rank_and_size(group_name: Any) -> tuple[int, int]:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    group = _resolve_process_group(group_name)
    return dist.get_rank(group), dist.get_world_size(group)


def _collective_values(name: str, args: Any, kwargs: Any) -> Any:
    """Values of a functional collective when every rank holds what this rank holds."""
    if name == "wait_tensor":
        return args[0]
    if name == "all_to_all_single":
        tensor, out_splits, in_splits, group_name = args[:4]
        rank, size = _group_rank_and_size(group_name)
        if in_splits is None:
            in_splits = [tensor.shape[0] // size] * size
        start = sum(in_splits[:rank])
        mine = tensor[start:start + in_splits[rank]]
        return torch.cat([mine] * size) if size > 1 else mine.clone()
    if name == "all_reduce":
        tensor, op, group_name = args[:3]
        _, size = _group_rank_and_size(group_name)
        return tensor * size if str(op).lower() == "sum" else tensor.clone()
    if name == "all_gather_into_tensor":
        tensor, group_size = args[0], args[1]
        return torch.cat([tensor] * int(group_size))
    raise NotImplementedError(name)  # untracked: the caller drops the value


def materialize_fake(model: nn.Module, mode: FakeTensorMode, device: str = "cpu") -> nn.Module:
    """Swap every meta parameter and buffer of ``model`` for an empty fake tensor on ``device``.

    What ``to_empty`` does for a real run, except that the new tensors are fake (no storage).
    Tied parameters stay tied.
    """
    memo: dict[int, torch.Tensor] = {}

    def fake_like(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            with mode:
                memo[id(t)] = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)
        return memo[id(t)]

    params: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in params:
                params[id(p)] = nn.Parameter(fake_like(p), requires_grad=p.requires_grad)
            module._parameters[name] = params[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = fake_like(b)
    return model


def build_simulated_model(spec: ModelSpec, mode: FakeTensorMode, device: str = "cpu") -> nn.Module:
    """The spec's model built on meta (nothing allocated), with fake parameters on ``device``."""
    from gbdoctor.models import build_model

    return materialize_fake(build_model(spec, device="meta"), mode, device)


# ------------------------------------------------------------------------------ scan


def simulation_notes(spec: Spec, routing: UniformRouting | None, reason: str | None) -> tuple[str, ...]:
    """What a simulated scan could not see, for the report header."""
    p = spec.parallelism
    notes = []
    if reason and reason != "requested":
        notes.append(f"notice: {reason}; pass --simulate to request it, or scan on a machine with "
                     f"{p.world_size} ranks for a real capture")
    notes.append(f"simulated: rank 0 of {p.world_size} on a fake process group (no peers: collectives return "
                 "immediately and move no data); the model was built on the meta device and ran as fake "
                 "tensors through the same EP/AC/compile/FSDP2 setup code as a real scan")
    notes.append("not simulated: numerics (values, NaN/overflow, the loss: read as NaN), timing, memory use, "
                 "communication, and other ranks (rank divergence cannot be detected)")
    if p.expert_parallel_degree > 1 or _has_experts(spec):
        per_rank = spec.capture_batch_size * spec.capture_seq_len
        notes.append("stand-in: uniform routing - each MoE's token counts are its routed tokens spread evenly "
                     "over the experts, identical on every rank, so EP split sizes are "
                     f"tokens x top_k / {p.expert_parallel_degree} per rank ({per_rank} tokens per rank); "
                     "breaks or recompiles that depend on real, uneven split sizes are not seen")
    if routing is not None and routing.nan_reads:
        notes.append(f"{routing.nan_reads} host read(s) of floating-point values returned NaN (no numerics)")
    return tuple(notes)


def _has_experts(spec: Spec) -> bool:
    from gbdoctor.models import num_experts

    try:
        return num_experts(spec.model.name, spec.model.flavor) is not None
    except Exception:  # noqa: BLE001 - custom models: unknown
        return False


def simulate_scan(spec: Spec, *, strategy: Any = None, dedupe: bool = True, progress: Progress | None = None,
                  strict: bool = False, reason: str | None = "requested") -> ScanReport:
    """Scan rank 0 of ``spec``'s world in this process, on a fake process group and fake tensors."""
    from gbdoctor.scan import ScanJob, merge_ranks, scan_rank, strategy_for
    from gbdoctor.setup.compile import Strategy

    if not isinstance(strategy, Strategy):
        strategy = strategy_for(spec, strategy)
    world = spec.parallelism.world_size
    # Fake tensors live on cpu whatever the spec's device: the fake backend needs no GPU.
    job = ScanJob(spec=spec, strategy=strategy, device="cpu", dedupe=dedupe, strict=strict)
    mode, routing = simulation_mode()
    if progress:
        progress(f"simulating rank 0 of {world}", 0, 1)
    with fake_process_group(world):
        rank0 = scan_rank(job, progress, fake_mode=mode)
    report = merge_ranks(spec, job, [rank0])
    return replace(report, setup=replace(report.setup, simulated=True),
                   notes=simulation_notes(spec, routing, reason) + report.notes)
