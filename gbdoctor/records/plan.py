"""Plan records: a per-block-kind compile and wrapping plan (``plan/`` proposes and verifies it)."""

from __future__ import annotations

from gbdoctor.records.base import record

PLAN_SCHEMA_VERSION = 2
"""2: kinds carry their CUDA-graph readiness (``cudagraphs``, ``cudagraph_ready``); 1 is read too."""
READABLE_PLAN_SCHEMA_VERSIONS = (1, 2)


@record
class KindPlan:
    kind: str
    layers: tuple[str, ...]
    mode: str
    """``block`` (whole block) or ``children`` (children compiled, ``eager`` left eager)."""
    fullgraph: bool
    eager: tuple[str, ...] = ()
    split_ac: bool = False
    actions: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    """Why, tied to cause ids (``cause-id: what was done``)."""
    breaks_before: int = 0
    breaks_after: int = 0
    events_before: int = 0
    events_after: int = 0
    fullgraph_share_before: float = 0.0
    """Share of the block's ops inside clean fullgraph regions under the baseline compile."""
    fullgraph_share_after: float = 0.0
    verified: bool = False
    detail: str = ""
    """Why verification failed, when it did."""
    cudagraphs: str = ""
    """CUDA-graph readiness of the kind under the plan (the verification scan's summary:
    ``ready``, ``ready with N static copies`` or ``blocked by ...``)."""
    cudagraph_ready: bool = False
    """The kind's compiled regions can be CUDA graphs: emitters offer ``mode="reduce-overhead"``."""


@record
class Plan:
    spec: str
    model: str
    torch_version: str
    baseline_strategy: str
    flags: tuple[tuple[str, bool], ...]
    flag_costs: tuple[str, ...]
    kinds: tuple[KindPlan, ...]
    verified: bool
    rounds: int
    suggestions: tuple[str, ...] = ()
    simulated: bool = False
    """Proposed and verified by simulated scans (meta tensors, fake process group)."""
    notes: tuple[str, ...] = ()
    """The baseline scan's notes about the whole plan (simulation notice, resolved degrees,
    compile settings)."""
    schema_version: int = PLAN_SCHEMA_VERSION
