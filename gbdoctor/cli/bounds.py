"""The command line's numbers checked with their unit before anything heavy (issue 45: `price
--rounds 0` was found after an 8 to 16 s scan, `--steps 99999999999999999999` ran until killed).
The ranges are the records' own (``records.bounds``), so what an option accepts a JSON that
records it accepts too."""

from __future__ import annotations

from collections.abc import Iterable

from gbdoctor.errors import SpecError
from gbdoctor.records.bounds import BATCH_SIZE, ROUNDS, SEQ_LEN, STEPS, WARMUP, Range

TIMELINE_STEPS = Range(2, STEPS.high, "steps")
"""A timeline explains a pattern between steps: one step has none."""


def check_options(options: Iterable[tuple[str, int | None, Range]]) -> None:
    """SpecError (exit 2) naming the first option whose value is outside its range; None means
    the option was not given."""
    for name, value, allowed in options:
        problem = None if value is None else allowed.problem(value)
        if problem is not None:
            raise SpecError(f"{name} {problem}", hint="the limits are listed in docs/errors.md")


def check_measuring(
    rounds: int, steps: int, warmup: int, batch_size: int | None, seq_len: int | None
) -> None:
    """``run``'s and ``price``'s measuring options."""
    check_options(
        (
            ("--rounds", rounds, ROUNDS),
            ("--steps", steps, STEPS),
            ("--warmup", warmup, WARMUP),
            ("--batch-size", batch_size, BATCH_SIZE),
            ("--seq-len", seq_len, SEQ_LEN),
        )
    )


def check_timeline(steps: int, batch_size: int | None, seq_lens: Iterable[int]) -> None:
    check_options(
        (
            ("--steps", steps, TIMELINE_STEPS),
            ("--batch-size", batch_size, BATCH_SIZE),
            *(("--seq-lens", length, SEQ_LEN) for length in seq_lens),
        )
    )
