"""Shape streams (``--shapes``): the batch shapes a data pipeline feeds each step on each rank.

A stream is per step and per data-parallel rank: ``{batch, seq}``, or for a packed batch the
document lengths of each row (``docs``: one list per row, each summing to ``seq``; the row is
what the model gets, the documents are where its cu_seqlens / position_ids would restart). A
step with one shape gives it to every rank; a step with N gives rank r the r-th.

The JSON file (``schema_version`` 1, strict keys, bounded like every gbdoctor input)::

    {"schema_version": 1, "source": "", "steps": [
      {"ranks": [{"batch": 2, "seq": 64}]},
      {"ranks": [{"batch": 2, "seq": 48}, {"batch": 1, "seq": 48}]},
      {"ranks": [{"batch": 2, "seq": 64, "docs": [[30, 34], [64]]}]}]}

``records.shape_presets`` makes streams from a distribution (buckets, varlen, packed, a last
partial batch) and pads a stream to N buckets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from gbdoctor.errors import BaselineError
from gbdoctor.records.base import record
from gbdoctor.records.bounds import BATCH_SIZE, SEQ_LEN, STEPS, WORLD_SIZE, Range

__all__ = [
    "SHAPES_SCHEMA_VERSION",
    "RankShape",
    "ShapeStep",
    "ShapeStream",
    "read_shape_stream",
    "shape_stream_from_json",
]

SHAPES_SCHEMA_VERSION = 1
SHAPES_HINT = (
    'a shape stream is JSON: {"schema_version": 1, "steps": [{"ranks": '
    '[{"batch": 2, "seq": 64}]}, ...]} (docs/shapes.md)'
)
DOCS = Range(1, 2**20, "documents")


@record
class RankShape:
    """One rank's batch in one step."""

    batch: Annotated[int, BATCH_SIZE]
    seq: Annotated[int, SEQ_LEN]
    docs: tuple[tuple[Annotated[int, SEQ_LEN], ...], ...] = ()
    """Packed batches: per row, the lengths of the documents packed into it (each row sums to
    ``seq``); empty for a plain batch."""

    @property
    def shape(self) -> tuple[int, int]:
        """What the model's tokens look like: ``(batch, seq)``."""
        return (self.batch, self.seq)


@record
class ShapeStep:
    ranks: tuple[RankShape, ...]
    """One shape for every rank, or one per data-parallel rank."""


@record
class ShapeStream:
    schema_version: int
    steps: tuple[ShapeStep, ...]
    source: str = ""
    """The preset that made the stream (``varlen:steps=30,seed=0``), "" for a written file."""

    @property
    def ranks(self) -> int:
        """Data-parallel ranks the stream names (1: the same shape on every rank)."""
        return max((len(s.ranks) for s in self.steps), default=1)

    def shape(self, step: int, rank: int) -> RankShape:
        """The shape ``rank`` gets in ``step``."""
        shapes = self.steps[step].ranks
        return shapes[rank] if len(shapes) > 1 else shapes[0]

    def tokens(self) -> int:
        """Tokens over every step and rank (a step with one shape counts once per stream rank)."""
        n = self.ranks
        return sum(
            self.shape(i, r).batch * self.shape(i, r).seq
            for i in range(len(self.steps))
            for r in range(n)
        )


def check_stream(stream: ShapeStream, name: str) -> ShapeStream:
    """BaselineError (exit 2) naming the step and rank that is not a possible batch."""
    if not stream.steps:
        raise BaselineError(f"{name}: no steps", hint=SHAPES_HINT)
    if (why := STEPS.problem(len(stream.steps))) is not None:
        raise BaselineError(f"{name}: {len(stream.steps)} steps: {why}")
    n = stream.ranks
    if (why := WORLD_SIZE.problem(n)) is not None:
        raise BaselineError(f"{name}: {n} ranks: {why}")
    for i, step in enumerate(stream.steps):
        if len(step.ranks) not in (1, n):
            raise BaselineError(
                f"{name}: step {i} has {len(step.ranks)} rank shapes, other steps {n}",
                hint="give every step one shape (all ranks) or one per rank",
            )
        for r, shape in enumerate(step.ranks):
            where = f"{name}: step {i} rank {r}"
            if not shape.docs:
                continue
            if len(shape.docs) != shape.batch:
                raise BaselineError(
                    f"{where}: {len(shape.docs)} rows of docs for batch {shape.batch}",
                    hint="docs holds one list of document lengths per row",
                )
            for row in shape.docs:
                if not row or sum(row) != shape.seq or min(row) < 1:
                    raise BaselineError(
                        f"{where}: a packed row's documents {list(row)[:8]} do not sum to seq "
                        f"{shape.seq}",
                        hint="each row packs documents to exactly seq tokens (pad with a last "
                        "document of padding)",
                    )
                if (why := DOCS.problem(len(row))) is not None:
                    raise BaselineError(f"{where}: {why}")
    return stream


def shape_stream_from_json(text: str, name: str) -> ShapeStream:
    from gbdoctor.records.io import check_schema_version, load_record, parse_json_object

    data = parse_json_object(text, name, SHAPES_HINT)
    check_schema_version(data, SHAPES_SCHEMA_VERSION, name, "shape stream", SHAPES_HINT)
    return check_stream(load_record(ShapeStream, data, name, counts=True), name)


def read_shape_stream(path: str | Path) -> ShapeStream:
    """The shape stream in ``path``, checked (one-line BaselineError, exit 2, when it is not)."""
    from gbdoctor.records.io import read_text

    return shape_stream_from_json(read_text(path, "shape stream", SHAPES_HINT), str(path))
