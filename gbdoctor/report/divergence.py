"""The divergence section of a scan report: which rank differs, in which block, with which
break, why, whether it can hang training, and the fix (``records.RankDivergence``). One line
per divergence, shared by the table and the markdown formats; computes nothing."""

from __future__ import annotations

from gbdoctor.records import CollectiveHazard, RankDivergence, ScanReport

DIVERGENCE_TITLE = "Rank divergence (ranks that compile a block differently)"


def _ranks(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def divergence_line(d: RankDivergence) -> str:
    where = f"{d.block}" + (
        f" (and {d.layers - 1} more layer(s) of {d.kind})" if d.layers > 1 else ""
    )
    location = f" at {d.location}" if d.location else ""
    hazard = (
        "can desynchronize collectives in training"
        if d.hazard == CollectiveHazard.CAN_DESYNC
        else "cannot desynchronize collectives (they run outside the compiled regions)"
    )
    return (
        f"{_ranks(d.ranks)} (not {_ranks(d.without)}) in {where}: {d.gb_type} "
        f"[{d.break_cause}]{location}; cause: {d.cause}; {hazard}; fix: {d.fix}"
    )


def divergence_lines(report: ScanReport) -> list[str]:
    """The section's lines, title first; none when every rank compiles alike."""
    if not report.divergence:
        return []
    return [DIVERGENCE_TITLE, *(f"- {divergence_line(d)}" for d in report.divergence)]
