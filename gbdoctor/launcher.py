"""Which launcher started this process, read from its environment (no torch import).

torchrun, the DeepSpeed launcher and Slurm's ``srun`` start one process per rank and tell each
its place in environment variables; ``detect`` reads them into a :class:`Launched`, and
``setup.launched`` joins that process group instead of spawning ranks (docs/launchers.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gbdoctor.errors import SpecError
from gbdoctor.records.enums import Launcher

SLURM_DEFAULT_PORT_BASE = 20000
"""Under ``srun`` without ``MASTER_PORT``, rank 0 listens on 20000 + (job id mod 10000), so two
jobs sharing a node do not pick the same port (torch's usual 29500 would collide)."""


@dataclass(frozen=True)
class Launched:
    """This process's place in a job a launcher started."""

    launcher: Launcher
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    nodes: int
    master_addr: str
    master_port: int


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise SpecError(f"launcher environment: {name} is not set")
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise SpecError(
            f"launcher environment: {name}={raw!r} is not an integer",
            hint="start gbdoctor with torchrun, deepspeed or srun, or unset the variable",
        ) from None
    if value < 0 or value > 1 << 24:
        raise SpecError(f"launcher environment: {name}={raw!r} is out of range")
    return value


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[07-09,12],cpu3`` -> ``gpu07``."""
    head = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", nodelist.strip())
    if head is None or not head.group(0):
        raise SpecError(f"launcher environment: cannot read the Slurm node list {nodelist!r}")
    prefix, ranges, suffix = head.groups()
    if ranges is None:
        return prefix + suffix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first + suffix


def _tasks_on_first_node(value: str) -> int | None:
    """``SLURM_TASKS_PER_NODE`` (``2(x3),1``): the first node's count."""
    m = re.match(r"\s*(\d+)", value)
    return int(m.group(1)) if m else None


def detect(env: Mapping[str, str] | None = None) -> Launched | None:
    """This process's launcher, or None when gbdoctor was started by hand (it then spawns its
    own ranks). Order: torchrun (``TORCHELASTIC_RUN_ID``), then any env:// launcher (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; the DeepSpeed launcher adds ``LOCAL_SIZE``
    and ``CROSS_SIZE``), then a Slurm job step (``srun``: ``SLURM_STEP_ID``, which a batch
    script's own shell does not have). A malformed variable is a SpecError (exit 2)."""
    env = os.environ if env is None else env
    if all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        world = _int(env, "WORLD_SIZE")
        if "TORCHELASTIC_RUN_ID" in env:
            kind = Launcher.TORCHRUN
            local_world = _int(env, "LOCAL_WORLD_SIZE", world)
            nodes = _int(env, "GROUP_WORLD_SIZE", max(1, world // max(1, local_world)))
        elif "LOCAL_SIZE" in env or "CROSS_SIZE" in env:
            kind = Launcher.DEEPSPEED
            local_world = _int(env, "LOCAL_SIZE", world)
            nodes = _int(env, "CROSS_SIZE", max(1, world // max(1, local_world)))
        else:
            kind = Launcher.ENV
            local_world = _int(env, "LOCAL_WORLD_SIZE", world)
            nodes = max(1, world // max(1, local_world))
        launched = Launched(
            launcher=kind,
            rank=_int(env, "RANK"),
            world_size=world,
            local_rank=_int(env, "LOCAL_RANK", 0),
            local_world_size=local_world,
            nodes=nodes,
            master_addr=env["MASTER_ADDR"],
            master_port=_int(env, "MASTER_PORT"),
        )
    elif all(k in env for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID")):
        world = _int(env, "SLURM_NTASKS")
        nodes = _int(env, "SLURM_NNODES", _int(env, "SLURM_JOB_NUM_NODES", 1))
        per_node = _tasks_on_first_node(env.get("SLURM_TASKS_PER_NODE", ""))
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        addr = env.get("MASTER_ADDR") or (first_host(nodelist) if nodelist else "")
        if not addr:
            raise SpecError(
                "launcher environment: Slurm step without MASTER_ADDR or SLURM_JOB_NODELIST",
                hint="export MASTER_ADDR=<first node's hostname> before srun",
            )
        port = _int(
            env,
            "MASTER_PORT",
            SLURM_DEFAULT_PORT_BASE + _int(env, "SLURM_JOB_ID", 0) % 10000,
        )
        launched = Launched(
            launcher=Launcher.SLURM,
            rank=_int(env, "SLURM_PROCID"),
            world_size=world,
            local_rank=_int(env, "SLURM_LOCALID", 0),
            local_world_size=per_node or max(1, world // max(1, nodes)),
            nodes=nodes,
            master_addr=addr,
            master_port=port,
        )
    else:
        return None
    if launched.world_size < 1 or launched.rank >= launched.world_size:
        raise SpecError(
            f"launcher environment: rank {launched.rank} of world size {launched.world_size}"
        )
    return launched
