"""From recorded steps to an explanation: warm-up, periods, causes, fixes (``gbdoctor timeline``).

Detection is keyed on Dynamo's records and the framework's, never on a model: a step is slow
*because* Dynamo compiled in it (a recompile: the failed guard says why), because a frame past
``recompile_limit`` ran eagerly (fewer compiled-graph runs than the frame's busiest step), or by
design (an accumulation boundary the framework reported, a batch with more tokens). Periods
come from the steps those events fall on (deterministic), and are cross-checked against the
step times by autocorrelation (a timing: amplitude and confidence).
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict

from gbdoctor.records.enums import FixKind, GuardKind, SlowCause
from gbdoctor.records.timeline import (
    StepCompile,
    TimelineFinding,
    TimelineFix,
    TimelinePeriod,
    TimelineStep,
)

MIN_TIME_CONFIDENCE = 0.6
"""Autocorrelation a step-time period needs before it is reported (noise on a shared CPU
reached 0.55 at some lag in 20 steps)."""

# --------------------------------------------------------------------------- guards in words

_SIZE = re.compile(
    r"tensor '([^']+)' (size|stride) mismatch at index (\d+)\. expected (\d+), actual (\d+)"
)
_EQ = re.compile(r"^(?P<lhs>[\w.\[\]'\"()]+?) == (?P<rhs>.+)$")
_LEN = re.compile(r"len\(([^)]+)\) == (\d+)")
_IDENTITY = re.compile(r"___check_(?:obj|type)_id\(([^,)]+)")


def classify_guard(reason: str, hint: str = "") -> tuple[str, str]:
    """(:class:`GuardKind`, the guard in plain words, without the "how often" part)."""
    m = _SIZE.search(reason)
    if m:
        name, what, dim, old, new = m.groups()
        return GuardKind.TENSOR_SIZE, (
            f"`{name}` changed {what} in dim {dim} ({old} -> {new}); the graph was compiled "
            f"for the static {what} {old}"
        )
    m = _LEN.search(reason)
    if m:
        return GuardKind.LENGTH, f"the length of `{m.group(1)}` is guarded as {m.group(2)}"
    m = _IDENTITY.search(reason)
    if m:
        return GuardKind.IDENTITY, f"`{m.group(1)}` is guarded to be the same object or type"
    m = _EQ.match(reason.strip())
    if m:
        lhs, rhs = m.group("lhs"), m.group("rhs").strip()
        if re.fullmatch(r"-?\d+", rhs):
            owner = "attribute" if "." in lhs or "integer attributes" in hint else "value"
            kind = GuardKind.INT_ATTRIBUTE if owner == "attribute" else GuardKind.CONSTANT
            return kind, f"`{lhs}` is an int {owner} guarded as the constant {rhs}"
        what = "str" if rhs[:1] in "'\"" else "Python value"
        return GuardKind.CONSTANT, f"`{lhs}` is a {what} guarded as the constant {rhs}"
    return GuardKind.OTHER, f"guard `{reason}` failed"


def _guard_subject(reason: str) -> str:
    """What a guard is about, its values left out: one finding for a tensor dim that takes many
    sizes (a varlen stream), one per attribute that takes many values."""
    m = _EQ.match(reason.strip())
    if m:
        return m.group("lhs")
    size = _SIZE.search(reason)
    if size is None:
        return reason
    name, what, dim, _, _ = size.groups()
    return f"{name} {what}[{dim}]"


# --------------------------------------------------------------------------- periods


def event_period(flags: list[bool], start: int) -> tuple[int, tuple[int, ...]] | None:
    """(k, offsets): the smallest k with which the flagged steps from ``start`` on repeat: each
    flag equals the one k steps later across the window from the first to the last flagged
    step, and every offset ``step % k`` of a flagged step is seen at least twice. None when
    nothing repeats. The window ends at the last event: a pattern that stops (a frame reaching
    its recompile limit) is a pattern while it lasts."""
    steps = [i for i in range(start, len(flags)) if flags[i]]
    if len(steps) < 2:
        return None
    first, last = steps[0], steps[-1]
    for k in range(1, last - first + 1):
        if not all(flags[i] == flags[i + k] for i in range(first, last - k + 1)):
            continue
        seen: dict[int, int] = defaultdict(int)
        for s in steps:
            seen[s % k] += 1
        if min(seen.values()) >= 2:
            return k, tuple(sorted(seen))
    return None


def time_period(times: list[float], max_lag: int | None = None) -> tuple[int, float] | None:
    """(lag, autocorrelation) of the strongest positive autocorrelation of ``times`` at lags
    2..n/2 (lag 1 is a trend, not a period); None for fewer than 6 values or a flat series."""
    n = len(times)
    if n < 6:
        return None
    mean = statistics.fmean(times)
    dev = [t - mean for t in times]
    var = sum(d * d for d in dev)
    if var <= 1e-12 * n * mean * mean:  # flat (up to float rounding)
        return None
    best: tuple[int, float] | None = None
    for lag in range(2, (max_lag or n // 2) + 1):
        ac = sum(dev[i] * dev[i + lag] for i in range(n - lag)) / var * n / (n - lag)
        if best is None or ac > best[1] + 1e-9:
            best = (lag, ac)
    return best if best is not None and best[1] > 0 else None


def autocorrelation(times: list[float], lag: int) -> float | None:
    """The autocorrelation at ``lag`` in [-1, 1]; None with fewer than two periods of values."""
    n = len(times)
    if n < 2 * lag:
        return None
    mean = statistics.fmean(times)
    dev = [t - mean for t in times]
    var = sum(d * d for d in dev)
    if var <= 0:
        return None
    ac = sum(dev[i] * dev[i + lag] for i in range(n - lag)) / var * n / (n - lag)
    return max(-1.0, min(1.0, ac))


def warmup_steps(steps: list[TimelineStep]) -> int:
    """Steps up to and including the last one that compiled a frame for the first time."""
    last = 0
    for s in steps:
        if any(c.attempt == 0 and not c.limit_hit for c in s.compiles):
            last = s.step
    return min(last + 1, len(steps))


# --------------------------------------------------------------------------- findings


def _how_often(steps: tuple[int, ...], n: int, start: int) -> tuple[str, int | None]:
    flags = [i in steps for i in range(n)]
    found = event_period(flags, start)
    if len(steps) == 1:
        return f"at step {steps[0]} only", None
    if found is not None:
        k = found[0]
        return ("every step" if k == 1 else f"every {k} steps"), k
    return f"at steps {', '.join(map(str, steps))}", None


def _fix_for(kind: str, eager_period: int | None, variants: int, limit: int) -> TimelineFix:
    if kind == GuardKind.INT_ATTRIBUTE:
        return TimelineFix(
            kind=FixKind.UNSPEC_INT,
            config=(("allow_unspec_int_on_nn_module", "True"),),
            code="keep the counter outside the compiled module, or in a tensor (a buffer)",
            why="Dynamo then traces the int as a symbolic input: one graph for every value",
        )
    if kind == GuardKind.TENSOR_SIZE:
        return TimelineFix(
            kind=FixKind.DYNAMIC_SHAPES,
            config=(("assume_static_by_default", "False"),),
            code="torch._dynamo.mark_dynamic(tensor, dim) on the input, or torch.compile(..., "
            "dynamic=True)",
            why="the sizes are compiled as symbols from the first compile: no recompile when "
            "they change",
        )
    if eager_period is not None:
        wider = max(limit + 1, variants + 2)
        return TimelineFix(
            kind=FixKind.WIDER_CACHE,
            config=(("recompile_limit", str(wider)),),
            why=f"the variants repeat every {eager_period} steps, so they are bounded "
            f"(at most {variants}): a cache of {wider} holds them all",
        )
    return TimelineFix(
        kind=FixKind.NONE,
        code="do not keep a value that changes every step where compiled code reads it; pass "
        "it as an argument or a tensor",
        why="the values do not repeat: a wider cache would only postpone the limit",
    )


def findings(
    steps: list[TimelineStep], warmup: int, limit: int
) -> tuple[list[TimelineFinding], list[TimelinePeriod]]:
    n = len(steps)
    out: list[TimelineFinding] = []
    periods: list[TimelinePeriod] = []
    times = [s.time_s for s in steps]
    steady = times[warmup:]

    def period_of(flagged: tuple[int, ...], start: int) -> int | None:
        found = event_period([i in flagged for i in range(n)], start)
        if found is None:
            return None
        k, offsets = found
        # Compared from the pattern's first event on (a fallback starts at the limit hit).
        window = range(max(warmup, min(flagged)), n)
        slow = [times[i] for i in window if i % k in offsets]
        rest = [times[i] for i in window if i % k not in offsets]
        amp = statistics.median(slow) - statistics.median(rest) if slow and rest else None
        if any(p.k == k and p.offset == offsets[0] and p.source == "events" for p in periods):
            return k
        periods.append(
            TimelinePeriod(
                k=k,
                offset=offsets[0],
                source="events",
                amplitude_s=amp,
                confidence=autocorrelation([times[i] for i in window], k) if k > 1 else None,
            )
        )
        return k

    # Recompiles and eager fallbacks, per frame and guard subject.
    eager_by_frame: dict[str, list[int]] = defaultdict(list)
    for s in steps:
        for name in s.eager_frames:
            eager_by_frame[name].append(s.step)
    groups: dict[tuple[str, str], list[tuple[int, StepCompile]]] = defaultdict(list)
    # Recompiles in warm-up steps are part of compiling (they are in the steps and frames);
    # a frame that hit its limit there is reported below all the same.
    for s in steps[warmup:]:
        for c in s.compiles:
            if c.attempt > 0 and not c.limit_hit:
                groups[(c.frame, _guard_subject(c.guard))].append((s.step, c))
    limit_hits = {c.frame: (s.step, c) for s in steps for c in s.compiles if c.limit_hit}
    for (frame, _), items in sorted(groups.items()):
        at = tuple(sorted({i for i, _ in items}))
        first = items[0][1]
        how, k = _how_often(at, n, at[0])
        eager = tuple(eager_by_frame.get(frame, ()))
        eager_k = period_of(eager, eager[0]) if eager else None
        per_step = max(sum(1 for i, _ in items if i == j) for j in at)
        fix = _fix_for(first.guard_kind, eager_k, (eager_k or 0) * per_step, limit)
        hit = limit_hits.get(frame)
        summary = f"{frame} recompiles {how} ({len(items)} recompiles)"
        if hit is not None:
            summary += f"; hit recompile_limit ({limit}) in step {hit[0]}"
        out.append(
            TimelineFinding(
                cause=SlowCause.RECOMPILE,
                problem=True,
                steps=at,
                frame=frame,
                guard=first.guard,
                guard_kind=first.guard_kind,
                plain=f"{first.plain}; it changes {how}".replace("changes at", "changed at"),
                summary=summary,
                period=k if len(at) > 1 else None,
                fix=fix,
            )
        )
        if k is not None and len(at) > 1:
            period_of(at, at[0])
        if eager:
            out.append(
                TimelineFinding(
                    cause=SlowCause.EAGER_FALLBACK,
                    problem=True,
                    steps=eager,
                    frame=frame,
                    guard=hit[1].guard if hit else first.guard,
                    guard_kind=first.guard_kind,
                    plain=f"{frame} hit recompile_limit ({limit}); from then on a call that "
                    "matches none of its cached graphs runs eagerly"
                    + (f", here every {eager_k} steps" if eager_k else ", every step"),
                    summary=f"{frame} ran (partly) eagerly in {len(eager)} steps from step {eager[0]}",
                    period=eager_k,
                    fix=fix,
                )
            )

    reported = {f.frame for f in out}
    for frame, (hit_step, hit_compile) in sorted(limit_hits.items()):
        if frame in reported:
            continue
        out.append(
            TimelineFinding(
                cause=SlowCause.EAGER_FALLBACK,
                problem=True,
                steps=(hit_step,),
                frame=frame,
                guard=hit_compile.guard,
                guard_kind=hit_compile.guard_kind,
                plain=f"{frame} hit recompile_limit ({limit}) in step {hit_step}; from then on its calls "
                "that match none of its cached graphs run eagerly, the same in every step (its "
                "compiled-graph runs per step do not vary: a constant cost, not a pattern)",
                summary=f"{frame} past recompile_limit since step {hit_step}",
                fix=_fix_for(hit_compile.guard_kind, None, 0, limit),
            )
        )

    # Periodic by design: accumulation boundaries, larger batches.
    boundary = tuple(s.step for s in steps if s.boundary)
    if boundary and len(boundary) < n:
        k = period_of(boundary, boundary[0])
        on = [s for s in steps[warmup:] if s.boundary]
        off = [s for s in steps[warmup:] if not s.boundary]
        out.append(
            TimelineFinding(
                cause=SlowCause.ACCUMULATION_BOUNDARY,
                problem=False,
                steps=boundary,
                plain="the gradient accumulation boundary: "
                + _boundary_words(on, off, recompiled=any(s.compiles for s in on)),
                summary=f"every {k} steps by design" if k else "by design",
                period=k,
                fix=TimelineFix(kind=FixKind.NONE, why="periodic by design"),
            )
        )
    tokens = [s.tokens for s in steps]
    if len(set(tokens)) > 1:
        big = tuple(s.step for s in steps if s.tokens == max(tokens))
        k = period_of(big, big[0])
        out.append(
            TimelineFinding(
                cause=SlowCause.INPUT_SIZE,
                problem=False,
                steps=big,
                plain=f"these steps have {max(tokens)} tokens per rank, the others "
                f"{min(tokens)}: more work by design",
                summary=f"every {k} steps by design" if k else "by design",
                period=k,
                fix=TimelineFix(kind=FixKind.NONE, why="periodic by design"),
            )
        )
    found = time_period(steady)
    if found is not None and found[1] >= MIN_TIME_CONFIDENCE and len(steady) >= 3 * found[0]:
        periods.append(
            TimelinePeriod(k=found[0], offset=0, source="step-times", confidence=found[1])
        )
    return out, periods


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _boundary_words(on: list[TimelineStep], off: list[TimelineStep], *, recompiled: bool) -> str:
    if not on or not off:
        return "not enough steady steps to compare"
    parts = []
    for label, get in (
        ("step", lambda s: s.time_s),
        ("optimizer", lambda s: s.optimizer_s),
        ("backward", lambda s: s.backward_s),
        ("collectives", lambda s: s.collective_s),
    ):
        a, b = _median([get(s) for s in on]), _median([get(s) for s in off])
        parts.append(f"{label} {a * 1e3:.1f} vs {b * 1e3:.1f} ms")
    calls_on = _median([float(s.collective_calls) for s in on])
    calls_off = _median([float(s.collective_calls) for s in off])
    what = "; ".join(parts)
    return (
        f"{what} (boundary vs other steps, medians); collective calls {calls_on:.0f} vs "
        f"{calls_off:.0f}; "
        + ("Dynamo also compiled in boundary steps" if recompiled else "no recompile there")
    )


def verdict(found: list[TimelineFinding], warmup: int) -> str:
    problems = [f for f in found if f.problem]
    design = sorted(
        {f"{f.cause} every {f.period} steps" for f in found if not f.problem and f.period}
    )
    by_design = f"periodic by design: {', '.join(design)}" if design else ""
    if not problems:
        if by_design:
            return f"nothing is wrong: after {warmup} warm-up step(s) the pattern is {by_design}"
        return f"nothing is wrong: after {warmup} warm-up step(s) no recompile or eager step"
    causes = ", ".join(sorted({f.cause for f in problems}))
    line = f"{len(problems)} problem(s) after {warmup} warm-up step(s): {causes}"
    return f"{line}; {by_design}" if by_design else line
