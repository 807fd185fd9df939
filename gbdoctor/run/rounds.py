"""Train modes in alternating rounds: the one loop ``run`` and ``price`` measure with, so a price
and the step-time difference ``run`` sets beside it come from the same harness (docs/price.md).

Every mode runs ``rounds`` times, in alternating order (ABC, CBA, ABC, ...), so slow drifts of
the machine hit every mode alike; a mode that failed once is not retried. Compile caches: ``run``
gives each mode its own empty cache (its compile time is reported, and must not profit from
another mode's kernels); ``price`` reports no compile time and uses inductor's own cache, as
training does, so kinds that modes share compile once and a second price reuses the first's
kernels.

Rank processes: ``run`` trains every (round, mode) in freshly spawned ranks, because it reports
each mode's compile time and its process's peak RSS, which earlier jobs in the same process
would change. ``price`` reports neither and reuses its ranks (``reuse_ranks``: inside
``setup.dist.shared_ranks`` one ``RankPool`` runs all its jobs, and its scan's): each job still
builds its model and compiles from a reset Dynamo, loading inductor's kernels as a new process
would; only the process start, torch's import and the group's init are paid once (docs/price.md,
Method).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from gbdoctor.causes import KnownIssue
from gbdoctor.errors import DeadlineError, GbdoctorError, SetupError, SpecError
from gbdoctor.frameworks.interface import Framework
from gbdoctor.records import ModeStatus, RunSettings, Spec
from gbdoctor.records.enums import ModeFailure as FailureKind
from gbdoctor.run.measure import known_bug_workaround, load_average, strip_rank
from gbdoctor.run.worker import ModeFailure, ModeJob, RankRun, run_mode_rank
from gbdoctor.scan.job import Progress
from gbdoctor.setup.compile import Strategy
from gbdoctor.spec import with_overrides


class CompileCache(Enum):
    PER_MODE = "per-mode"
    """A fresh folder per mode, reused by its later rounds, removed at the end."""
    INDUCTOR = "inductor"
    """Inductor's own cache (``TORCHINDUCTOR_CACHE_DIR`` or its default), shared by every mode
    and kept, as in training."""


class KnownBugHit(SetupError):
    """A mode failed on a known upstream bug whose workaround changes the setup, and the caller
    asked not to run around it (``retry_known_bugs=False``)."""

    def __init__(self, mode: str, issue: KnownIssue) -> None:
        super().__init__(f"mode {mode} hits a known upstream bug ({issue.link})")
        self.mode = mode
        self.issue = issue


@dataclass
class Rounds:
    """What the rounds measured, per mode."""

    runs: dict[str, list[list[RankRun]]]
    """Per round, the per-rank runs (only rounds that ran)."""
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)
    """mode -> (error, failure kind) of the round it failed in."""
    workarounds: dict[str, KnownIssue] = field(default_factory=dict)
    """mode -> the known upstream bug it ran around (``with_overrides`` of its overrides)."""
    loads: list[float] = field(default_factory=list)
    """The load average seen before each job."""


def train_rounds(
    spec: Spec,
    framework: Framework,
    strategies: Mapping[str, Strategy],
    settings: RunSettings,
    *,
    progress: Progress | None,
    cache: CompileCache = CompileCache.PER_MODE,
    cudagraph_layers: tuple[str, ...] = (),
    profile_mode: str | None = None,
    retry_known_bugs: bool = True,
    unavailable: Mapping[str, str] | None = None,
    reuse_ranks: bool = False,
) -> Rounds:
    """Train every mode of ``strategies`` (in its order) ``settings.rounds`` times in alternating
    order, each ``settings.warmup`` + ``settings.steps`` steps on ``settings.device``.

    ``profile_mode``: that mode's first round also records its break frames and profiles one
    extra step (``ModeJob.profile_breaks``). ``retry_known_bugs``: a mode that fails on a known
    upstream bug with a config workaround runs again under it (True, what ``run`` does: users run
    the workaround until the fix) or raises :class:`KnownBugHit`. ``unavailable``: modes recorded
    as unavailable with that reason, never run. ``reuse_ranks``: every job on the same rank
    processes (the module doc says when). A SpecError (bad input fails every mode alike)
    propagates."""
    from gbdoctor.setup.dist import fresh_ranks, run_ranks, shared_ranks

    world, rounds = settings.ranks, settings.rounds
    warmup, steps = settings.warmup, settings.steps
    chosen = list(strategies)
    result = Rounds(runs={m: [] for m in chosen})
    for mode, why in (unavailable or {}).items():
        result.failures[mode] = (why, ModeStatus.UNAVAILABLE)
    caches = (
        {m: tempfile.mkdtemp(prefix=f"gbdoctor-run-{m.replace(' ', '-')}-") for m in chosen}
        if cache == CompileCache.PER_MODE
        else {}
    )
    mode_specs: dict[str, Spec] = {}
    total = rounds * len(chosen)
    done = 0
    ranks = contextlib.ExitStack()
    try:
        # run's own jobs spawn fresh ranks also inside a caller's shared_ranks scope (the test
        # session's, tests/conftest.py): its compile times and peak RSS are a new process's.
        ranks.enter_context(shared_ranks() if reuse_ranks else fresh_ranks())
        for r in range(rounds):
            for mode in chosen if r % 2 == 0 else list(reversed(chosen)):
                if mode in result.failures:
                    total -= 1
                    continue
                result.loads.append(load_average())
                say = f"round {r + 1}/{rounds}: {mode}"
                if progress:
                    progress(
                        f"{say}: {warmup} warm-up + {steps} steps on {world} rank(s)", done, total
                    )
                while True:
                    job = ModeJob(
                        spec=mode_specs.get(mode, spec),
                        framework=framework,
                        mode=mode,
                        strategy=strategies[mode],
                        device=settings.device,
                        backend=settings.backend,
                        warmup=warmup,
                        steps=steps,
                        cache_dir=caches.get(mode),
                        # reduce-overhead is inductor's: this mode compiles with it whatever --backend
                        cudagraph_layers=cudagraph_layers if mode == "cudagraphs" else (),
                        profile_breaks=mode == profile_mode and r == 0,
                    )
                    try:
                        result.runs[mode].append(
                            run_ranks(
                                run_mode_rank,
                                job,
                                world_size=world,
                                device_type=settings.device,
                                timeout_s=spec.gbdoctor.timeout_s,
                            )
                        )
                    except ModeFailure as exc:
                        issue = known_bug_workaround(exc.message, strategies[mode])
                        if issue is not None and not retry_known_bugs:
                            raise KnownBugHit(mode, issue) from None
                        if issue is not None and mode not in result.workarounds:
                            result.workarounds[mode] = issue
                            mode_specs[mode] = with_overrides(spec, issue.overrides)
                            if progress:
                                progress(
                                    f"{say}: known upstream bug ({issue.link.split()[0]}); "
                                    "retrying with "
                                    + " ".join(f"--set {o}" for o in issue.overrides),
                                    done,
                                    total,
                                )
                            continue
                        kind = exc.hint or FailureKind.RUNTIME
                        result.failures[mode] = (strip_rank(exc.message, world), kind)
                    except SpecError:
                        raise
                    except GbdoctorError as exc:
                        result.failures[mode] = (strip_rank(exc.message, world), _kind_of(exc))
                    break
                done += 1
    finally:
        ranks.close()
        for folder in caches.values():
            shutil.rmtree(folder, ignore_errors=True)
    if progress:
        progress("done", total, total)
    return result


def _kind_of(exc: GbdoctorError) -> str:
    """A job that failed outside the mode's own code: its deadline passed, or a rank died."""
    return FailureKind.TIMEOUT if isinstance(exc, DeadlineError) else FailureKind.CRASH
