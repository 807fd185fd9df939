"""Spec records: a torchtitan v0.2.x TOML train config, as ``spec.load_spec`` validated it.

Only the keys that can change graph breaks are typed; the rest are accepted by ``spec.py`` and
dropped.
"""

from __future__ import annotations

import os
from dataclasses import field

from gbdoctor.records.base import record


@record
class ModelSpec:
    name: str
    """Model family: ``llama3``, ``llama4``, ``deepseek_v3`` or ``custom``."""
    flavor: str
    """Flavor within the family (``debugmodel``, ``8B``, ``17bx16e``, ...), passed to a custom factory."""
    factory: str | None = None
    """For ``custom``: ``path/to/file.py:build`` or ``package.module:build``."""


@record
class ModelFacts:
    """What a model's flavor says about its structure before anything is built, read in one
    place from the flavor's model args (``models.model_facts``) for the stages that decide
    from it (memory estimate, simulation, FlexAttention refusal, PP layout, EP check). A custom
    factory, or a framework's own model this zoo does not have, says nothing until it is
    built: every field None."""

    n_layers: int | None = None
    n_heads: int | None = None
    """Attention heads (the scores an estimate counts)."""
    attn_type: str | None = None
    """``sdpa`` or ``flex`` (FlexAttention cannot be simulated: no CPU backward)."""
    num_experts: int | None = None
    """Routed experts per MoE layer; None for a dense flavor too."""
    top_k: int | None = None
    """Experts each token is routed to; None for a dense flavor too."""


@record
class TrainingSpec:
    local_batch_size: int = 8
    seq_len: int = 2048
    steps: int = 10
    mixed_precision_param: str = "bfloat16"
    mixed_precision_reduce: str = "float32"
    max_norm: float = 1.0
    seed: int = 0


@record
class ParallelSpec:
    data_parallel_replicate_degree: int = 1
    data_parallel_shard_degree: int = -1
    """As in torchtitan, -1 means "all remaining ranks"; ``dp_shard`` holds the resolved value."""
    expert_parallel_degree: int = 1
    expert_tensor_parallel_degree: int = 1
    tensor_parallel_degree: int = 1
    context_parallel_degree: int = 1
    context_parallel_rotate_method: str = "allgather"
    """How ring attention passes K/V between CP ranks (torch's ``set_rotate_method``)."""
    pipeline_parallel_degree: int = 1
    pipeline_parallel_schedule: str = "1F1B"
    """torch.distributed.pipelining's schedule name (torchtitan v0.2.2's default: 1F1B)."""
    pipeline_parallel_schedule_csv: str = ""
    """A schedule file (torch's ``_PipelineScheduleRuntime``); its stages are still laid out by
    ``pipeline_parallel_schedule``."""
    pipeline_parallel_microbatch_size: int = 1
    pipeline_parallel_layers_per_stage: int | None = None
    """None: one stage per rank for single-stage schedules, two for multi-stage ones."""
    pipeline_parallel_first_stage_less_layers: int = 1
    """How many layers the embeddings count for on the first stage."""
    pipeline_parallel_last_stage_less_layers: int = 1
    """How many layers ``norm`` + ``output`` count for on the last stage."""
    fsdp_reshard_after_forward: str = "default"
    disable_loss_parallel: bool = False
    """With TP, torchtitan keeps the logits vocabulary-sharded and computes the loss in parallel
    unless this is set."""
    dp_shard: int = 1
    """Resolved data-parallel shard degree."""
    world_size: int = 1
    """Resolved number of ranks: dp_replicate * dp_shard * cp * tp * pp."""

    @property
    def pp_enabled(self) -> bool:
        return self.pipeline_parallel_degree > 1


@record
class ACSpec:
    mode: str = "selective"
    """``none``, ``full`` or ``selective``."""
    selective_ac_option: str = "2"
    """An integer N (wrap every Nth block) or ``op`` (per-op SAC policy)."""
    per_op_sac_force_recompute_mm_shapes_by_fqns: tuple[str, ...] = ("moe.router.gate",)
    preserve_rng_state: bool = False


