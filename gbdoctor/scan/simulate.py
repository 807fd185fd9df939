"""Simulated scans: production-size specs on one machine, with nothing allocated at full size.

``gbdoctor scan SPEC --simulate`` (and, automatically and with a notice in the report, any spec
that ``scan.estimate.decide`` finds too large for this machine: a world larger than its local
ranks, or more memory than it has) scans rank 0 of the spec's world in this process:

1. The process group is PyTorch's ``fake`` backend at the spec's world size: collectives return
   at once without peers and move no data, so the real FSDP2 and EP code runs unchanged. The
   device meshes are the real ones (``build_meshes``), rank 0 of N.
2. The model is built on the meta device and set up there by the same ``apply_setup`` as a real
   scan (EP -> AC -> compile -> FSDP2 -> optimizer), then materialized the way torchtitan does it
   (``model.to_empty`` after ``fully_shard``), except that the new tensors are *fake*
   (meta-backed, on ``cpu``): every eager op and every compiled graph afterwards computes shapes
   only. ``apply_setup`` skips the optimizer for a model on meta because such a model cannot be
   stepped; here it is stepped only after materialization, so that check is lifted for the call
   (``to_empty`` swaps the sharded parameters in place, so the optimizer keeps them).
3. The warm-up training step and every capture run under that fake mode. Values that depend on
   data that does not exist come from one documented stand-in, *uniform routing* (see
   ``UniformRouting``): each MoE's token counts are its routed tokens spread evenly over the
   experts, identical on every rank. Those small integer tensors carry real values through the
   ops that use them (the all-to-all of counts, the sums, ``.to("cpu")``, ``.tolist()``), so EP's
   device-to-host sync and its split sizes run the real code path, eagerly and inside compiled
   graphs alike. Floating-point values read on the host (the loss, optimizer step counters) are
   NaN: numerics are not simulated.

Nothing here re-implements FSDP2, EP, AC or the capture; it only swaps the process group and the
tensors. What a simulated scan cannot see is listed in ``ScanReport.notes``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from gbdoctor.errors import SetupError
from gbdoctor.records import Spec

_aten = torch.ops.aten
_MAX_VALUE_NUMEL = 1 << 22
"""Tensors larger than this never carry stand-in values. Token counts are per-expert sized, but
torchtitan >= 0.3 derives them from a one-hot routing map of ``batch x seq x experts`` (4 x 4096
x 256 = 2**22 for deepseek_v3 671B at its training shape), which must carry its values; at most
16 MiB per bool/int32 map, held only while its fake tensor lives."""
_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d")


# ------------------------------------------------------------------------------ process group


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0) -> Iterator[None]:
    """Rank ``rank`` of a ``world_size`` default process group on PyTorch's fake backend."""
    import torch.distributed as dist

    # Importing it registers the "fake" backend with torch.distributed.
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise SetupError("a torch.distributed process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ stand-in values


class SimulatedValueError(RuntimeError):
    """A host read of an integer whose value depends on data the simulation does not have."""


class UniformRouting:
    """The uniform-routing stand-in, installed on one ``FakeTensorMode`` instance.

    It sees every op on that mode's tensors (eager ops, and the ops of compiled graphs when they
    run). The output of ``histc`` - how torchtitan-style MoEs count tokens per expert - gets a
    stand-in value: its input's elements spread evenly over the bins. An op whose tensor inputs
    all carry values computes its outputs' values on those real, small tensors; a functional
    collective assumes every rank holds the same values as this one (what uniform routing
    means). Reading a tensor on the host (``.item()``, ``.tolist()``, ``float()``) returns its
    value; a floating-point tensor without one reads as NaN; an integer without one is an error
    (``SimulatedValueError``), so a data-dependent value never silently becomes a made-up one.
    """

    def __init__(self) -> None:
        self.values: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.stand_in_reads = 0
        """Host reads answered from stand-in values (EP split sizes, ...)."""
        self.nan_reads = 0
        """Host reads of floating-point values without one (answered NaN)."""

    def install(self, mode: FakeTensorMode) -> FakeTensorMode:
        """Wrap ``mode.dispatch`` (an instance attribute, not a subclass: higher-order ops such as
        checkpoint look their fake rules up by the mode's exact type)."""
        fake_dispatch = mode.dispatch

        def dispatch(func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is _aten._local_scalar_dense.default or func is _aten.item.default:
                return self._host_read(func, args[0])
            out = fake_dispatch(func, types, args, kwargs)
            try:
                self._propagate(func, args, kwargs, out)
            except Exception:  # noqa: BLE001 - a value that cannot be computed is not tracked
                self._forget_written(func, args, kwargs)
            return out

        mode.dispatch = dispatch  # type: ignore[method-assign]
        return mode

    def _host_read(self, func: Any, tensor: Any) -> Any:
        if not isinstance(tensor, FakeTensor):  # real host state (an RNG state, a mesh table)
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
            f"a simulated scan has no value for this data-dependent {tensor.dtype} read on the host "
            f"({func}); only MoE token counts (torch.histc, uniform routing) have a stand-in"
        )

    def _propagate(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        if func is _aten.histc.default:
            self._uniform_counts(args, kwargs, out)
            return
        if func is _aten.topk.default:
            self._round_robin_ids(args, kwargs, out[1])
            return
        with_value = [t in self.values for t in _tensor_args(args, kwargs)]
        if func in _FILL_LIKE and _countable(out):
            with_value = [True]  # the value depends on the shape only
        if not any(with_value):  # the common case: nothing to compute, no value to drop
            return
        if not all(with_value):
            self._forget_written(func, args, kwargs)
            return
        outs, reals = tree_flatten(out)[0], tree_flatten(self._values_of(func, args, kwargs))[0]
        if len(outs) != len(reals):
            self._forget_written(func, args, kwargs)
            return
        for fake, value in zip(outs, reals):
            if (
                isinstance(fake, FakeTensor)
                and isinstance(value, torch.Tensor)
                and fake.shape == value.shape
                and value.numel() <= _MAX_VALUE_NUMEL
            ):
                self.values[fake] = value

    def _uniform_counts(self, args: Any, kwargs: Any, out: Any) -> None:
        """``histc(expert ids)`` under uniform routing: the ids spread evenly over the bins."""
        bins = int(kwargs.get("bins", args[1] if len(args) > 1 else 100))
        base, extra = divmod(args[0].numel(), bins)
        counts = torch.full((bins,), base, dtype=torch.int64)
        counts[:extra] += 1
        self.values[out] = counts.to(out.dtype)

    def _round_robin_ids(self, args: Any, kwargs: Any, ids: Any) -> None:
        """``topk``'s indices as round-robin routing: row r's j-th pick out of ``E`` candidates
        is ``(r * k + j) % E``, torchtitan's own balanced routing
        (``_debug_force_load_balance_routing`` in ``models/common/moe.py``). torchtitan >= 0.3
        counts tokens per expert from a one-hot routing map of these indices (a ``scatter_``
        and a ``sum``), not with ``histc``; the map and the counts follow from these values."""
        if not _countable(ids):
            return
        dim = int(kwargs.get("dim", args[2] if len(args) > 2 else -1))
        candidates = args[0].shape[dim] if args[0].dim() else 1
        rows = ids.movedim(dim, -1) if ids.dim() else ids
        picks = torch.arange(rows.numel(), dtype=ids.dtype).reshape(rows.shape) % candidates
        self.values[ids] = picks.movedim(-1, dim) if ids.dim() else picks

    def _value_or_blank(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor's value; for a fill-like op's template (whose values it ignores), a
        blank host tensor of its shape and dtype (of no elements when it is large: ``new_*``
        ops take their size as an argument, ``*_like`` ops are as small as their output)."""
        value = self.values.get(tensor)
        if value is not None:
            return value
        shape = tensor.shape if tensor.numel() <= _MAX_VALUE_NUMEL else (0,)
        return torch.empty(shape, dtype=tensor.dtype)

    def _values_of(self, func: Any, args: Any, kwargs: Any) -> Any:
        real = lambda x: self._value_or_blank(x) if isinstance(x, torch.Tensor) else x  # noqa: E731
        rargs, rkwargs = tree_map(real, args), tree_map(real, kwargs)
        if getattr(func, "namespace", "") in _COLLECTIVE_NAMESPACES:
            return _collective_values(func.overloadpacket.__name__, rargs)
        if rkwargs.get("device") is not None:
            rkwargs = dict(rkwargs, device="cpu")  # values live on the host
        with unset_fake_temporarily():
            return func(*rargs, **rkwargs)

    def _forget_written(self, func: Any, args: Any, kwargs: Any) -> None:
        """An op that writes into a tensor with a value, without computing it, drops the value."""
        schema = getattr(func, "_schema", None)
        if schema is None or not schema.is_mutable:
            return
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                written = args[i] if i < len(args) else kwargs.get(arg.name)
                for t in tree_flatten(written)[0]:
                    if isinstance(t, torch.Tensor):
                        self.values.pop(t, None)


_FILL_LIKE = frozenset(
    {
        _aten.zeros_like.default,
        _aten.ones_like.default,
        _aten.full_like.default,
        _aten.new_zeros.default,
        _aten.new_ones.default,
        _aten.new_full.default,
    }
)
"""Ops whose output's value follows from a shape and a fill value alone (a routing map starts
as ``zeros_like(scores, dtype=bool)``)."""


def _countable(tensor: Any) -> bool:
    """An integer or boolean fake tensor small enough to carry a value (counts, ids, masks)."""
    return (
        isinstance(tensor, FakeTensor)
        and not tensor.is_floating_point()
        and not tensor.is_complex()
        and tensor.numel() <= _MAX_VALUE_NUMEL
    )


def _tensor_args(args: Any, kwargs: Any) -> Iterator[torch.Tensor]:
    """Tensors among an aten op's arguments (top level, and in lists such as ``cat``'s)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, torch.Tensor))


