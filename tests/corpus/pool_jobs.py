"""``RankPool`` targets: what a rank process is and what state a job finds there."""

from __future__ import annotations

import os
import time

from gbdoctor.errors import SpecError

LEFT_BEHIND = "GBDOCTOR_POOL_LEFT_BEHIND"


def leave_state(payload: object) -> tuple[int, bool, bool, int, int]:
    """Change what a job must not pass on to the next one (the environment, Dynamo's counters
    and config, a compiled frame); :func:`state_found` after the change."""
    import torch
    import torch._dynamo.config
    from torch._dynamo.utils import counters

    os.environ[LEFT_BEHIND] = "1"
    torch._dynamo.config.capture_scalar_outputs = not torch._dynamo.config.capture_scalar_outputs
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    counters["stats"]["left_behind"] += 1
    return state_found(payload)


def state_found(payload: object) -> tuple[int, bool, bool, int, int]:
    """(process id, the environment left behind?, Dynamo's config as torch's default?, compiled
    frames Dynamo knows, Dynamo's unique graphs counted)."""
    import torch._dynamo.config
    from torch._dynamo.convert_frame import FRAME_COUNTER
    from torch._dynamo.utils import counters

    default = torch._dynamo.config._config["capture_scalar_outputs"].default
    return (
        os.getpid(),
        LEFT_BEHIND in os.environ,
        torch._dynamo.config.capture_scalar_outputs == default,
        FRAME_COUNTER,
        int(counters["stats"]["unique_graphs"]) + int(counters["stats"]["left_behind"]),
    )


def fail_on_rank1(payload: object) -> int:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise SpecError("rank 1 refuses", hint="a hint")
    return os.getpid()


def hang(payload: object) -> None:
    time.sleep(3600)


def wait_in_a_collective_rank1_never_joins(payload: object) -> None:
    """Rank 0 says which block it captures, then all-reduces; rank 1 is busy with other work (a
    rank that compiles the block differently): rank 0 waits on a peer that never comes."""
    import torch
    import torch.distributed as dist

    from gbdoctor.setup.rank_main import report_stage

    if dist.get_rank() == 0:
        report_stage("capturing layers.1")
        dist.all_reduce(torch.ones(1))
    else:
        report_stage("capturing layers.0")
        time.sleep(3600)


def uneven_block_runs_under_rank_local_fsdp(payload: object) -> tuple[list[float], bool]:
    """A model under FSDP2 on every rank: one training step, then, inside the scan's capture
    phase (FSDP's and gbdoctor's own collectives served on the rank), rank 0 runs a block and
    sums a loss three times, the other ranks once: the ranks' work differs, as when they compile
    differently. Returns the losses summed the rank-local way, and whether the weight served on
    the rank equals the real all-gather's."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    from gbdoctor.capture import rank_local_fsdp
    from gbdoctor.setup.collectives import all_reduce_sum, rank_local_collectives

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model(torch.randn(2, 8)).sum().backward()  # the warm-up: the same collectives everywhere
    full = model[1].weight.full_tensor().detach().clone()  # a real all-gather: the oracle
    losses = []
    with rank_local_fsdp(model), rank_local_collectives():
        model[1].unshard()  # served on this rank
        served = model[1].weight.detach().clone()
        model[1].reshard()
        for _ in range(3 if dist.get_rank() == 0 else 1):
            loss = model[1](torch.randn(2, 8)).square().mean()
            loss.backward()
            reported = loss.detach().clone()
            all_reduce_sum(reported)
            losses.append(float(reported))
    # Out of the phase: real collectives again, paired on every rank.
    model(torch.randn(2, 8)).sum().backward()
    return losses, torch.equal(served, full)


def report_stages(payload: object) -> int:
    """Say two stages through the rank's progress (rank 0's reach the parent), then answer."""
    import torch.distributed as dist

    from gbdoctor.setup.rank_protocol import rank_progress

    say = rank_progress()
    rank = dist.get_rank()
    if say is not None:
        say(f"stage 1 on rank {rank}", 0, 2)
        say(f"stage 2 on rank {rank}", 1, 2)
    return rank


def working_directory(payload: str | None) -> str:
    """The job's working directory; with a payload, after user code changed it to that."""
    if payload is not None:
        os.chdir(payload)
    return os.getcwd()


def threads_used(payload: object) -> int:
    """The rank's intra-op thread count (``setup.rank_main.rank_threads``)."""
    import torch

    return torch.get_num_threads()
