"""Context parallelism as torchtitan v0.2.2 applies it, run for real on CPU ranks.

torchtitan v0.2.2 (``train.py``, ``distributed/utils.py: create_context_parallel_ctx``) wraps
each training step's forward, loss and backward in torch's ``context_parallel`` context, after
``set_rotate_method(parallelism.context_parallel_rotate_method)``: the context shards the
inputs, the labels (sequence dim 1) and the RoPE table (dim 0) in place over the CP mesh, with
torch's head-tail load balancer (causal attention), and patches
``F.scaled_dot_product_attention`` so that SDPA's kernels run torch's ring attention on DTensors
sharded along the sequence. The CP mesh dimension also folds into FSDP's (``dp_shard_cp``).

What CPU needs in addition (``cpu_ring_attention``): torch 2.13 registers its ring attention for
the CUDA kernels only (flash, efficient, cuDNN); on CPU, SDPA dispatches to
``aten._scaled_dot_product_flash_attention_for_cpu``, for which it has neither a sharding rule
nor a handler (``NotImplementedError``, ``tests/setup/test_context_parallel_cpu.py``). The CPU
kernel has the flash kernel's calling convention (output and a (B, H, L) log-sum-exp; the
backward takes both), so torch's own ``_templated_ring_attention`` (forward and backward, with
the load balancer's causal split and the chosen rotate method) runs it unchanged: the stand-in
registers only the sharding rule (everything sharded on the sequence dim, as torch's rule for the
flash kernel) and the handler, for the duration of the context. Dynamo traces the same Python on
CPU as on GPU (the patched SDPA, ``DTensor.from_local``, ``to_local``), so the breaks a capture
records are the GPU ones; the kernel below the trace is what differs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

_SEQ_DIM = 2
"""The sequence dimension of SDPA's (batch, heads, sequence, head_dim) arguments."""

_depth = 0
"""How many CP contexts this process is inside: a step's context inside a capture's (the
recompile probe's steps) shards its batch but leaves the attention dispatch alone, since torch's
context restores the unpatched SDPA when it exits (it does not nest)."""


def cp_mesh(setup_or_meshes: Any) -> Any:
    """The CP mesh of a setup (or of its meshes), or None without context parallelism."""
    meshes = getattr(setup_or_meshes, "meshes", setup_or_meshes)
    return getattr(meshes, "cp", None)


def rotate_method(setup_or_meshes: Any) -> str:
    """The spec's ``context_parallel_rotate_method`` (kept on the meshes)."""
    meshes = getattr(setup_or_meshes, "meshes", setup_or_meshes)
    return str(getattr(meshes, "cp_rotate_method", "allgather"))


def cp_degree(setup_or_meshes: Any) -> int:
    mesh = cp_mesh(setup_or_meshes)
    return 1 if mesh is None else mesh.size()


def sequence_buffers(model: torch.nn.Module) -> list[tuple[torch.Tensor, int]]:
    """(buffer, sequence dim) of the model's position tables, which torchtitan shards with the
    inputs (its ``freqs_cis``; gbdoctor's built-in models call theirs ``rope_cache``)."""
    return [(b, 0) for name, b in model.named_buffers() if name.rsplit(".", 1)[-1] == "rope_cache"]


