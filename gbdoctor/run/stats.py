"""Per-mode statistics over a run's rounds: a mode's result from its ranks' measurements, ratios
with their spread, loss divergence.

Definitions (also in docs/run.md):

* step time: wall time of one training step (forward, backward, optimizer step, loss
  all-reduce); with N ranks, the slowest rank's time for that step.
* tokens/s: global tokens per step (local batch x seq len x ranks) / median measured step time
  over every round. Compilation is in the warm-up steps and never counted.
* compile time: wall time of the warm-up steps minus ``warmup`` x the median measured step time
  (clamped at 0), in the first round (the mode's compile cache is empty); later rounds reuse the
  mode's own cache (as a restarted training job would) and are reported as the warm compile time.
  Modes never share a cache. Eager's value is the first-step overhead floor, not compilation.
* peak memory: CUDA ``max_memory_allocated`` over the measured steps (reset after warm-up) on GPU;
  on CPU the rank process's peak RSS over its whole life (``ru_maxrss``), which includes torch
  itself and compilation. Max over ranks and rounds.
* graphs: Dynamo's ``unique_graphs`` counter (graphs compiled) in the first round, in total and
  during the measured steps.
* recompiles: records of Dynamo's ``recompiles`` log stream. Those during the measured steps are
  findings.
* ratios: eager's (or the best baseline's) median step time over the mode's, computed round by
  round; the ratio is the median of the per-round ratios and the range their min and max.
* MFU (GPU): tokens/s x FLOPs per token (``run.flops``, from the model config) over ranks x the
  device's dense bf16 peak.
* divergence: a mode's first-step loss differs from eager's by more than ``LOSS_RTOL``
  (relative), or any of its losses is not finite.
"""

from __future__ import annotations

import math
import statistics

from gbdoctor.records import LOSS_RTOL, ModeResult, ModeStatus, Verdict
from gbdoctor.run.measure import per_step_max
from gbdoctor.run.worker import RankRun
from gbdoctor.setup.compile import Strategy


def mode_from_rounds(
    mode: str, strategy: Strategy, rounds: list[list[RankRun]], tokens_per_step: int, warmup: int
) -> ModeResult:
    per_round = [per_step_max(ranks, "step_times") for ranks in rounds]
    steps = [t for times in per_round for t in times]
    median = statistics.median(steps)
    phases = [
        tuple(max(r.phase_times[i][k] for r in ranks) for k in range(3))
        for ranks in rounds
        for i in range(len(ranks[0].phase_times))
    ]
    phase_medians = [statistics.median(p[k] for p in phases) if phases else None for k in range(3)]
    warm = [per_step_max(ranks, "warmup_times") for ranks in rounds]
    compile_s = [max(0.0, sum(w) - warmup * statistics.median(t)) for w, t in zip(warm, per_round)]
    first = rounds[0]
    worst = max(
        (r for ranks in rounds for r in ranks),
        key=lambda r: (sum(e.measured and not e.limit_hit for e in r.recompiles), -r.rank),
    )
    rank0 = first[0]
    layout = rank0.layout
    return ModeResult(
        mode=mode,
        strategy=strategy.name,
        status=ModeStatus.OK,
        step_times_s=tuple(steps),
        warmup_times_s=tuple(warm[0]),
        round_medians_s=tuple(statistics.median(t) for t in per_round),
        round_cpu_medians_s=tuple(
            statistics.median(per_step_max(ranks, "step_cpu_times"))
            for ranks in rounds
            if all(r.step_cpu_times for r in ranks)  # every worker records them
        ),
        step_time_median_s=median,
        step_time_min_s=min(steps),
        step_time_max_s=max(steps),
        tokens_per_s=tokens_per_step / median if median > 0 else None,
        forward_s=phase_medians[0],
        backward_s=phase_medians[1],
        optimizer_s=phase_medians[2],
        compile_time_s=compile_s[0],
        compile_time_warm_s=statistics.median(compile_s[1:]) if len(compile_s) > 1 else None,
        dynamo_compile_s=rank0.dynamo_compile_s,
        peak_memory_mib=max(r.peak_memory_mib for ranks in rounds for r in ranks),
        memory_metric=rank0.memory_metric,
        graphs=rank0.graphs,
        graphs_measured=rank0.graphs_measured,
        graph_breaks=rank0.graph_breaks,
        regions=sum(len(regions) for _, regions, _ in layout),
        fullgraph_regions=sum(len(fg) for _, _, fg in layout),
        recompiles=sum(e.measured and not e.limit_hit for e in worst.recompiles),
        recompile_events=tuple(worst.recompiles),
        recompile_limit_hit=any(r.recompile_limit_hit for ranks in rounds for r in ranks),
        cudagraph_skips=tuple(rank0.cudagraph_skips),
        cudagraph_rerecords=tuple(rank0.cudagraph_rerecords),
        losses=tuple(rank0.losses),
        dynamo_config=rank0.dynamo_config,
    )


def ratio_with_spread(
    reference: ModeResult, res: ModeResult
) -> tuple[float, tuple[float, float] | None, str]:
    """(ratio, (min, max) of the per-round ratios, verdict), ratios as reference step time / res's.

    With 2+ rounds the ratio is the median of the per-round ratios (each round's median step
    times), so it always lies inside its own spread; a ratio of step medians pooled over rounds
    can fall outside it when the machine's speed drifts between rounds. With one round it is the
    ratio of the step medians. The verdict calls ``res`` ``faster`` only when every round's ratio
    is above 1 (``slower`` when every one is below), ``within noise`` otherwise, and ``no
    spread`` with a single round."""
    pairs = list(zip(reference.round_medians_s, res.round_medians_s))
    if res is reference:
        return 1.0, ((1.0, 1.0) if len(pairs) > 1 else None), ""
    if len(pairs) < 2:
        ref_median, res_median = reference.step_time_median_s, res.step_time_median_s
        assert ref_median is not None and res_median is not None  # successful modes only
        return ref_median / res_median, None, Verdict.NO_SPREAD
    per_round = [a / b for a, b in pairs]
    ratio = statistics.median(per_round)
    lo, hi = min(per_round), max(per_round)
    verdict = Verdict.FASTER if lo > 1 else Verdict.SLOWER if hi < 1 else Verdict.WITHIN_NOISE
    return ratio, (lo, hi), verdict


def divergence(res: ModeResult, eager: ModeResult | None) -> tuple[bool, float | None]:
    if any(not math.isfinite(x) for x in res.losses):
        return True, None
    if eager is None or res.mode == "eager" or not res.losses or not eager.losses:
        return False, None
    ref, got = eager.losses[0], res.losses[0]
    rel = abs(got - ref) / max(abs(ref), 1e-12)
    return rel > LOSS_RTOL, rel
