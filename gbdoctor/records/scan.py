"""Scan and inspect records: what ``capture/`` produces and formatters, the gate and the planner
consume. Field names are the JSON contract (see docs/json-schema.md). No torch import here.
"""

from __future__ import annotations

from gbdoctor.records.base import record
from gbdoctor.records.enums import (
    BlockerEffect,
    BlockerKind,
    CollectiveHazard,
    DedupeProof,
    DivergenceCause,
    Readiness,
)
from gbdoctor.records.price import PriceReport

SCHEMA_VERSION = 9
"""Version of the scan and inspect JSON documents. 9: blocks carry ``stage`` (the pipeline stage
that holds them; null without pipeline parallelism) and the setup ``pp_degree``,
``pp_schedule``, ``pp_stages`` and ``pp_microbatches``. 8: scan reports carry ``divergence``
(where ranks compile a block differently: ``RankDivergence``). 7: ``price.clock`` (prices in wall or CPU
time). 6: a break carries ``via`` (the library
frame its line called into), paths inside messages are portable too, and blocks carry
``dedupe`` (how a layer that shares a capture was proven identical). 5: scan reports carry
``price`` (``gbdoctor price``: what each distinct break costs a step; null otherwise). 4: the
setup records how the ranks were started: ``launcher`` (``self``, ``torchrun``, ``deepspeed``,
``slurm``, ``env``), ``nodes`` and ``ranks_per_node`` (documents before 4 read as ``self`` on
one node, ``ranks_per_node`` 0: not recorded). 3: the setup carries ``dp_replicate`` (the
resolved degrees), ``probed_recompiles`` and (DeepSpeed) ``framework``/``zero_stage``/``steps``;
blocks carry ``recompiles`` (the scan's recompile probe; DeepSpeed scans: the recompiles of their
capture steps, with ``Recompile.limit_hit``), and scan/inspect reports carry ``notes`` (how the
spec was read, simulated or not). 2: blocks carry ``cudagraphs`` (CUDA-graph readiness) and the
setup its ``tp_degree``. Readers accept 1 to 9 (the new fields take their defaults: no
recompiles recorded, no price, no via, no dedupe proof, prices in wall time, no divergence
recorded, no stage)."""
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9)


@record
class BlockKind:
    """A block's structural kind; its string form (``moe+sac#2``) is what the JSON carries.

    ``base`` is ``dense`` or ``moe``; ``wrap`` is the activation-checkpoint wrapping (``ac``,
    ``sac``) or ``""``; ``variant`` numbers distinct structures that share a label within one
    scan (1 for the first, printed only from 2 on).
    """

    base: str
    wrap: str = ""
    variant: int = 1

    @property
    def label(self) -> str:
        """The setup's label, without the variant: the key plans and strategies use."""
        return self.base + (f"+{self.wrap}" if self.wrap else "")

    @property
    def ac_wrapped(self) -> bool:
        return bool(self.wrap)

    def __str__(self) -> str:
        return self.label + (f"#{self.variant}" if self.variant > 1 else "")

    @classmethod
    def parse(cls, text: str) -> BlockKind:
        """The inverse of ``str``: read a kind label back from stored JSON."""
        label, _, variant = text.partition("#")
        base, _, wrap = label.partition("+")
        return cls(base=base, wrap=wrap, variant=int(variant) if variant.isdigit() else 1)


@record
class Location:
    """Innermost user frame of a break: where a human would look."""

    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@record
class Break:
    """One graph break, keyed for baselines by (block kind, cause, gb_type, location, hop)."""

    cause: str
    """Cause id of the taxonomy (``causes.Taxonomy``; kebab-case, part of the JSON contract)."""
    gb_type: str
    """First line of Dynamo's message: the registry's ``Gb_type``."""
    gb_id: str | None
    """Registry id (``GB0059``) from the installed torch's graph_break_registry.json."""
    location: Location | None
    module: str
    """FQN (relative to the model) of the module whose code broke, e.g. ``layers.1.moe.experts``."""
    in_checkpoint: bool
    """The break sits inside an activation-checkpoint higher-order op."""
    component: str = "model"
    """Who installed the code that broke: model, fsdp, ep, load-balancing, user-hook, torch."""
    region: str = ""
    """FQN of the compiled region in which Dynamo hit the break."""
    explanation: str = ""
    hints: tuple[str, ...] = ()
    context: str = ""
    """Dynamo's "Developer debug context" line (op names, skipped function, ...)."""
    count: int = 1
    """How many times Dynamo logged this break during the capture."""
    via: Location | None = None
    """The library frame ``location``'s line called into, where Dynamo raised the break
    (``copy.py:153`` under ``copy.deepcopy(...)``); None when the break is in the line itself."""


