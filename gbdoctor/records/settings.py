"""How a training command trains (``run``, ``price``, ``timeline``): one :class:`RunSettings`,
resolved once from the spec and the command line (``run/settings.py``) and passed down, so no
stage re-derives the device, the backend or the shape from loose arguments (issue 41)."""

from __future__ import annotations

from typing import Annotated

from gbdoctor.errors import SpecError
from gbdoctor.records.base import record
from gbdoctor.records.bounds import BATCH_SIZE, ROUNDS, SEQ_LEN, STEPS, WARMUP, WORLD_SIZE, Range
from gbdoctor.records.enums import Clock

NO_WARMUP = Range(0, WARMUP.high, "warm-up steps")
"""``timeline`` records every step from the first (its warm-up is what it explains): 0 there;
``run`` and ``price`` need :data:`~gbdoctor.records.bounds.WARMUP` (``run/settings.py``)."""


@record
class RunSettings:
    """Resolved settings of one training command; every field is final (no None meaning "the
    default"), and a value outside its range is refused when the record is built."""

    device: str
    """``cpu`` or ``cuda`` (``setup.dist.resolve_device`` of ``[gbdoctor] device``)."""
    backend: str
    """The compile backend every compiled mode uses (checked against torch's list)."""
    warmup: Annotated[int, NO_WARMUP]
    """Warm-up steps per mode before the measured ones (compilation happens there)."""
    steps: Annotated[int, STEPS]
    """Measured (``run``, ``price``) or recorded (``timeline``) steps per mode and round."""
    rounds: Annotated[int, ROUNDS]
    """Times every mode runs, in alternating order (1 for ``timeline``)."""
    batch_size: Annotated[int, BATCH_SIZE]
    """Local batch per rank."""
    seq_len: Annotated[int, SEQ_LEN]
    """The longest sequence a step trains (the model is built for it)."""
    seq_lens: tuple[int, ...]
    """The sequence lengths the steps cycle through (``(seq_len,)`` but for ``timeline``)."""
    clock: Clock
    """The time a step is measured in (``price --clock``; wall for the others)."""
    ranks: Annotated[int, WORLD_SIZE]
    """Rank processes: the spec's world size."""
    shape_note: str = ""
    """Where ``batch_size`` and ``seq_len`` come from, for the report."""

    def __post_init__(self) -> None:
        # The library's own check, in the command line's words (cli/bounds.py checks the same
        # ranges before anything heavy; a library caller meets them here).
        for option, value, allowed in (
            ("--rounds", self.rounds, ROUNDS),
            ("--steps", self.steps, STEPS),
            ("--warmup", self.warmup, NO_WARMUP),
            ("--batch-size", self.batch_size, BATCH_SIZE),
            ("--seq-len", self.seq_len, SEQ_LEN),
            *(("--seq-lens", length, SEQ_LEN) for length in self.seq_lens),
            ("ranks", self.ranks, WORLD_SIZE),
        ):
            problem = allowed.problem(value)
            if problem is not None:
                raise SpecError(
                    f"{option} {problem}", hint="the limits are listed in docs/errors.md"
                )
        if self.seq_len != max(self.seq_lens, default=0):
            raise SpecError(
                f"seq_len {self.seq_len} is not the longest of the sequence lengths {self.seq_lens}"
            )
