"""Plan records: a per-block-kind compile and wrapping plan (``plan/`` proposes and verifies it)."""

from __future__ import annotations

from gbdoctor.records.base import record

PLAN_SCHEMA_VERSION = 5
"""2: kinds carry their CUDA-graph readiness (``cudagraphs``, ``cudagraph_ready``); 3: the plan's
``framework`` and, for DeepSpeed plans, ``deepspeed`` (the compile call and ZeRO-3 leaf modules);
4: kinds carry ``compiled_forward``; 5: ``stages`` (pipeline-parallel specs: each stage's layers
and kinds). 1 to 4 are read too (new fields take their defaults: no stages)."""
READABLE_PLAN_SCHEMA_VERSIONS = (1, 2, 3, 4, 5)


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
class StagePlan:
    """One pipeline stage of a plan: which of the plan's kinds its layers are, so that a stage
    whose choices differ from the others' (an embedding-only first stage, a stage of MoE layers
    only, a kind's ``#2`` variant that only some stages trace) is named with its own."""

    stage: int
    """The (virtual) stage index, as torchtitan numbers them."""
    pp_rank: int
    layers: tuple[str, ...]
    kinds: tuple[str, ...]
    """The plan's kinds (``KindPlan.kind``) among the stage's layers, in layer order."""
    modules: tuple[str, ...] = ()
    """The stage's modules besides its blocks (``tok_embeddings`` first, ``norm``, ``output``
    last): compiled by the training's own code, not by the plan."""
    loss: bool = False
    """The stage computes the loss (the last one), compiled where ``compile.components`` says."""
    breaks_before: int = 0
    breaks_after: int = 0
    """Its blocks' breaks summed (each block its kind's count per block)."""
    verified: bool = False
    """Every kind among its layers is verified."""

    def choices(self) -> tuple[str, ...]:
        """What the plan decides for this stage: its kinds, in any order (what else it holds is
        the training's code, not the plan's)."""
        return tuple(sorted(self.kinds))


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
    stages: tuple[StagePlan, ...] = ()
    """Pipeline-parallel specs only: the plan per stage (empty without PP)."""

    def stages_agree(self) -> bool:
        """Every stage holds the same kinds, so one recipe per kind serves them all."""
        return len({s.choices() for s in self.stages}) <= 1

    def stage_lines(self) -> tuple[str, ...]:
        """The plan per stage, for reports and emitted code: one line when all stages agree,
        else one per stage (its layers, kinds and whether they are verified)."""
        if not self.stages:
            return ()
        extras = "; ".join(_stage_extras(s) for s in self.stages if _stage_extras(s))
        extras = f" ({extras})" if extras else ""
        if self.stages_agree():
            first = self.stages[0]
            return (
                f"all {len(self.stages)} pipeline stages agree: each holds "
                f"{', '.join(first.choices()) or 'no block'} with the same choices{extras}",
            )
        lines = [f"pipeline stages differ ({len(self.stages)} stages){extras}:"]
        for s in self.stages:
            lines.append(
                f"  stage {s.stage} (PP rank {s.pp_rank}, {span_of_layers(s.layers)}): "
                f"{', '.join(s.kinds) or 'no block'}; breaks {s.breaks_before} -> "
                f"{s.breaks_after}; {'verified' if s.verified else 'NOT verified'}"
            )
        return tuple(lines)

    def framework_section(self) -> PlanSection | None:
        """The part of the plan only its framework has, described for reports (None: none)."""
        return self.deepspeed.section() if self.deepspeed is not None else None


def span_of_layers(layers: tuple[str, ...]) -> str:
    """``layers.12-24`` for a contiguous run of layer indices, else the list."""
    if not layers:
        return "no layers"
    keys = [fqn.rsplit(".", 1)[-1] for fqn in layers]
    if all(k.isdigit() for k in keys):
        nums = [int(k) for k in keys]
        if nums == list(range(nums[0], nums[0] + len(nums))) and len(nums) > 1:
            return f"{layers[0].rsplit('.', 1)[0]}.{nums[0]}-{nums[-1]}"
    return ", ".join(layers)


def _stage_extras(stage: StagePlan) -> str:
    parts = list(stage.modules) + (["the loss"] if stage.loss else [])
    return f"stage {stage.stage} also holds {', '.join(parts)}" if parts else ""