@record
class Event:
    """Something worse than a single break."""

    kind: str
    """``region_eager`` (an AC/SAC region fell back to eager), ``frame_skipped`` (a whole frame
    ran eager), ``recompile_limit`` (Dynamo hit ``recompile_limit`` on some code, which runs
    eagerly from then on) or ``rank_divergence`` (ranks captured different graphs/breaks)."""
    module: str
    detail: str = ""
    gb_type: str = ""
    location: Location | None = None


@record
class CudaGraphFinding:
    """One thing in a compiled graph that decides whether it can be a CUDA graph."""

    kind: BlockerKind
    effect: BlockerEffect
    region: str
    """Compiled region FQN."""
    graph: str
    """``dynamo 0`` (Torch-level), ``forward 0`` or ``backward 0`` (ATen-level) of that region."""
    node: str
    """FX node name in that graph."""
    target: str = ""
    """The node's operator (``aten._local_scalar_dense.default``) or method (``to``)."""
    location: Location | None = None
    detail: str = ""


@record
class CudaGraphReadiness:
    """CUDA-graph readiness of one block kind's compiled regions."""

    status: Readiness
    summary: str
    """``ready``, ``ready with 3 static copies`` or ``blocked by host-sync (2), ...``."""
    static_copies: int = 0
    graphs: int = 0
    """ATen graphs (forward + backward) analysed."""
    findings: tuple[CudaGraphFinding, ...] = ()


@record
class Recompile:
    """One recompile of compiled code, from Dynamo's ``recompiles`` log stream, or a
    ``recompile_limit`` hit from the ``torch._dynamo.convert_frame`` warning."""

    step: int
    """Step (0-based) during which it happened: a training step for ``run`` (warm-up steps
    included) and DeepSpeed scans, a probe step for ``scan`` (0 is the capture, 1 and 2 the
    changed inputs); for a PP scan's pipeline schedule (``scan.pipeline_schedule``), its
    training step (0 and 1 at the microbatch shape, 2 at a second one, 3 the first again)."""
    measured: bool
    """It happened in steady state: a measured step (``run``) or the last probe step (``scan``),
    after any one-time recompile for a new shape was done. A finding."""
    function: str
    """The recompiled code: ``forward at path/model.py:86``."""
    reason: str
    """The guard that failed for the most recent cache entry, e.g. ``self.owner_tag == 'step-3'``."""
    location: str | None = None
    """file:line of the user code the guard came from, when Dynamo gave a user stack."""
    hint: str = ""
    """Dynamo's HINT for this guard, if any."""
    failed_entries: int = 1
    """How many cache entries' guards failed (the cache size at that moment)."""
    limit_hit: bool = False
    """Dynamo hit ``recompile_limit`` here: from now on this code runs eagerly."""


@record
class BlockReport:
    fqn: str
    """``layers.3``."""
    kind: str
    """Structural kind label: ``dense``, ``moe``, with ``+ac``/``+sac`` etc. for wrapping."""
    same_as: str | None = None
    """FQN of the block whose capture this one shares (None for the captured representative)."""
    dedupe: DedupeProof | None = None
    """How this layer came to share ``same_as``'s capture (``guards-pass``), or why a layer of
    the same structure was captured on its own (``guards-fail``, ``unprovable``); None for the
    first layer of a structure and scans without dedupe."""
    dedupe_detail: str = ""
    """The proof in words: the guard that failed, or what made it unprovable."""
    graph_count: int = 0
    op_count: int = 0
    breaks: tuple[Break, ...] = ()
    events: tuple[Event, ...] = ()
    error: str | None = None
    """Set when the block could not be traced at all (cause ``error``)."""
    regions: tuple[str, ...] = ()
    """Compiled regions of this block (``layers.3`` or its children), as the setup placed them."""
    fullgraph_regions: tuple[str, ...] = ()
    """The subset of ``regions`` compiled with fullgraph=True."""
    region_ops: tuple[tuple[str, int], ...] = ()
    """Ops Dynamo captured per compiled region (all graphs), for coverage shares."""
    cudagraphs: CudaGraphReadiness | None = None
    """CUDA-graph readiness of the block's compiled graphs (None: nothing was compiled)."""
    recompiles: tuple[Recompile, ...] = ()
    """Recompiles when the block ran again with changed inputs (the scan's probe steps 1 and 2:
    new data, hence new routing under EP, and another sequence length where the model runs);
    DeepSpeed scans: the recompiles (and recompile-limit hits) of their capture steps."""
    stage: int | None = None
    """The pipeline stage (virtual stage index, as torchtitan numbers them) that holds this
    block; None without pipeline parallelism."""


