"""Why ``context_parallel_degree > 1`` is refused (``frameworks/common/sections.py``): torch's
context parallelism, run for real on two gloo ranks, cannot shard the CPU attention kernel. When
a torch release adds the rule this test fails, and the refusal must go."""

from __future__ import annotations

import os
import socket

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cp_rank(rank: int, world: int, port: int, results) -> None:
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
        torch.manual_seed(0)
        x = torch.randn(1, 16, 16)
        qkv = torch.nn.Linear(16, 48)
        try:
            # As torchtitan applies it: the inputs sharded along the sequence, SDPA inside.
            with context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]):
                q, k, v = qkv(x).view(1, 16 // world, 3, 2, 8).permute(2, 0, 3, 1, 4)
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            results[rank] = "ok"
        except Exception as exc:  # noqa: BLE001 - what torch raised is the result
            results[rank] = f"{type(exc).__name__}: {exc}"
    finally:
        dist.destroy_process_group()


def test_torch_context_parallel_cannot_shard_cpu_attention_on_gloo():
    results = mp.Manager().dict()
    mp.spawn(_cp_rank, args=(2, _free_port(), results), nprocs=2)
    for rank in (0, 1):
        assert results[rank].startswith("NotImplementedError"), results[rank]
        assert "_scaled_dot_product_flash_attention_for_cpu" in results[rank]
