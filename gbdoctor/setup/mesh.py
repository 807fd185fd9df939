"""Device meshes of one rank, built the way torchtitan's dp2ep layout builds them, on an
initialized default process group (``setup.dist`` makes the group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gbdoctor.errors import SetupError
from gbdoctor.records import ParallelSpec


@dataclass
class Meshes:
    """Device meshes of one rank, built the way torchtitan's dp2ep layout builds them."""

    rank: int
    world_size: int
    device: Any
    """torch.device of this rank."""
    dp: Any
    """Mesh FSDP2 shards dense parameters over (1-D dp_shard, or 2-D with dp_replicate)."""
    ep: Any | None
    """1-D expert-parallel mesh (None when EP is 1)."""
    edp: Any | None
    """Mesh FSDP2 shards expert parameters over when EP > 1 (efsdp = dp_shard / ep)."""
    tp: Any | None = None
    """1-D tensor-parallel mesh (None when TP is 1); the innermost dimension, as in torchtitan."""
    pp: Any | None = None
    """1-D pipeline-parallel mesh (None when PP is 1); the outermost dimension, as in torchtitan:
    the ranks of one stage form a whole data-parallel (x TP) world of their own."""
    cp: Any | None = None
    """1-D context-parallel mesh (None when CP is 1), between dp_shard and tp as in torchtitan;
    FSDP2 shards over dp_shard x cp flattened (``dp``), the ranks of one CP group read the same
    rows of the batch and each keeps its share of the sequence (``setup.context_parallel``)."""
    cp_rotate_method: str = "allgather"
    """``parallelism.context_parallel_rotate_method``: how ring attention passes K/V around."""

    @property
    def pp_degree(self) -> int:
        return 1 if self.pp is None else self.pp.size()

    @property
    def pp_rank(self) -> int:
        return 0 if self.pp is None else self.pp.get_local_rank()

    @property
    def dp_group(self) -> Any:
        """Group over which data-parallel quantities (loss, token counts) are summed: every rank
        without TP; with TP, the ranks of this rank's TP position (TP ranks hold the same data)."""
        import torch.distributed as dist

        if self.tp is None and self.pp is None:
            return dist.group.WORLD
        return self.dp.get_group() if self.dp.ndim == 1 else self.dp._flatten("dp").get_group()

    @property
    def tp_degree(self) -> int:
        return 1 if self.tp is None else self.tp.size()

    @property
    def data_rank(self) -> int:
        """Which rows of the global batch this rank reads: TP ranks of one group read the same,
        and so do the PP ranks of one data-parallel position (each runs its stage on it)."""
        return (self.rank % (self.world_size // self.pp_degree)) // (
            self.tp_degree * self.cp_degree
        )

    @property
    def data_world(self) -> int:
        """How many distinct shares of the global batch there are (the data-parallel degree)."""
        return self.world_size // self.tp_degree // self.pp_degree // self.cp_degree

    @property
    def cp_degree(self) -> int:
        return 1 if self.cp is None else self.cp.size()

    @property
    def ep_degree(self) -> int:
        return 1 if self.ep is None else self.ep.size()


def build_meshes(parallel: ParallelSpec, device_type: str) -> Meshes:
    """Meshes for an initialized default process group whose size is ``parallel.world_size``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()
    if world != parallel.world_size:
        raise SetupError(
            f"process group has {world} ranks but the spec needs {parallel.world_size}"
        )
    rep, shard, ep = (
        parallel.data_parallel_replicate_degree,
        parallel.dp_shard,
        parallel.expert_parallel_degree,
    )
    tp, pp = parallel.tensor_parallel_degree, parallel.pipeline_parallel_degree
    cp = parallel.context_parallel_degree
    tp_mesh = pp_mesh = cp_mesh = None
    # PP is the outermost dimension (torchtitan's ["pp", "dp_replicate", "dp_shard", "cp", "tp"]).
    outer_names, outer_sizes = (("pp",), (pp,)) if pp > 1 else ((), ())
    if cp > 1:
        # torchtitan's ["dp_replicate", "dp_shard", "cp"] (CP with TP, PP or EP is refused by
        # the spec check): FSDP2 shards over dp_shard x cp, flattened as its dp_shard_cp.
        names = (("dp_replicate",) if rep > 1 else ()) + ("dp_shard", "cp")
        sizes = ((rep,) if rep > 1 else ()) + (shard, cp)
        world_mesh = init_device_mesh(device_type, sizes, mesh_dim_names=names)
        cp_mesh = world_mesh["cp"]
        dp = world_mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        if rep > 1:
            dp = world_mesh["dp_replicate", "dp_shard_cp"]
    elif tp > 1 or pp > 1:
        # One world mesh with TP innermost (torchtitan's dense mesh), so that FSDP2's dp mesh and
        # the TP mesh share a parent: that is what makes 2-D (FSDP x TP) parameters possible.
        names = (
            outer_names
            + (("dp_replicate",) if rep > 1 else ())
            + ("dp_shard",)
            + (("tp",) if tp > 1 else ())
        )
        sizes = outer_sizes + ((rep,) if rep > 1 else ()) + (shard,) + ((tp,) if tp > 1 else ())
        world_mesh = init_device_mesh(device_type, sizes, mesh_dim_names=names)
        tp_mesh = world_mesh["tp"] if tp > 1 else None
        pp_mesh = world_mesh["pp"] if pp > 1 else None
        dp = world_mesh["dp_replicate", "dp_shard"] if rep > 1 else world_mesh["dp_shard"]
    elif rep > 1:
        dp = init_device_mesh(
            device_type, (rep, shard), mesh_dim_names=("dp_replicate", "dp_shard")
        )
    else:
        dp = init_device_mesh(device_type, (shard,), mesh_dim_names=("dp_shard",))
    ep_mesh = edp = None
    if ep > 1:
        # EP borrows ranks from the FSDP dimension ("dp2ep"): dp_shard = efsdp * ep.
        sparse = init_device_mesh(
            device_type,
            outer_sizes + (rep, shard // ep, ep),
            mesh_dim_names=outer_names + ("dp_replicate", "efsdp", "ep"),
        )
        ep_mesh = sparse["ep"]
        edp = sparse["dp_replicate", "efsdp"] if rep > 1 else sparse["efsdp"]
    if device_type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device(device_type)
    return Meshes(
        rank=rank,
        world_size=world,
        device=device,
        dp=dp,
        ep=ep_mesh,
        edp=edp,
        tp=tp_mesh,
        pp=pp_mesh,
        cp=cp_mesh,
        cp_rotate_method=parallel.context_parallel_rotate_method,
    )
