"""What the gate compares: a spec's key, a break's key and each block kind's counts."""

from __future__ import annotations

import posixpath
from collections import Counter
from pathlib import Path, PurePosixPath

from gbdoctor.records import BlockReport, Break, BreakCount, EventKind, KindCounts, ScanReport


def spec_key(path: str, *, root: str | Path | None = None) -> str:
    """The spec path as recorded (scans record it relative to the spec's repository,
    ``Spec.key``), in POSIX form; an absolute path is made relative to ``root`` when given and
    under it. Never relative to the working directory."""
    text = posixpath.normpath(str(path).replace("\\", "/"))
    posix = PurePosixPath(text)
    if posix.is_absolute() and root is not None:
        base = PurePosixPath(Path(root).resolve().as_posix())
        try:
            return str(posix.relative_to(base))
        except ValueError:
            return text
    return text


def break_key(brk: Break) -> str:
    """``"<cause>|<gb_type>"``: how findings count breaks (and schema-1/2 baselines keyed them)."""
    return f"{brk.cause}|{brk.gb_type}"


_Identity = tuple[str, str, str | None, str | None, bool]


def break_identity(brk: Break) -> _Identity:
    """(cause, gb_type, gb_id, location, in_checkpoint): one baseline entry. The same break
    across torch releases is the same (cause, location, in_checkpoint) whatever its gb_type."""
    location = str(brk.location) if brk.location else None
    return (brk.cause, brk.gb_type, brk.gb_id, location, brk.in_checkpoint)


def block_key(block: BlockReport) -> str:
    """What the baseline files a block's counts under: its kind, and under pipeline parallelism
    its stage too (``stage 2/moe+ac``), so that a break that appears in one stage's blocks is a
    regression of that stage."""
    return block.kind if block.stage is None else f"stage {block.stage}/{block.kind}"


def group_by_key(report: ScanReport) -> dict[str, list[BlockReport]]:
    """Blocks grouped by :func:`block_key`, keys in order of first appearance."""
    groups: dict[str, list[BlockReport]] = {}
    for block in report.blocks:
        groups.setdefault(block_key(block), []).append(block)
    return groups


def kind_counts(report: ScanReport) -> dict[str, KindCounts]:
    """Key (kind, or stage/kind) -> counts of its representative block (for every break key,
    the worst block of the kind)."""
    out = {}
    probed = report.setup.probed_recompiles  # else the counts are unknown, not 0
    for kind, blocks in group_by_key(report).items():
        breaks: dict[_Identity, int] = {}
        events: dict[str, int] = {}
        for block in blocks:
            per_block: Counter[_Identity] = Counter()
            for brk in block.breaks:
                per_block[break_identity(brk)] += brk.count
            for key, n in per_block.items():
                breaks[key] = max(breaks.get(key, 0), n)
            for event, n in Counter(e.kind for e in block.events).items():
                events[event] = max(events.get(event, 0), n)
        diverging = sum(d.layers for d in report.divergence if d.kind == kind)
        if diverging:
            # Layers x differing breaks: a print that now diverges in one more layer counts.
            events[EventKind.DIVERGENCE] = diverging
        out[kind] = KindCounts(
            layers=len(blocks),
            graph_count=max(block.graph_count for block in blocks),
            breaks=tuple(
                sorted(
                    (
                        BreakCount(
                            cause=cause,
                            gb_type=gb_type,
                            count=n,
                            gb_id=gb_id,
                            location=location,
                            in_checkpoint=hop,
                        )
                        for (cause, gb_type, gb_id, location, hop), n in breaks.items()
                    ),
                    key=lambda b: b.order,
                )
            ),
            events=tuple(sorted(events.items())),
            error=any(block.error is not None for block in blocks),
            recompiles=max(len(block.recompiles) for block in blocks) if probed else None,
            steady_recompiles=(
                max(sum(r.measured for r in block.recompiles) for block in blocks)
                if probed
                else None
            ),
        )
    return out


def sorted_kinds(kinds: dict[str, KindCounts]) -> tuple[tuple[str, KindCounts], ...]:
    return tuple(sorted(kinds.items()))
