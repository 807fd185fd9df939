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