@record
class SetupInfo:
    """How the model was set up for the capture; recorded in every report."""

    strategy: str
    device: str
    world_size: int
    ep_degree: int
    dp_shard: int
    ac_mode: str
    ac_option: str
    fsdp: bool
    tp_degree: int = 1
    dynamo_config: tuple[tuple[str, str], ...] = ()
    """The Dynamo settings of the recipe, as (name, repr(value)) pairs."""
    batch_size: int = 0
    seq_len: int = 0
    simulated: bool = False
    plan: str | None = None
    dp_replicate: int = 1
    """Resolved data-parallel replicate degree (HSDP); world = dp_replicate x dp_shard."""
    probed_recompiles: bool = False
    """The recompile probe ran (blocks' ``recompiles`` are measured); False for simulated and
    installed-torchtitan scans, scans run with ``--no-recompile-probe`` and documents older than
    schema 3, whose blocks then record no recompiles."""
    framework: str = "torchtitan"
    """``torchtitan`` or ``deepspeed`` (``frameworks.registry``)."""
    zero_stage: int | None = None
    """DeepSpeed ZeRO stage (``framework = "deepspeed"`` only)."""
    steps: int = 1
    """Training steps captured (DeepSpeed scans capture several, to see recompiles)."""
    launcher: str = "self"
    """What started the ranks (``records.enums.Launcher``): gbdoctor itself or the user's
    launcher (torchrun, deepspeed, srun), whose process group the scan joined."""
    nodes: int = 1
    """Machines the ranks ran on (the launcher's node count; 1 for gbdoctor's own ranks)."""
    ranks_per_node: int = 0
    """Ranks on each node (rank 0's node under a launcher); 0: not recorded (schema < 4)."""
    pp_degree: int = 1
    """Pipeline-parallel degree (1: none)."""
    pp_schedule: str = ""
    """The pipeline schedule (``1F1B``, ``Interleaved1F1B``, ``csv``); empty without PP."""
    pp_stages: int = 0
    """Pipeline stages, virtual ones included (2 per rank for interleaved and V schedules)."""
    pp_microbatches: int = 0
    """Microbatches per step (local batch / microbatch size); blocks see the microbatch shape."""


@record
class RankDivergence:
    """One break that some ranks meet in a block and others do not (``scan.divergence``)."""

    block: str
    """FQN of the block (its first layer where every layer of a kind diverges alike)."""
    kind: str
    """The block's kind label, as in ``BlockReport.kind`` (gates key divergences by it)."""
    ranks: tuple[int, ...]
    """The ranks that meet the break."""
    without: tuple[int, ...]
    """The ranks that do not."""
    gb_type: str
    location: Location | None
    break_cause: str
    """The break's cause id (``causes.Taxonomy``), as in ``Break.cause``."""
    cause: DivergenceCause
    hazard: CollectiveHazard
    fix: str
    """What makes every rank compile the same here."""
    layers: int = 1
    """How many layers of the kind diverge the same way (the rank-0 print with the layer index
    diverges in every layer)."""


@record
class ScanReport:
    spec: str
    model: str
    torch_version: str
    setup: SetupInfo
    blocks: tuple[BlockReport, ...]
    notes: tuple[str, ...] = ()
    """What the capture could not see (simulation, stand-ins), and other caveats."""
    price: PriceReport | None = None
    """What each distinct break costs a training step (``gbdoctor price``); None for a scan."""
    divergence: tuple[RankDivergence, ...] = ()
    """Breaks some ranks meet and others do not, across all blocks (multi-rank scans)."""
    schema_version: int = SCHEMA_VERSION


