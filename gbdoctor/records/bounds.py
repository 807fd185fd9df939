"""The ranges a number may take, with its unit: one table for the command line's options and the
JSON fields that record them (issue 45: ``--rounds 99999999999999999999`` ran until killed, and
a price JSON with ``world_size`` 0 or ``share`` 1e308 was accepted).

A record field carries its range as ``Annotated[int, ROUNDS]``; :func:`records.io.check_types`
refuses a value outside it when a JSON is read, naming the field. The CLI checks its options
against the same ranges before anything heavy (``cli/bounds.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "BATCH_SIZE",
    "MAX_INT",
    "ROUNDS",
    "SEQ_LEN",
    "SHARE",
    "STEPS",
    "WARMUP",
    "WORLD_SIZE",
    "Range",
    "shown_number",
]

MAX_INT = 2**63 - 1
"""The largest integer a record holds (a count, size or line): int64, what torch and JSON
readers elsewhere hold; JSON may spell any integer."""


def shown_number(value: float) -> str:
    """``value`` for a message: a huge integer as its digit count (printing a 5000-digit integer
    is itself an error past Python's int_max_str_digits)."""
    if isinstance(value, int) and abs(value) > 10**30:
        digits = math.floor(abs(value).bit_length() * math.log10(2)) + 1
        return f"a {digits}-digit number"
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Range:
    """``low`` to ``high`` inclusive, in ``unit`` (the words after a number: ``rounds``)."""

    low: float
    high: float
    unit: str

    def problem(self, value: float) -> str | None:
        """Why ``value`` is out of range (``must be at least 1 (got 0)``), or None."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number (got {value})"
        if value < self.low:
            return f"must be at least {shown_number(self.low)} (got {shown_number(value)})"
        if value > self.high:
            limit = f"{shown_number(self.high)} {self.unit}".rstrip()
            return f"must be at most {limit} (got {shown_number(value)})"
        return None


ROUNDS = Range(1, 1_000, "rounds")
"""Repeats of every measured mode (``run``, ``price``): their spread; 1000 takes days already."""
STEPS = Range(1, 100_000, "steps")
"""Measured or recorded training steps of one mode."""
WARMUP = Range(1, 10_000, "warm-up steps")
"""Compilation happens in the warm-up: at least one."""
BATCH_SIZE = Range(1, 2**20, "sequences")
SEQ_LEN = Range(1, 2**24, "tokens")
WORLD_SIZE = Range(1, 2**20, "ranks")
SHARE = Range(-100, 100, "steps")
"""A price's share of a step (its ms over the step's): past 100 steps it measures nothing."""
