"""One rank of one ``gbdoctor run`` mode: build, set up, warm up, measure (a ``run_ranks`` target).

Each mode runs in freshly spawned rank processes (``run``), or in ranks that ``price`` reuses
after resetting Dynamo's caches and counters (``capture.job_state``), so this module's state
(Dynamo caches, the recompile log handler, device peak memory) belongs to one mode only; a
reused process's peak RSS does not, and ``price`` does not read it.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from gbdoctor.capture.counters import (
    counter_totals,
    dynamo_compile_s,
    failure_kind,
    record_cudagraph_log,
)
from gbdoctor.capture.profile import eager_us_of, watch_break_frames
from gbdoctor.capture.recompiles import watch_recompiles
from gbdoctor.errors import GbdoctorError, SetupError, exception_line
from gbdoctor.frameworks.interface import Framework
from gbdoctor.frameworks.registry import cause_taxonomy
from gbdoctor.records import Location, Recompile, Spec
from gbdoctor.setup.compile import Strategy, shown_flags


@dataclass(frozen=True)
class ModeJob:
    """What a rank needs to run one mode (picklable: sent to spawned ranks)."""

    spec: Spec
    framework: Framework
    """The spec's framework, resolved once by the command (it travels with the job, as the
    strategy does)."""
    mode: str
    strategy: Strategy
    device: str
    backend: str
    warmup: int
    steps: int
    cache_dir: str | None = None
    """This mode's compile-cache folder (made and removed by ``run_modes``): empty in the mode's
    first round, reused by its later rounds; never shared with another mode."""
    cudagraph_layers: tuple[str, ...] = ()
    """``cudagraphs`` mode: blocks (FQNs) compiled with inductor's mode="reduce-overhead"."""
    profile_breaks: bool = False
    """``price``: record which frame each graph break ended, and profile one more step (not
    measured) for the eager time inside each frame (``capture.profile``)."""


@dataclass
class RankRun:
    """One rank's measurements of one mode."""

    rank: int
    warmup_times: list[float]
    step_times: list[float]
    losses: list[float]
    peak_memory_mib: float
    memory_metric: str
    graphs: int
    graphs_measured: int
    graph_breaks: int
    dynamo_compile_s: float
    recompiles: list[Recompile]
    recompile_limit_hit: bool
    phase_times: list[tuple[float, float, float]]
    """(forward, backward, optimizer) seconds of every measured step (``setup.train.PHASES``)."""
    layout: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]
    """(block fqn, regions, fullgraph regions) as the setup placed them."""
    cudagraph_skips: list[str] = field(default_factory=list)
    """``cudagraphs`` mode: inductor's skip messages on this rank."""
    cudagraph_rerecords: list[str] = field(default_factory=list)
    """``cudagraphs`` mode: ``function: reason`` of each cudagraph inductor recorded again."""
    break_frames: dict[int, tuple[Location, ...]] = field(default_factory=dict)
    """``profile_breaks``: frame id -> user traceback of the break that ended the frame."""
    eager_us_by_frame: dict[int, float] = field(default_factory=dict)
    """``profile_breaks``: frame id -> eager microseconds in the profiled step."""
    step_cpu_times: list[float] = field(default_factory=list)
    """CPU seconds this rank's process (every thread) spent in each measured step."""
    dynamo_config: tuple[tuple[str, str], ...] = ()
    """The Dynamo settings the setup ran this mode under (``setup.dynamo_flags``, values as
    ``repr``): the framework's own (Accelerate's, torchtitan's) and the strategy's."""


class ModeFailure(SetupError):
    """A mode failed on a rank. Raised (not returned) so ``run_ranks`` stops every rank at once;
    the failure kind travels in ``hint`` because ``run_ranks`` re-raises GbdoctorErrors with
    message and hint only. ``run_modes`` turns it into a failed :class:`ModeResult`."""


def _peak_memory(device_type: str) -> tuple[float, str]:
    if device_type == "cuda":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20, "cuda_max_allocated_measured"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_peak_rss_process"


def run_mode_rank(job: ModeJob) -> RankRun:
    """One rank of one mode (a ``run_ranks`` target; the process group is initialized)."""
    if job.cache_dir is not None:
        # Read lazily by inductor (and triton), so setting them before the first compile works.
        rank_dir = os.path.join(job.cache_dir, f"rank{os.environ.get('RANK', '0')}")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = rank_dir
        os.environ["TRITON_CACHE_DIR"] = os.path.join(rank_dir, "triton")
    return _run_mode_rank(job)


