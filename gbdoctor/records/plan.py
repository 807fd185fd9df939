"""Plan records: a per-block-kind compile and wrapping plan (``plan/`` proposes and verifies it)."""

from __future__ import annotations

from gbdoctor.records.base import record

PLAN_SCHEMA_VERSION = 4
"""2: kinds carry their CUDA-graph readiness (``cudagraphs``, ``cudagraph_ready``); 3: the plan's
``framework`` and, for DeepSpeed plans, ``deepspeed`` (the compile call and ZeRO-3 leaf modules);
4: kinds carry ``compiled_forward``. 1 to 3 are read too (new fields take their defaults)."""
READABLE_PLAN_SCHEMA_VERSIONS = (1, 2, 3, 4)


@record
class KindPlan:
    kind: str
    layers: tuple[str, ...]
    mode: str
    """``block`` (whole block) or ``children`` (children compiled, ``eager`` left eager)."""
    fullgraph: bool
    eager: tuple[str, ...] = ()
    compiled_forward: tuple[str, ...] = ()
    """Eager modules whose own ``forward`` is compiled (fullgraph) while their hooks run eagerly."""
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

    def eager_summary(self) -> str:
        """``moe.experts (hooks only; forward compiled)``: what stays eager, for reports."""
        return ", ".join(
            f"{sub} (hooks only; forward compiled)" if sub in self.compiled_forward else sub
            for sub in self.eager
        )


@record
class PlanSection:
    """A framework's own part of a plan, as reports show it (:meth:`Plan.framework_section`):
    described here, where the plan's field is, so that a report lays it out without knowing the
    framework. Not written to JSON (the plan's own field is)."""

    key: str
    """The ``Plan`` field it describes (``deepspeed``): the HTML section's id."""
    title: str
    headline: str
    """One line for the plan's table."""
    fields: tuple[tuple[str, str], ...]
    """(label, value) pairs for the HTML page."""
    remaining: tuple[str, ...] = ()
    """Breaks the plan does not remove, each with why."""


@record
class DeepSpeedPlan:
    """How a DeepSpeed training script applies the plan (``plan.deepspeed``)."""

    mode: str
    """``engine`` (``engine.compile()``) or ``forward`` (each block's forward compiled)."""
    fullgraph: bool
    zero_stage: int
    leaf_modules: tuple[str, ...] = ()
    """Class names for ``zero_optimization.leaf_module.classes`` (ZeRO-3)."""
    remaining: tuple[str, ...] = ()
    """Breaks the plan does not remove, each with why."""

    def section(self) -> PlanSection:
        """The compile call, the ZeRO stage and the leaf modules, for reports."""
        modules = ", ".join(self.leaf_modules)
        leaf = f"; ZeRO-3 leaf modules: {modules}" if self.leaf_modules else ""
        return PlanSection(
            key="deepspeed",
            title="DeepSpeed",
            headline=(
                f"DeepSpeed (ZeRO-{self.zero_stage}): compile {self.mode}, "
                f"fullgraph={self.fullgraph}{leaf}"
            ),
            fields=(
                ("compile", f"{self.mode}{' fullgraph' if self.fullgraph else ''}"),
                ("ZeRO stage", str(self.zero_stage)),
                ("leaf modules", modules or "-"),
            ),
            remaining=self.remaining,
        )


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
    framework: str = "torchtitan"
    deepspeed: DeepSpeedPlan | None = None
    """The DeepSpeed compile call and config changes (``framework = "deepspeed"`` plans)."""

    def framework_section(self) -> PlanSection | None:
        """The part of the plan only its framework has, described for reports (None: none)."""
        return self.deepspeed.section() if self.deepspeed is not None else None