def _group_rank_and_size(group_name: Any) -> tuple[int, int]:
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    group = _resolve_process_group(group_name)
    return dist.get_rank(group), dist.get_world_size(group)


def _collective_values(name: str, args: Any) -> Any:
    """A functional collective's result when every rank holds what this rank holds."""
    if name == "wait_tensor":
        return args[0]
    if name == "all_to_all_single":
        tensor, _, in_splits, group_name = args[:4]
        rank, size = _group_rank_and_size(group_name)
        if in_splits is None:
            in_splits = [tensor.shape[0] // size] * size
        start = sum(in_splits[:rank])
        mine = tensor[start : start + in_splits[rank]]  # what each peer sends to this rank
        return torch.cat([mine] * size)
    if name == "all_reduce":
        tensor, op, group_name = args[:3]
        _, size = _group_rank_and_size(group_name)
        return tensor * size if str(op).lower() == "sum" else tensor.clone()
    if name == "all_gather_into_tensor":
        return torch.cat([args[0]] * int(args[1]))
    raise NotImplementedError(f"no stand-in values for collective {name}")


def simulation_mode() -> tuple[FakeTensorMode, UniformRouting]:
    """A fresh fake mode with the routing stand-in installed.

    No shape env: sizes stay concrete, as in a real run. Non-fake inputs are allowed: the few real
    tensors that meet fake ones are small host state (the CPU RNG state a checkpointed region
    saves and restores, device-mesh rank tables)."""
    routing = UniformRouting()
    return routing.install(FakeTensorMode(allow_non_fake_inputs=True)), routing


# ------------------------------------------------------------------------------ setup


@contextlib.contextmanager
def simulated_setup(model: nn.Module, mode: FakeTensorMode, device: str = "cpu") -> Iterator[None]:
    """Around ``apply_setup`` of a meta-built ``model``: afterwards, materialize it as ``mode``'s
    fake tensors on ``device`` (``to_empty``, as torchtitan materializes after ``fully_shard``).

    The caller asks ``apply_setup`` for the optimizer explicitly (``build_optimizer=True``): it
    is stepped only after materialization. ``to_empty`` swaps the (FSDP-sharded) parameters in
    place, which keeps the optimizer's references valid; that is verified.
    """
    yield
    params = [id(p) for p in model.parameters()]
    with mode:
        model.to_empty(device=device)
    if [id(p) for p in model.parameters()] != params:
        raise SetupError(
            "materializing the simulated model replaced its parameters instead of "
            "swapping them in place (the optimizer would step stale ones)"
        )
    leftover = [
        n
        for n, t in [*model.named_parameters(), *model.named_buffers()]
        if not isinstance(getattr(t, "_local_tensor", t), FakeTensor)
    ]
    if leftover:
        raise SetupError(f"simulation could not make these tensors fake: {', '.join(leftover[:5])}")


# ------------------------------------------------------------------------------ scan


def simulation_notice(spec: Spec, reason: str | None) -> tuple[str, ...]:
    """The one-line notice of an automatic simulation (none when it was requested)."""
    if not reason or reason == "requested":
        return ()
    return (
        f"notice: {reason}; pass --simulate to ask for it explicitly, or run on a machine that "
        f"fits {spec.parallelism.world_size} rank(s) of this spec for a real capture",
    )


def simulation_notes(spec: Spec, reason: str | None) -> tuple[str, ...]:
    """What a simulated scan does not see, for the report header."""
    p = spec.parallelism
    notes = list(simulation_notice(spec, reason))
    notes.append(
        f"simulated: rank 0 of {p.world_size} on a fake process group (collectives return at once "
        "and move no data); the model was built on the meta device, set up by the same "
        "EP/AC/compile/FSDP2 code as a real scan, and run as fake tensors (shapes only)"
    )
    notes.append(
        "not simulated: numerics (values, NaN/overflow; host reads of floats such as the loss "
        "return NaN), timing, memory use, communication, the other ranks (no rank_divergence "
        "events), and accelerator-only code paths (tensors are fake CPU tensors)"
    )
    if p.expert_parallel_degree > 1:
        ep, tokens, top_k = (
            p.expert_parallel_degree,
            spec.capture_batch_size * spec.capture_seq_len,
            _top_k(spec),
        )
        per_peer = f"{tokens * top_k // ep}" if top_k else f"{tokens} x top_k / {ep}"
        notes.append(
            f"stand-in: uniform routing - each MoE's token counts are its routed tokens spread evenly "
            f"over the experts, identical on every rank, so EP's split sizes (read on the host) are "
            f"{per_peer} tokens to and from each of the {ep} EP ranks; breaks or recompiles that depend "
            "on real, uneven split sizes are not seen"
        )
    return tuple(notes)


def _top_k(spec: Spec) -> int | None:
    from gbdoctor.models import model_facts

    return model_facts(spec.model).top_k  # None: custom or dense, not known from the spec
