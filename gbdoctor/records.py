"""Typed, frozen records shared by every stage. No torch import here.

Spec records mirror torchtitan v0.2.x's TOML sections (only the keys that can change graph
breaks are typed; the rest are accepted by ``spec.py`` and dropped). Capture records are what
``capture.py`` produces and what formatters, the gate and the planner consume. Field names of
the capture records are the JSON contract (see README, "JSON schema").
"""
from __future__ import annotations

from dataclasses import dataclass, field

SCHEMA_VERSION = 1

_REC = dict(frozen=True, kw_only=True, slots=True)


# --------------------------------------------------------------------------- spec


@dataclass(**_REC)
class ModelSpec:
    name: str
    """Model family: ``llama3``, ``llama4``, ``deepseek_v3`` or ``custom``."""
    flavor: str
    """Flavor within the family (``debugmodel``, ``8B``, ``17bx16e``, ...), passed to a custom factory."""
    factory: str | None = None
    """For ``custom``: ``path/to/file.py:build`` or ``package.module:build``."""


@dataclass(**_REC)
class TrainingSpec:
    local_batch_size: int = 8
    seq_len: int = 2048
    steps: int = 10
    mixed_precision_param: str = "bfloat16"
    mixed_precision_reduce: str = "float32"
    max_norm: float = 1.0
    seed: int = 0


@dataclass(**_REC)
class ParallelSpec:
    data_parallel_replicate_degree: int = 1
    data_parallel_shard_degree: int = -1
    """As in torchtitan, -1 means "all remaining ranks"; ``dp_shard`` holds the resolved value."""
    expert_parallel_degree: int = 1
    expert_tensor_parallel_degree: int = 1
    tensor_parallel_degree: int = 1
    context_parallel_degree: int = 1
    pipeline_parallel_degree: int = 1
    fsdp_reshard_after_forward: str = "default"
    dp_shard: int = 1
    """Resolved data-parallel shard degree."""
    world_size: int = 1
    """Resolved number of ranks: dp_replicate * dp_shard * cp * tp * pp."""


@dataclass(**_REC)
class ACSpec:
    mode: str = "selective"
    """``none``, ``full`` or ``selective``."""
    selective_ac_option: str = "2"
    """An integer N (wrap every Nth block) or ``op`` (per-op SAC policy)."""
    per_op_sac_force_recompute_mm_shapes_by_fqns: tuple[str, ...] = ("moe.router.gate",)
    preserve_rng_state: bool = False


@dataclass(**_REC)
class CompileSpec:
    enable: bool = False
    components: tuple[str, ...] = ("model", "loss")
    backend: str = "inductor"


@dataclass(**_REC)
class ToolSpec:
    """The ``[gbdoctor]`` section: the tool's own settings."""

    strategy: str = "block"
    """Compile strategy preset (see ``setup.compile.STRATEGIES``)."""
    batch_size: int = 0
    """Batch size for scan/inspect captures; 0 means ``training.local_batch_size``."""
    seq_len: int = 0
    """Sequence length for scan/inspect captures; 0 means ``training.seq_len``."""
    device: str = "auto"
    """``auto`` (cuda when available), ``cpu`` or ``cuda``."""
    timeout_s: float = 600.0
    """Wall-clock limit for a multi-rank job; a hung rank never hangs the tool."""
    simulate: bool = False
    """Meta tensors and a fake process group instead of real ranks (production-size specs)."""


@dataclass(**_REC)
class Spec:
    path: str
    """The spec file as given (reports print it; it is not opened again)."""
    model: ModelSpec
    training: TrainingSpec = field(default_factory=TrainingSpec)
    parallelism: ParallelSpec = field(default_factory=ParallelSpec)
    activation_checkpoint: ACSpec = field(default_factory=ACSpec)
    compile: CompileSpec = field(default_factory=CompileSpec)
    gbdoctor: ToolSpec = field(default_factory=ToolSpec)

    @property
    def capture_batch_size(self) -> int:
        return self.gbdoctor.batch_size or self.training.local_batch_size

    @property
    def capture_seq_len(self) -> int:
        return self.gbdoctor.seq_len or self.training.seq_len


# --------------------------------------------------------------------------- capture


@dataclass(**_REC)
class Location:
    """Innermost user frame of a break: where a human would look."""

    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(**_REC)
class Break:
    """One graph break, keyed for baselines by (block kind, cause, gb_type, location, hop)."""

    cause: str
    """Cause id from ``causes.CAUSES`` (kebab-case, part of the JSON contract)."""
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


@dataclass(**_REC)
class Event:
    """Something worse than a single break."""

    kind: str
    """``region_eager`` (an AC/SAC region fell back to eager), ``frame_skipped`` (a whole frame
    ran eager) or ``rank_divergence`` (ranks captured different graphs/breaks)."""
    module: str
    detail: str = ""
    gb_type: str = ""
    location: Location | None = None


@dataclass(**_REC)
class BlockReport:
    fqn: str
    """``layers.3``."""
    kind: str
    """Structural kind label: ``dense``, ``moe``, with ``+ac``/``+sac`` etc. for wrapping."""
    same_as: str | None = None
    """FQN of the block whose capture this one shares (None for the captured representative)."""
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


@dataclass(**_REC)
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
    dynamo_config: tuple[tuple[str, str], ...] = ()
    """The Dynamo settings of the recipe, as (name, repr(value)) pairs."""
    batch_size: int = 0
    seq_len: int = 0
    simulated: bool = False
    plan: str | None = None


@dataclass(**_REC)
class ScanReport:
    spec: str
    model: str
    torch_version: str
    setup: SetupInfo
    blocks: tuple[BlockReport, ...]
    notes: tuple[str, ...] = ()
    """What the capture could not see (simulation, stand-ins), and other caveats."""
    schema_version: int = SCHEMA_VERSION


@dataclass(**_REC)
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


# --------------------------------------------------------------------------- inspect


@dataclass(**_REC)
class HookInfo:
    module: str
    kind: str
    """forward_pre, forward, backward, backward_pre, optimizer_pre_step."""
    installer: str
    """fsdp, ep, load-balancing, user."""
    name: str


@dataclass(**_REC)
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


@dataclass(**_REC)
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
    schema_version: int = SCHEMA_VERSION