@record
class RawBreak:
    """A break as captured, before classification (``capture.py`` -> ``causes.classify``)."""

    gb_type: str
    message: str
    """Dynamo's full reason text (gb_type line, Explanation, Hints, context)."""
    frames: tuple[Location, ...] = ()
    """User traceback, outermost first (may include torch frames such as module.py hooks)."""
    module: str = ""
    component: str = "model"
    """Installer of the innermost non-torch code on the stack: model, fsdp, ep,
    load-balancing, user-hook; ``torch`` when only torch internals are on the stack."""
    in_checkpoint: bool = False
    hop: str | None = None
    """Higher-order op the break sits in (``torch.utils.checkpoint.checkpoint``)."""
    explanation: str = ""
    hints: tuple[str, ...] = ()
    context: str = ""
    routing_state: bool = False
    """The break's source line keeps MoE routing statistics: inside a module recognised as an MoE
    layer, it updates one of that layer's buffers in place or counts tokens per expert
    (bincount/histc/scatter_add/index_add), whatever the code's names (``Locator.routing_state``)."""


# --------------------------------------------------------------------------- inspect


@record
class HookInfo:
    module: str
    kind: str
    """forward_pre, forward, backward, backward_pre, optimizer_pre_step."""
    installer: str
    """fsdp, ep, load-balancing, user."""
    name: str


@record
class BlockSetup:
    fqn: str
    kind: str
    moe: bool
    ac_wrapped: tuple[str, ...]
    """FQNs of the modules wrapped by activation checkpointing."""
    compiled: tuple[str, ...]
    fullgraph: tuple[str, ...]
    sharded: tuple[str, ...]
    """FQNs of FSDP2-managed modules in the block."""
    hooks: tuple[HookInfo, ...]
    params: int
    """Parameters in the block (local shard sizes on this rank)."""


@record
class SetupReport:
    spec: str
    model: str
    torch_version: str
    setup: SetupInfo
    blocks: tuple[BlockSetup, ...]
    other_sharded: tuple[str, ...]
    """FSDP2-managed modules outside the blocks (embeddings, [norm, output], root)."""
    other_hooks: tuple[HookInfo, ...]
    """Hooks outside the blocks, including the optimizer's pre-step hook."""
    notes: tuple[str, ...] = ()
    """How the spec was read and set up (simulation, resolved degrees, compile settings)."""
    schema_version: int = SCHEMA_VERSION


@record
class MemoryEstimate:
    """Bytes a real scan of a spec holds at its peak (``scan.memory_estimate.estimate_memory``)."""

    params: int
    """The whole model in its build dtype (each rank materializes it before sharding)."""
    grads: int
    """fp32 gradients of the rank's FSDP shard."""
    optimizer: int
    """AdamW's two fp32 moments of the rank's FSDP shard."""
    activations: int
    """One training step's saved activations at ``tokens`` tokens."""
    overhead: int
    """Fixed per rank process (torch, Dynamo, captures)."""
    local_ranks: int
    """Processes on this machine, each holding ``per_rank``."""
    available: int
    """Bytes available on this machine (per rank on CUDA)."""
    safe_fraction: float
    """Share of ``available`` that may be used."""
    tokens: int = 0
    """batch x seq of the step the activations are counted for."""

    @property
    def per_rank(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.overhead

    @property
    def total(self) -> int:
        return self.per_rank * self.local_ranks

    @property
    def budget(self) -> int:
        return int(self.available * self.safe_fraction)

    @property
    def fits(self) -> bool:
        return self.total <= self.budget


@record
class Decision:
    """How a command that builds a spec's model runs it (``scan.estimate.decide``)."""

    simulate: bool
    reason: str | None = None
    """Why it is simulated (``requested``, a world too large, the memory estimate)."""
    estimate: MemoryEstimate | None = None
    """The memory estimate, when one was made (not for an explicit ``--simulate``)."""
    capture_shape: tuple[int, int] | None = None
    """(batch, seq) a real CPU scan captures at instead of the training shape, when a step at
    the training shape would be too slow (``scan.cpu_capture_shape.capture_shape``); None:
    unchanged."""
    notice: str | None = None
    """The report note that says so."""