@contextlib.contextmanager
def cpu_ring_attention() -> Iterator[None]:
    """Register the CPU flash kernel with torch's CP dispatcher (see the module docstring);
    restored on exit."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._ops.utils import (
        expand_to_full_mesh_op_strategy,
        register_op_strategy,
    )
    from torch.distributed.tensor.experimental._context_parallel import _attention

    # torch's private CP module, typed loosely: its handler table and ring attention's
    # signatures are torch's internals, called here as torch's own handler calls them.
    cp: Any = _attention
    from torch.distributed.tensor.placement_types import Shard

    aten = torch.ops.aten
    fwd = aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    seq = Shard(_SEQ_DIM)

    def fwd_rule(schema: Any) -> Any:
        # (output, logsumexp, query, key, value): all sharded on the sequence.
        rule: list[list[Any]] = [[seq] * 5]
        return expand_to_full_mesh_op_strategy(
            schema.get_mesh_from_args(), schema, rule, input_index=2
        )

    def bwd_rule(schema: Any) -> Any:
        # (grad q, k, v, grad_out, q, k, v, out, logsumexp): all sharded on the sequence.
        rule: list[list[Any]] = [[seq] * 9]
        return expand_to_full_mesh_op_strategy(
            schema.get_mesh_from_args(validate=False), schema, rule, input_index=3
        )

    def handler(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # torch's _sdpa_handler with the CPU kernel in its call map.
        dispatcher = DTensor._op_dispatcher
        info = dispatcher.unwrap_to_op_info(op, args, kwargs)
        dispatcher.sharding_propagator.propagate(info)
        sharding = info.output_sharding
        if sharding is None or sharding.needs_redistribute:
            raise NotImplementedError(f"context parallelism: {op} needs its inputs resharded")
        group = info.compute_mesh.get_group()
        a: list[Any] = list(info.local_args)
        kw: dict[str, Any] = dict(info.local_kwargs)
        if op is fwd:
            q, k, v = a[:3]
            dropout = a[3] if len(a) > 3 else kw.pop("dropout_p", 0.0)
            causal = a[4] if len(a) > 4 else kw.pop("is_causal", False)
            out = cp._templated_ring_attention(
                group, _SEQ_DIM, fwd, q, k, v, is_causal=causal, dropout_p=dropout, **kw
            )
        else:
            grad, q, k, v, o, lse, dropout, causal = a[:8]
            out = cp._templated_ring_attention_backward(
                group,
                _SEQ_DIM,
                bwd,
                grad_out=grad,
                grad_out_name="grad_out",
                query=q,
                key=k,
                value=v,
                out=o,
                logsumexp=lse,
                is_causal=causal,
                dropout_p=dropout,
                **kw,
            )
        return dispatcher.wrap(tuple(out), sharding.output_spec)

    propagator = DTensor._op_dispatcher.sharding_propagator
    saved = {op: propagator.op_strategy_funcs.get(op) for op in (fwd, bwd)}
    saved_handlers = {op: cp.custom_ops.get(op) for op in (fwd, bwd)}
    register_op_strategy(fwd)(fwd_rule)
    register_op_strategy(bwd)(bwd_rule)
    # torch installs custom_ops into DTensor's handlers when its context enters.
    cp.custom_ops[fwd] = cp.custom_ops[bwd] = handler
    try:
        yield
    finally:
        for op, rule in saved.items():
            if rule is None:
                propagator.op_strategy_funcs.pop(op, None)
            else:
                propagator.op_strategy_funcs[op] = rule
            if saved_handlers[op] is None:
                cp.custom_ops.pop(op, None)
            else:
                cp.custom_ops[op] = saved_handlers[op]


def _set_rotate_method(method: str) -> None:
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method(method)


@contextlib.contextmanager
def context_parallel_step(setup: Any, batch: Sequence[torch.Tensor]) -> Iterator[None]:
    """torchtitan v0.2.2's CP context around one step: ``batch`` (tokens, labels: sequence dim
    1) and the model's position tables sharded in place, SDPA running ring attention. The batch
    stays sharded after the step (torchtitan's ``no_restore_buffers``); the tables are restored.
    A null context without CP."""
    global _depth
    mesh = cp_mesh(setup)
    if mesh is None:
        yield
        return
    tables = sequence_buffers(setup.model)
    buffers = list(batch) + [t for t, _ in tables]
    dims = [1] * len(batch) + [d for _, d in tables]
    if _depth:
        # Inside a capture's dispatch: shard the step's buffers only (see ``_depth``).
        with _sharded(mesh, buffers, dims, keep=len(batch)):
            yield
        return
    from torch.distributed.tensor.experimental import context_parallel

    _set_rotate_method(rotate_method(setup))
    stand_in = cpu_ring_attention() if mesh.device_type == "cpu" else contextlib.nullcontext()
    with (
        stand_in,
        context_parallel(
            mesh, buffers=buffers, buffer_seq_dims=dims, no_restore_buffers=set(batch)
        ),
    ):
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1


@contextlib.contextmanager
def attention_dispatch(setup: Any) -> Iterator[None]:
    """The attention half of :func:`context_parallel_step`, for block captures: their inputs were
    recorded already sharded in the warm-up step, so only SDPA's dispatch to ring attention (and
    the load balancer's causal split) is entered. A null context without CP."""
    global _depth
    mesh = cp_mesh(setup)
    if mesh is None or _depth:
        yield
        return
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _cp_options,
        _disable_context_parallel_dispatcher_impl,
        _enable_context_parallel_dispatcher_impl,
    )

    _set_rotate_method(rotate_method(setup))
    stand_in = cpu_ring_attention() if mesh.device_type == "cpu" else contextlib.nullcontext()
    balance = _cp_options.enable_load_balance
    with stand_in:
        # As context_parallel sets it: the head-tail balancer is on for causal attention.
        _cp_options.enable_load_balance = True
        _enable_context_parallel_dispatcher_impl(seq_dim=_SEQ_DIM, mesh=mesh)
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            _disable_context_parallel_dispatcher_impl()
            _cp_options.enable_load_balance = balance


