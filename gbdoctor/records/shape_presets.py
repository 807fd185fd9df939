"""Shape streams made from a distribution (``--shapes varlen:steps=30,seed=0``), and a stream
padded to N buckets (a fix, with its cost in padding tokens).

Every preset is deterministic: ``random.Random(seed)`` per rank, nothing else. ``ranks=N``
draws each data-parallel rank's shapes on its own (per-rank lengths, as a sampler without
cross-rank bucketing gives them).

=================  ===========================================================================
``varlen``         unpadded lengths: each step a multiple of ``multiple`` in [``min``, ``max``]
``buckets``        each step one of ``lens`` (``lens=32/48/64``), drawn uniformly
``packed``         rows packed to ``seq`` with documents of mean length ``mean`` (exponential)
``last-partial``   epochs of ``samples`` sequences in batches of ``batch``: the last is smaller
``flattened``      each step's ``batch`` documents (mean length ``mean``, at most ``max``) in one
                   row (padding-free packing, Hugging Face's ``DataCollatorWithFlattening``)
=================  ===========================================================================
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

from gbdoctor.errors import SpecError
from gbdoctor.records.bounds import BATCH_SIZE, SEQ_LEN, STEPS, WORLD_SIZE, Range
from gbdoctor.records.shapes import (
    SHAPES_SCHEMA_VERSION,
    RankShape,
    ShapeStep,
    ShapeStream,
    check_stream,
)

__all__ = ["PRESETS", "pad_to_buckets", "preset_stream"]

_COMMON = {"steps": 30, "batch": 2, "seed": 0, "ranks": 1}
PRESETS: dict[str, dict[str, int | str]] = {
    "varlen": {**_COMMON, "min": 8, "max": 64, "multiple": 8},
    "buckets": {**_COMMON, "lens": "32/48/64"},
    "packed": {**_COMMON, "seq": 64, "mean": 16},
    "last-partial": {**_COMMON, "seq": 64, "samples": 7},
    "flattened": {**_COMMON, "batch": 4, "mean": 16, "max": 64},
}
"""Preset name -> its parameters with their defaults."""
_RANGES = {
    "steps": STEPS,
    "batch": BATCH_SIZE,
    "ranks": WORLD_SIZE,
    "seed": Range(0, 2**32, ""),
    "samples": Range(1, 2**30, "sequences"),
}
HINT = "e.g. --shapes varlen:steps=30,min=8,max=64 (presets: " + ", ".join(PRESETS) + ")"


def is_preset(text: str) -> bool:
    """``text`` names a preset (``NAME`` or ``NAME:k=v,...``) rather than a file."""
    return text.partition(":")[0] in PRESETS


def _params(text: str) -> tuple[str, dict[str, int | str]]:
    name, _, rest = text.partition(":")
    values = dict(PRESETS[name])
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in values:
            raise SpecError(
                f"--shapes {name}: unknown parameter {item[:40]!r}",
                hint=f"{name} takes {', '.join(f'{k}={v}' for k, v in PRESETS[name].items())}",
            )
        if key == "lens":
            values[key] = value
            continue
        try:
            number = int(value)
        except ValueError:
            raise SpecError(f"--shapes {name}: {key}={value[:40]} is not an integer") from None
        bound = _RANGES.get(key, SEQ_LEN)
        if (why := bound.problem(number)) is not None:
            raise SpecError(f"--shapes {name}: {key} {why}")
        values[key] = number
    return name, values


def _lens(text: str) -> list[int]:
    try:
        lens = [int(x) for x in text.split("/") if x.strip()]
    except ValueError:
        lens = []
    if not lens or any(SEQ_LEN.problem(x) for x in lens):
        raise SpecError(f"--shapes buckets: lens={text[:40]} is not lengths like 32/48/64")
    return lens


def _packed_row(rng: random.Random, seq: int, mean: int) -> tuple[int, ...]:
    docs, left = [], seq
    while left:
        length = min(left, max(1, math.ceil(rng.expovariate(1 / mean))))
        docs.append(length)
        left -= length
    return tuple(docs)


def _rank_shapes(name: str, v: dict[str, int | str], rank: int) -> list[RankShape]:
    rng = random.Random(int(v["seed"]) * 1_000_003 + rank)
    steps, batch = int(v["steps"]), int(v["batch"])
    if name == "varlen":
        low, high, mult = int(v["min"]), int(v["max"]), int(v["multiple"])
        choices = [x for x in range(mult, high + 1, mult) if x >= low]
        if not choices:
            raise SpecError(f"--shapes varlen: no multiple of {mult} between {low} and {high}")
        return [RankShape(batch=batch, seq=rng.choice(choices)) for _ in range(steps)]
    if name == "buckets":
        lens = _lens(str(v["lens"]))
        return [RankShape(batch=batch, seq=rng.choice(lens)) for _ in range(steps)]
    if name == "packed":
        seq, mean = int(v["seq"]), int(v["mean"])
        return [
            RankShape(
                batch=batch,
                seq=seq,
                docs=tuple(_packed_row(rng, seq, mean) for _ in range(batch)),
            )
            for _ in range(steps)
        ]
    if name == "flattened":
        # Padding-free: the batch's documents end to end in one row, whose length is their sum.
        mean, most = int(v["mean"]), int(v["max"])
        if (why := SEQ_LEN.problem(most * batch)) is not None:
            raise SpecError(f"--shapes flattened: max {most} x batch {batch}: {why}")
        rows = [
            tuple(min(most, max(1, math.ceil(rng.expovariate(1 / mean)))) for _ in range(batch))
            for _ in range(steps)
        ]
        return [RankShape(batch=1, seq=sum(row), docs=(row,)) for row in rows]
    # last-partial: full batches, then what is left of the epoch's samples.
    samples, seq = int(v["samples"]), int(v["seq"])
    epoch = [batch] * (samples // batch) + ([samples % batch] if samples % batch else [])
    return [RankShape(batch=epoch[i % len(epoch)], seq=seq) for i in range(steps)]


def preset_stream(text: str) -> ShapeStream:
    """The stream a preset spec (``NAME:k=v,...``) makes; SpecError (exit 2) for a bad one."""
    if not is_preset(text):
        raise SpecError(f"--shapes {text[:60]}: not a preset", hint=HINT)
    name, values = _params(text)
    ranks = int(values["ranks"])
    per_rank = [_rank_shapes(name, values, r) for r in range(ranks)]
    steps = tuple(
        ShapeStep(ranks=tuple(per_rank[r][i] for r in range(ranks)))
        for i in range(int(values["steps"]))
    )
    source = f"{name}:" + ",".join(f"{k}={v}" for k, v in values.items())
    stream = ShapeStream(schema_version=SHAPES_SCHEMA_VERSION, steps=steps, source=source)
    return check_stream(stream, f"--shapes {name}")


def _best_buckets(weights: Counter[int], n: int) -> tuple[int, ...]:
    """The ``n`` bucket lengths that pad the fewest tokens (``weights``: rows per length): an
    exact partition of the sorted lengths into contiguous groups, each padded to its longest."""
    lens = sorted(weights)
    if n >= len(lens):
        return tuple(lens)

    def cost(i: int, j: int) -> int:  # lens[i..j] padded to lens[j]
        return sum(weights[x] * (lens[j] - x) for x in lens[i : j + 1])

    k = len(lens)
    inf = float("inf")
    # best[g][j]: the least padding of lens[0..j] in g groups, the last ending at j.
    best = [[inf] * k for _ in range(n + 1)]
    back = [[0] * k for _ in range(n + 1)]
    for j in range(k):
        best[1][j] = cost(0, j)
    for g in range(2, n + 1):
        for j in range(k):
            for i in range(1, j + 1):
                c = best[g - 1][i - 1] + cost(i, j)
                if c < best[g][j]:
                    best[g][j], back[g][j] = c, i
    ends, j, g = [], k - 1, n
    while g >= 1 and j >= 0:
        ends.append(lens[j])
        j, g = (back[g][j] - 1, g - 1) if g > 1 else (-1, 0)
    return tuple(sorted(ends))


def pad_to_buckets(stream: ShapeStream, n: int) -> tuple[ShapeStream, tuple[int, ...], int]:
    """``stream`` with every sequence padded up to one of ``n`` bucket lengths chosen to pad
    the fewest tokens: (padded stream, the buckets, padding tokens over the whole stream). A
    packed row gets its padding as one more document."""
    if n < 1:
        raise SpecError(f"--pad-buckets must be at least 1 (got {n})")
    weights: Counter[int] = Counter()
    for i in range(len(stream.steps)):
        for r in range(stream.ranks):
            shape = stream.shape(i, r)
            weights[shape.seq] += shape.batch
    buckets = _best_buckets(weights, n)

    def padded(shape: RankShape) -> RankShape:
        seq = min(b for b in buckets if b >= shape.seq)
        docs = tuple((*row, seq - shape.seq) if seq > shape.seq else row for row in shape.docs)
        return replace(shape, seq=seq, docs=docs)

    steps = tuple(ShapeStep(ranks=tuple(padded(s) for s in step.ranks)) for step in stream.steps)
    out = replace(
        stream,
        steps=steps,
        source=f"{stream.source or 'file'} padded to {len(buckets)} buckets",
    )
    return out, buckets, out.tokens() - stream.tokens()
