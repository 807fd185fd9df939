"""Summary records: every count derived from a scan report (``summary.summarize`` computes them once)."""

from __future__ import annotations

from gbdoctor.records.base import record
from gbdoctor.records.scan import Break, CudaGraphFinding, CudaGraphReadiness, Event


@record
class KindSummary:
    """One row per block kind (``dense``, ``moe+sac``, ...), in layer order of first appearance."""

    kind: str
    layers: tuple[str, ...]
    """FQNs of the blocks of this kind, in report order."""
    layers_label: str
    """``layers.1, 3, 5``: the FQNs with the shared prefix written once."""
    graphs: int
    """Graphs per block (the largest among the kind's blocks)."""
    breaks: int
    """Breaks per block (the largest among the kind's blocks)."""
    events: int
    """Events per block (the largest among the kind's blocks)."""
    errors: int
    """How many blocks of this kind could not be traced."""
    causes: tuple[str, ...]
    """Sorted cause ids of the kind's breaks, plus ``error`` when a block errored."""
    break_records: tuple[Break, ...]
    """The kind's distinct breaks (a shared capture's breaks appear once)."""
    event_records: tuple[Event, ...]
    """The kind's distinct events."""
    error: str | None
    """The first error message among the kind's blocks."""
    cudagraphs: CudaGraphReadiness | None = None
    """CUDA-graph readiness of the kind (its captured representative); None when nothing compiled."""
    cudagraph_notable: tuple[CudaGraphFinding, ...] = ()
    """The readiness findings worth a row: all but the per-input copies (which are counted)."""

    @property
    def clean(self) -> bool:
        """No break, event or error in any block of this kind."""
        return not (self.breaks or self.events or self.errors)


@record
class ScanSummary:
    """Totals over all blocks (every block counts its own copy) and the per-kind rows."""

    blocks: int
    """Number of blocks (layers) in the report."""
    breaks: int
    events: int
    """Total number of events."""
    events_by_kind: tuple[tuple[str, int], ...]
    """(event kind, count), sorted by kind."""
    errors: int
    """Number of blocks that could not be traced."""
    graphs: int
    """Sum of ``graph_count`` over all blocks."""
    ops: int
    """Sum of ``op_count`` over all blocks."""
    by_cause: tuple[tuple[str, int], ...]
    """(cause id, break count), sorted by cause id."""
    kinds: tuple[KindSummary, ...]

    @property
    def clean(self) -> bool:
        """Nothing found: no break, event or error anywhere."""
        return not (self.breaks or self.events or self.errors)