def _reduce_overhead_compile_fn(layers: tuple[str, ...]) -> Any:
    """Compile regions inside ``layers`` with inductor's mode="reduce-overhead" (cudagraph trees);
    the plan's other regions with inductor as usual."""
    import torch

    from gbdoctor.capture import within

    def compile_region(module: Any, fqn: str, fullgraph: bool) -> Any:
        mode = "reduce-overhead" if any(within(fqn, layer) for layer in layers) else None
        return torch.compile(module, backend="inductor", fullgraph=fullgraph, mode=mode)

    return compile_region


def _run_mode_rank(job: ModeJob) -> RankRun:
    import torch
    import torch.distributed as dist

    from gbdoctor.models import vocab_size
    from gbdoctor.setup.train import step_batch

    spec = job.spec
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = job.device == "cuda"
    try:
        recipe = job.framework
        model, meshes = recipe.build(spec, job.device)
        compile_fn = (
            _reduce_overhead_compile_fn(job.cudagraph_layers) if job.cudagraph_layers else None
        )
        setup = recipe.set_up(
            model, spec, meshes, strategy=job.strategy, backend=job.backend, compile_fn=compile_fn
        )
        vocab = vocab_size(model)
    except GbdoctorError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported as the mode's failure
        raise ModeFailure(f"setup: {exception_line(exc)}", "setup") from exc
    layout = tuple((s.fqn, s.regions, s.fullgraph_regions) for s in setup.blocks)

    warmup_times: list[float] = []
    step_times: list[float] = []
    phase_times: list[tuple[float, float, float]] = []
    step_cpu_times: list[float] = []
    losses: list[float] = []
    graphs_before_measured = 0
    warmup_compile_s = 0.0
    total = job.warmup + job.steps
    sync = torch.cuda.synchronize if cuda else None
    with (
        watch_recompiles() as watch,
        record_cudagraph_log()
        if job.cudagraph_layers
        else contextlib.nullcontext() as cudagraph_log,
        watch_break_frames() if job.profile_breaks else contextlib.nullcontext() as break_frames,
        recipe.step_context(setup),
    ):
        for step in range(total):
            measured = step >= job.warmup
            if step == job.warmup:
                graphs_before_measured = counter_totals()[0]
                warmup_compile_s = dynamo_compile_s()
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
            watch.tag(step=step, measured=measured)
            tokens, labels = step_batch(spec, meshes, vocab, step)
            if world > 1:
                dist.barrier()
            if cuda:
                torch.cuda.synchronize()
            start, cpu_start = time.perf_counter(), time.process_time()
            try:
                loss, phases = recipe.timed_train_step(setup, tokens, labels, sync=sync)
            except Exception as exc:  # noqa: BLE001 - reported as the mode's failure
                phase = f"{'measured' if measured else 'warm-up'} step {step - job.warmup if measured else step}"
                line = exception_line(exc)
                raise ModeFailure(
                    f"{phase}: {line}{cause_taxonomy().known_issue_note(line)}", failure_kind(exc)
                ) from exc
            elapsed = time.perf_counter() - start
            (step_times if measured else warmup_times).append(elapsed)
            if measured:
                phase_times.append(phases)
                step_cpu_times.append(time.process_time() - cpu_start)
            losses.append(loss)
        eager_us: dict[int, float] = {}
        if job.profile_breaks:  # one more step, profiled and not measured (same batch)
            if world > 1:
                dist.barrier()
            try:
                eager_us = eager_us_of(
                    lambda: recipe.timed_train_step(setup, tokens, labels, sync=sync),
                    job.device,
                    set(break_frames.frames) if break_frames is not None else set(),
                )
            except Exception as exc:  # noqa: BLE001 - reported as the mode's failure
                raise ModeFailure(
                    f"profiled step: {exception_line(exc)}", failure_kind(exc)
                ) from exc
    recipe.release_rank()
    graphs, breaks = counter_totals()
    peak, metric = _peak_memory(job.device)
    return RankRun(
        rank=rank,
        warmup_times=warmup_times,
        step_times=step_times,
        losses=losses,
        peak_memory_mib=peak,
        memory_metric=metric,
        graphs=graphs,
        graphs_measured=graphs - graphs_before_measured,
        graph_breaks=breaks,
        dynamo_compile_s=warmup_compile_s,
        recompiles=watch.records,
        recompile_limit_hit=watch.limit_hit,
        phase_times=phase_times,
        cudagraph_skips=list(cudagraph_log.reasons) if cudagraph_log is not None else [],
        cudagraph_rerecords=list(cudagraph_log.rerecords) if cudagraph_log is not None else [],
        dynamo_config=shown_flags(setup.dynamo_flags),
        layout=layout,
        break_frames=dict(break_frames.frames) if break_frames is not None else {},
        eager_us_by_frame=eager_us,
        step_cpu_times=step_cpu_times,
    )
