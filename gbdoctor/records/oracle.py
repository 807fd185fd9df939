"""Oracle check records: plain ``torch.compile`` per layer against a scan (``scan --oracle``)."""

from __future__ import annotations

from gbdoctor.records.base import record


@record
class OracleStatement:
    """One statement plain ``torch.compile(layer)`` logged a graph break at."""

    file: str
    """Portable path (``scan``'s rules), ``path/model.py``."""
    line: int
    gb_type: str


@record
class OracleDifference:
    """A statement one side has and the other does not, and whether that is expected."""

    statement: str
    """``file:line gb_type``."""
    side: str
    """``oracle`` (only plain compile logged it) or ``gbdoctor`` (only the scan reported it)."""
    expected: bool
    explanation: str


@record
class OracleBlock:
    fqn: str
    oracle: tuple[OracleStatement, ...]
    gbdoctor_breaks: int
    """Breaks the scan reports for this layer (``Break.count`` summed)."""
    differences: tuple[OracleDifference, ...] = ()
    error: str | None = None
    """Plain compile of this layer failed (one line)."""

    @property
    def agrees(self) -> bool:
        return self.error is None and all(d.expected for d in self.differences)


@record
class OracleReport:
    blocks: tuple[OracleBlock, ...]

    @property
    def agreeing(self) -> int:
        return sum(1 for b in self.blocks if b.agrees)