@contextlib.contextmanager
def _sharded(mesh: Any, buffers: list[torch.Tensor], dims: list[int], keep: int) -> Iterator[None]:
    """Shard ``buffers`` in place as ``context_parallel`` does (head-tail load balancer); the
    first ``keep`` stay sharded, the rest are restored on exit."""
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _context_parallel_buffers,
    )
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _create_default_load_balancer,
    )

    originals = [b.clone() for b in buffers[keep:]]
    balancer = _create_default_load_balancer(
        buffers[0].shape[dims[0]], mesh.size(), buffers[0].device
    )
    shards: list[Any] = _context_parallel_buffers(mesh, list[Any](buffers), dims, balancer)
    with torch.no_grad():
        for buffer, shard in zip(buffers, shards, strict=True):
            shard = shard.clone()
            buffer.resize_(shard.shape)
            buffer.copy_(shard)
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, original in zip(buffers[keep:], originals, strict=True):
                buffer.resize_(original.shape)
                buffer.copy_(original)


def context_parallel_notes(setup: Any, seq_len: int) -> tuple[str, ...]:
    """What a scan under CP did differently (none without CP): the report's CP findings."""
    mesh = cp_mesh(setup)
    if mesh is None:
        return ()
    cp = mesh.size()
    sharded = (
        "tokens, labels and the RoPE table"
        if sequence_buffers(setup.model)
        else ("tokens and labels")
    )
    notes = [
        f"context parallelism {cp} (torch's CP context around each training step): {sharded} "
        "sharded along the sequence with torch's head-tail load "
        f"balancer, so each block was captured on its {seq_len // cp}-token share of the "
        f"{seq_len}-token sequence; SDPA runs torch's ring attention "
        f"({rotate_method(setup)} rotation); FSDP shards over dp_shard x cp"
    ]
    if not sequence_buffers(setup.model):
        notes.append(
            "context parallelism: the model has no rope_cache buffer (the built-in families' "
            "position table), so only the tokens and labels were sharded; positions computed "
            "inside the model are the share's own (numerics differ, breaks do not)"
        )
    if mesh.device_type == "cpu":
        notes.append(
            "context parallelism on CPU: torch has no CP rule for the CPU flash-attention "
            "kernel, so gbdoctor registers one that runs torch's own ring attention with it; "
            "Dynamo traces the same Python as on GPU (so the same breaks), the kernel under "
            "the trace differs"
        )
    return tuple(notes)
