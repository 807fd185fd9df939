"""Why gbdoctor registers a CPU stand-in for context parallelism (``setup/context_parallel.py``):
torch's ``context_parallel``, run for real on two gloo ranks, cannot shard the CPU attention
kernel. When a torch release adds the rule the first test fails, and the stand-in must go. The
second runs the same CP step with the stand-in, against the unsharded computation."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cp_rank(rank: int, world: int, port: int, stand_in: bool, results) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    from gbdoctor.setup.context_parallel import cpu_ring_attention

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
        torch.manual_seed(0)
        x = torch.randn(1, 16, 16)
        qkv = torch.nn.Linear(16, 48)

        def attend(x: torch.Tensor) -> torch.Tensor:
            q, k, v = qkv(x).view(1, x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        reference = attend(x)
        reference.square().sum().backward()
        ref_grad, qkv.weight.grad = qkv.weight.grad.clone(), None
        try:
            # As torchtitan applies it: the inputs sharded along the sequence, SDPA inside.
            with (
                cpu_ring_attention() if stand_in else contextlib.nullcontext(),
                context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]),
            ):
                out = attend(x)
                out.square().sum().backward()
                (full,) = context_parallel_unshard(mesh, [out.detach()], [2])
            grad = qkv.weight.grad.clone()
            dist.all_reduce(grad)
            results[rank] = (
                "ok",
                float((full - reference).abs().max()),
                float((grad - ref_grad).abs().max()),
            )
        except Exception as exc:  # noqa: BLE001 - what torch raised is the result
            results[rank] = (f"{type(exc).__name__}: {exc}", None, None)
    finally:
        dist.destroy_process_group()


def _run(stand_in: bool) -> dict:
    results = mp.Manager().dict()
    mp.spawn(_cp_rank, args=(2, _free_port(), stand_in, results), nprocs=2)
    return dict(results)


@pytest.mark.slow
def test_torch_context_parallel_cannot_shard_cpu_attention_on_gloo():
    results = _run(stand_in=False)
    for rank in (0, 1):
        assert results[rank][0].startswith("NotImplementedError"), results[rank]
        assert "_scaled_dot_product_flash_attention_for_cpu" in results[rank][0]


@pytest.mark.slow
def test_the_stand_in_runs_torchs_ring_attention_and_matches_plain_sdpa():
    """Forward and backward through torch's ring attention (head-tail load balancer, causal) on
    2 gloo ranks equal plain SDPA on the whole sequence: the unsharded output and the summed
    weight gradient."""
    results = _run(stand_in=True)
    for rank in (0, 1):
        status, out_err, grad_err = results[rank]
        assert status == "ok", status
        assert out_err < 1e-5 and grad_err < 1e-4, (out_err, grad_err)
