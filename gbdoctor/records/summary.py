"""Summary records: every count derived from a scan report (``summary.summarize`` computes them once)."""

from __future__ import annotations

from gbdoctor.records.base import record
from gbdoctor.records.scan import Break, CudaGraphFinding, CudaGraphReadiness, Event, Recompile


@record
class NotableFinding:
    """Readiness findings of one kind that differ only in the graph node (and in the input a
    detail names first, ``name: why``): one row of a report."""

    finding: CudaGraphFinding
    """The first of them (its kind, effect, region, graph, location)."""
    nodes: tuple[str, ...]
    """Every one's graph node, in order."""
    subjects: tuple[str, ...] = ()
    """The names their details start with (``name: why``), each once, in order; empty when
    the details start with none."""
    reason: str = ""
    """The detail they share (after the input's name, where there is one)."""

    @property
    def detail(self) -> str:
        """The shared detail, naming every input where they name one."""
        if not self.subjects or self.subjects == self.nodes:
            return self.reason  # the node column names them already
        return f"{_listed(self.subjects)}: {self.reason}"

    @property
    def node_label(self) -> str:
        """The nodes, the first few by name (``primals_4, primals_5, ... (9)``)."""
        return _listed(self.nodes)


_LISTED = 3
"""Names a merged row spells out before it only counts the rest."""


def _listed(names: tuple[str, ...]) -> str:
    if len(names) <= _LISTED:
        return ", ".join(names)
    return ", ".join(names[:_LISTED]) + f", ... ({len(names)})"


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
    cudagraph_notable: tuple[NotableFinding, ...] = ()
    """The readiness findings worth a row, merged where they differ only in the node: all but
    the per-input copies (which are counted)."""
    recompiles: tuple[Recompile, ...] = ()
    """The recompiles of the kind's captured blocks (probe steps, or engine steps), in order."""
    steady_recompiles: int = 0
    """How many of them happened on every step (``measured``)."""

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
