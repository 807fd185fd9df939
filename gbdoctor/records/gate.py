"""Gate records: a baseline's contents and a gate run's findings (``gate.py`` computes them)."""

from __future__ import annotations

from gbdoctor.errors import ExitCode
from gbdoctor.records.base import record
from gbdoctor.records.enums import Severity
from gbdoctor.records.scan import Location

BASELINE_SCHEMA_VERSION = 3
"""3: each break entry carries its location, checkpoint flag and gb id (a list of objects);
2: kinds carry ``recompiles`` and ``steady_recompiles``."""
READABLE_BASELINE_VERSIONS = (1, 2, 3)
"""Baselines the gate reads (1: no recompile counts, its totals count as unknown; 1 and 2:
breaks keyed ``"<cause>|<gb_type>"`` without location, matched by cause and gb_type)."""

SEVERITIES = tuple(Severity)
"""Finding severities, most severe first (findings are sorted in this order)."""


@record
class BreakCount:
    """One break of a kind's representative block, as the baseline keeps it.

    Its identity across torch releases is (cause, location, in_checkpoint); ``gb_type`` and
    ``gb_id`` are what this torch called it (``gate/compare.py`` reports a change as a rename)."""

    cause: str
    gb_type: str
    count: int
    gb_id: str | None = None
    location: str | None = None
    """``file:line`` of the innermost user frame; None in a schema-1/2 baseline (unknown)."""
    in_checkpoint: bool | None = None
    """Inside an activation-checkpoint HOP; None in a schema-1/2 baseline (unknown)."""

    @property
    def key(self) -> str:
        """``"<cause>|<gb_type>"``: what counts are reported by."""
        return f"{self.cause}|{self.gb_type}"

    @property
    def order(self) -> tuple[str, str, str, bool]:
        """Sort order of entries (byte-stable files)."""
        return (self.cause, self.gb_type, self.location or "", bool(self.in_checkpoint))


@record
class KindCounts:
    """What the baseline keeps for one block kind of one spec."""

    layers: int
    """Number of blocks of this kind (informational: more layers never fail the gate)."""
    graph_count: int
    """Graphs of the representative block."""
    breaks: tuple[BreakCount, ...] = ()
    """The representative block's breaks, sorted by :attr:`BreakCount.order`."""
    events: tuple[tuple[str, int], ...] = ()
    """(event kind, count) for the representative block, sorted by kind."""
    error: bool = False
    """A block of this kind could not be traced."""
    recompiles: int | None = None
    """Recompiles of the representative block over the scan's probe steps (None: not recorded,
    a schema-1 baseline)."""
    steady_recompiles: int | None = None
    """Those in the last probe step: the block recompiles on every step."""

    @property
    def break_count(self) -> int:
        """Breaks of the representative block."""
        return sum(b.count for b in self.breaks)

    @property
    def causes(self) -> frozenset[str]:
        """Cause ids present among the breaks."""
        return frozenset(b.cause for b in self.breaks)


@record
class Baseline:
    """Accepted per-kind counts of every spec: the contents of a baseline file."""

    torch_version: str
    specs: tuple[tuple[str, tuple[tuple[str, KindCounts], ...]], ...] = ()
    """(spec key, ((kind, counts), ...)), both levels sorted by key."""
    dynamo_config: tuple[tuple[str, bool | int | float | str | None], ...] = ()
    """Dynamo settings pinned for every gate scan against this baseline (name, value), sorted:
    those whose defaults differ across torch versions and change break counts."""
    simulated: tuple[str, ...] | None = None
    """Spec keys recorded from simulated scans (sorted); None in a baseline written before
    gbdoctor recorded it (real and simulated scans are then not told apart)."""
    schema_version: int = BASELINE_SCHEMA_VERSION

    def kinds(self, spec: str) -> dict[str, KindCounts] | None:
        """Kind -> counts of ``spec`` (a spec key); None when the baseline lacks the spec."""
        for key, kinds in self.specs:
            if key == spec:
                return dict(kinds)
        return None


@record
class Finding:
    """One difference between a scan and its baseline."""

    severity: str
    """``regression``, ``improvement``, ``warning`` or ``info`` (see :data:`SEVERITIES`)."""
    spec: str
    """Spec key (POSIX relative path of the spec)."""
    kind: str
    """Block kind; ``""`` for spec-level findings (torch version, spec missing)."""
    what: str
    """``break count 0 -> 1``, ``new cause fsdp-hook``, ``new event region_eager``, ..."""
    cause: str = ""
    gb_type: str = ""
    locations: tuple[Location, ...] = ()
    """file:line of each break/event behind the finding, from the new scan (for annotations)."""
    hint: str = ""
    """First fix of the cause, or what to do next."""

    @property
    def location(self) -> Location | None:
        """The first of :attr:`locations`, if any."""
        return self.locations[0] if self.locations else None


@record
class GateResult:
    """The findings of one gate run; ``passed``/``exit_code`` follow the failing rules."""

    findings: tuple[Finding, ...]
    strict_improvements: bool = False
    """Improvements fail too (the baseline must be updated to lock them in)."""
    specs: tuple[str, ...] = ()
    """Spec keys that were checked."""
    kinds: tuple[tuple[str, str], ...] = ()
    """(spec key, kind) of every block kind that was checked, sorted."""

    def fails(self, finding: Finding) -> bool:
        """Whether this finding fails the gate."""
        return finding.severity == Severity.REGRESSION or (
            self.strict_improvements and finding.severity == Severity.IMPROVEMENT
        )

    @property
    def failures(self) -> tuple[Finding, ...]:
        """The findings that fail the gate."""
        return tuple(f for f in self.findings if self.fails(f))

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        """0 when passed, 1 when any finding fails."""
        return int(ExitCode.OK if self.passed else ExitCode.FINDINGS)

    def count(self, severity: str) -> int:
        """Number of findings of one severity."""
        return sum(1 for f in self.findings if f.severity == severity)

    @property
    def headline(self) -> str:
        """``FAILED: 1 regression, 0 improvements, 1 warning over 1 spec(s)``."""
        verdict = "PASSED" if self.passed else "FAILED"
        parts = ", ".join(f"{self.count(s)} {s}(s)" for s in SEVERITIES[:3])
        strict = " (strict improvements)" if self.strict_improvements else ""
        return f"{verdict}: {parts} over {len(self.specs)} spec(s){strict}"
