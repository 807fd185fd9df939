"""``scan --torchtitan MODULE:CONFIG``: the installed torchtitan sets the model up, gbdoctor
captures it.

Per rank: torchtitan's own config loading, model registry and ``parallelize_fn`` with the
recording compile swapped in (``frameworks.torchtitan.setup``, the installed-torchtitan recipe) ->
torchtitan's own training step as the warm-up -> the same per-block capture, classification
and rank merge as every scan (``rank.capture_set_up``, ``merge.merged_report``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gbdoctor.capture import CaptureSession
from gbdoctor.frameworks.torchtitan.setup import (
    RECIPE,
    TitanRun,
    TitanSetup,
    load_config,
    torchtitan_version,
    world_size_for,
)
from gbdoctor.records import ScanReport, SetupInfo
from gbdoctor.scan.job import Progress, RankScan
from gbdoctor.scan.merge import merged_report
from gbdoctor.scan.rank import capture_set_up
from gbdoctor.setup.dist import run_ranks, single_process_group

DEVICE = "cpu"


@dataclass(frozen=True)
class TitanJob:
    run: TitanRun
    dedupe: bool = True
    strict: bool = False


def scan_torchtitan(
    run: TitanRun,
    *,
    dedupe: bool = True,
    strict: bool = False,
    progress: Progress | None = None,
    timeout_s: float = 1800.0,
) -> ScanReport:
    """Scan the run torchtitan's own code sets up; N ranks when its parallelism asks for them."""
    config = load_config(run)
    world = world_size_for(config)
    job = TitanJob(run=run, dedupe=dedupe, strict=strict)
    if world == 1:
        with single_process_group(DEVICE):
            ranks = [titan_rank(job, progress)]
    else:
        if progress:
            progress(f"capturing on {world} ranks", 0, 1)
        ranks = run_ranks(
            titan_rank_entry,
            job,
            world_size=world,
            device_type=DEVICE,
            timeout_s=timeout_s,
        )
        if progress:
            progress(f"captured on {world} ranks", 1, 1)
    spec = config.model_spec
    return merged_report(run.label, f"{spec.name}/{spec.flavor}", ranks)


def titan_rank_entry(job: TitanJob) -> RankScan:
    return titan_rank(job, None)


def titan_rank(job: TitanJob, progress: Progress | None) -> RankScan:
    session = CaptureSession()
    if progress:
        progress("setting up with torchtitan's own code", 0, 1)
    setup = RECIPE.set_up(
        RECIPE.build(job.run, DEVICE), job.run, session=session, device_type=DEVICE
    )
    tokens, labels = setup.tokens()

    def forward_no_grad() -> None:
        with torch.no_grad():
            RECIPE.forward(setup, tokens, labels)

    attempts = [
        ("torchtitan's eager training step", lambda: RECIPE.train_step(setup, tokens, labels)),
        ("an eager forward", lambda: RECIPE.forward(setup, tokens, labels)),
        ("an eager forward under no_grad", forward_no_grad),
    ]
    with RECIPE.step_context(setup):
        reports, notes = capture_set_up(
            session, setup, attempts, progress, dedupe=job.dedupe, strict=job.strict
        )
    return reports, setup_info(setup), notes + setup.notes + stand_in_notes()


def stand_in_notes() -> tuple[str, ...]:
    return (
        f"set up by torchtitan {torchtitan_version()}'s own code; CPU stand-ins: triton stand-in "
        "while torchtitan loads, 'cpu' device type, FlexAttention's CPU-backward guard lifted, "
        "FSDP2 SUM reductions on gloo, random token ids instead of its dataloader",
    )


def setup_info(setup: TitanSetup) -> SetupInfo:
    import torch.distributed as dist

    ac = setup.config.activation_checkpoint
    ac_mode = type(ac).__qualname__.split(".")[0] if ac is not None else "none"
    dims = setup.parallel_dims
    return SetupInfo(
        strategy=f"torchtitan=={torchtitan_version()}",
        device=DEVICE,
        world_size=dist.get_world_size(),
        ep_degree=dims.ep,
        dp_shard=dims.dp_shard,
        ac_mode=ac_mode,
        ac_option="",
        fsdp=setup.fsdp,
        dynamo_config=tuple(sorted((k, repr(v)) for k, v in setup.dynamo_flags)),
        batch_size=setup.run.batch_size,
        seq_len=setup.run.seq_len,
    )