@record
class CompileSpec:
    enable: bool = False
    components: tuple[str, ...] = ("model", "loss")
    backend: str = "inductor"
    backend_set: bool = False
    """Whether the config (or --set) names ``backend``; ``run`` then compiles with it."""


@record
class ToolSpec:
    """The ``[gbdoctor]`` section: the tool's own settings."""

    strategy: str = "block"
    """Compile strategy preset (one of the spec's framework's ``strategies``)."""
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
    blocks: str = ""
    """Dotted path of the model's ModuleList/ModuleDict of blocks (``model.layers``); empty: found
    by structure (``models.structure.find_blocks``)."""
    world_size: int = 0
    """The launch size (ranks of the training job); resolves ``data_parallel_shard_degree = -1``
    as torchtitan does. 0: not stated (-1 then resolves to the smallest world that hosts EP)."""
    framework: str = "torchtitan"
    """Training framework whose setup is reproduced: ``torchtitan`` or ``deepspeed``."""
    deepspeed_config: str = ""
    """For ``framework = "deepspeed"``: path (relative to the spec file) of the user's DeepSpeed
    JSON config, instead of a ``[deepspeed]`` table."""


@record
class DeepSpeedSpec:
    """The DeepSpeed config of a ``framework = "deepspeed"`` spec, validated by DeepSpeed."""

    config_json: str
    """The config as DeepSpeed will receive it (canonical JSON, sorted keys), with gbdoctor's
    fill-ins (micro-batch size, a torch AdamW optimizer) where the user's config has none."""
    source: str
    """``[deepspeed]`` or the JSON file's path."""
    zero_stage: int = 0
    filled: tuple[str, ...] = ()
    """Keys gbdoctor filled in because the user's config left them out."""


@record
class RegistryRun:
    """A run named by a framework's Python config registry instead of a spec file (torchtitan
    >= 0.3: ``--torchtitan MODULE:CONFIG`` plus its own overrides)."""

    module: str
    """The registry's module (``deepseek_v3``, or a dotted module holding a ``config_registry``)."""
    config: str
    """A config function of that registry (``deepseek_v3_debugmodel``)."""
    args: tuple[str, ...] = ()
    """The framework's own ``--section.key VALUE`` overrides, verbatim and in order."""

    @property
    def label(self) -> str:
        """How reports and baselines name the run (``Spec.path``): name plus overrides."""
        return f"{self.module}:{self.config}" + "".join(f" {a}" for a in self.args)


@record
class Spec:
    path: str
    """The spec file as given (reports print it; it is not opened again)."""
    model: ModelSpec
    training: TrainingSpec = field(default_factory=TrainingSpec)
    parallelism: ParallelSpec = field(default_factory=ParallelSpec)
    activation_checkpoint: ACSpec = field(default_factory=ACSpec)
    compile: CompileSpec = field(default_factory=CompileSpec)
    gbdoctor: ToolSpec = field(default_factory=ToolSpec)
    deepspeed: DeepSpeedSpec | None = None
    """Set for ``framework = "deepspeed"`` specs."""
    registry_run: RegistryRun | None = None
    """Set for a run named by a config registry (``path`` is then its label)."""
    root: str = ""
    """Absolute directory that report paths are relative to: the repository holding the spec
    file (its nearest ancestor with ``.git``), else the spec file's directory. Never the working
    directory, so the same scan run from anywhere gives the same JSON and baseline keys.
    Empty: paths as given (specs built in code)."""

    @property
    def key(self) -> str:
        """The spec file relative to :attr:`root`, POSIX form: how reports and baselines name it."""
        if not self.root:
            return self.path.replace("\\", "/")
        return os.path.relpath(os.path.abspath(self.path), self.root).replace(os.sep, "/")

    @property
    def capture_batch_size(self) -> int:
        """Under pipeline parallelism the blocks see microbatches, never the local batch."""
        if self.gbdoctor.batch_size:
            return self.gbdoctor.batch_size
        if self.parallelism.pp_enabled:
            return self.parallelism.pipeline_parallel_microbatch_size
        return self.training.local_batch_size

    @property
    def capture_seq_len(self) -> int:
        return self.gbdoctor.seq_len or self.training.seq_len
