"""The sections every spec is written in: torchtitan v0.2.2's ``JobConfig`` (``[model]``,
``[training]``, ``[parallelism]``, ``[activation_checkpoint]``, ``[compile]``; the accepted keys are
its fields, ``torchtitan/config/job_config.py`` at tag v0.2.2, commit 73a0e697, so any real v0.2.2
config loads) plus ``[gbdoctor]``. Every framework's specs share them; a framework's own sections
(``Framework.spec_sections``) come on top. Only the keys that can change graph breaks are typed
into the records; the rest are accepted and dropped."""

from __future__ import annotations

import dataclasses

from gbdoctor.records import (
    ACSpec,
    CompileSpec,
    ModelSpec,
    ParallelSpec,
    ToolSpec,
    TrainingSpec,
)

DEVICES = ("auto", "cpu", "cuda")
AC_MODES = ("none", "full", "selective", "memory_budget")
COMPILE_COMPONENTS = ("model", "loss")
MIXED_PRECISION_DTYPES = ("bfloat16", "float32")
RESHARD_POLICIES = ("default", "always", "never")
CUSTOM_FAMILY = "custom"
DEFAULT_FLAVOR = "debugmodel"  # torchtitan's JobConfig.model.flavor default

# Field lists of torchtitan v0.2.2 JobConfig sections (job_config.py @ v0.2.2).
_TITAN_MODEL = (
    "name",
    "flavor",
    "hf_assets_path",
    "tokenizer_path",
    "converters",
    "print_after_conversion",
)
_TITAN_TRAINING = (
    "dataset",
    "dataset_path",
    "local_batch_size",
    "global_batch_size",
    "seq_len",
    "max_norm",
    "steps",
    "enable_cpu_offload",
    "dtype",
    "mixed_precision_param",
    "mixed_precision_reduce",
    "gc_freq",
    "gc_debug",
    "dataloader",
)
_TITAN_PARALLELISM = (
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
    "fsdp_reshard_after_forward",
    "tensor_parallel_degree",
    "disable_loss_parallel",
    "enable_async_tensor_parallel",
    "pipeline_parallel_degree",
    "module_fqns_per_model_part",
    "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers",
    "pipeline_parallel_layers_per_stage",
    "pipeline_parallel_schedule",
    "pipeline_parallel_schedule_csv",
    "pipeline_parallel_microbatch_size",
    "pipeline_parallel_expert_parallel_overlap",
    "context_parallel_degree",
    "context_parallel_load_balancer",
    "context_parallel_rotate_method",
    "expert_parallel_degree",
    "expert_tensor_parallel_degree",
    "expert_parallel_comm_backend",
)
_TITAN_AC = (
    "mode",
    "selective_ac_option",
    "per_op_sac_force_recompute_mm_shapes_by_fqns",
    "early_stop",
    "memory_budget",
    "visualize_memory_budget_pareto",
    "preserve_rng_state",
    "determinism_check",
    "debug",
)
_TITAN_COMPILE = ("enable", "components", "backend")

VALID_KEYS: dict[str, frozenset[str]] = {
    "model": frozenset(_TITAN_MODEL + ("factory",)),  # factory: gbdoctor's custom-model hook
    "training": frozenset(_TITAN_TRAINING),
    "parallelism": frozenset(_TITAN_PARALLELISM),
    "activation_checkpoint": frozenset(_TITAN_AC),
    "compile": frozenset(_TITAN_COMPILE),
    "gbdoctor": frozenset(f.name for f in dataclasses.fields(ToolSpec)),
}
"""Valid keys of every section gbdoctor reads."""

IGNORED_SECTIONS: frozenset[str] = frozenset(
    {
        # torchtitan v0.2.2 JobConfig sections that cannot change graph breaks ...
        "job",
        "profiling",
        "metrics",
        "optimizer",
        "lr_scheduler",
        "checkpoint",
        "quantize",
        "comm",
        "memory_estimation",
        "fault_tolerance",
        "experimental",
        "validation",
        "debug",
        # ... and top-level sections of earlier TOML-era releases.
        "float8",
        "mx",
    }
)
"""Sections accepted and ignored as a whole (``debug.seed`` alone is read, as the capture seed)."""

RECORDS: dict[str, type] = {
    "model": ModelSpec,
    "training": TrainingSpec,
    "parallelism": ParallelSpec,
    "activation_checkpoint": ACSpec,
    "compile": CompileSpec,
    "gbdoctor": ToolSpec,
}

_DEGREES = (
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
    "expert_parallel_degree",
    "expert_tensor_parallel_degree",
    "tensor_parallel_degree",
    "context_parallel_degree",
    "pipeline_parallel_degree",
)
CP_ROTATE_METHODS = ("allgather", "alltoall")
"""torch's ``set_rotate_method`` values (``parallelism.context_parallel_rotate_method``)."""

MAX_WORLD_SIZE = 16384
"""Largest world size a spec may ask for (real local ranks or simulated). Llama 3 405B trained
on 16K GPUs; a bigger world is a typo (``data_parallel_shard_degree = 1e9`` grew the simulated
process group to 24 GB before the kernel killed it, issue #18).
TODO(issue 13): replace with the memory estimate of the simulated setup once it lands."""

MAX_CAPTURE_TOKENS = 1 << 20
"""Largest capture batch (batch_size x seq_len tokens per rank): 16 x 65536. The capture's
activations grow with it; breaks do not depend on size.
TODO(issue 13): replace with the memory estimate of the real setup once it lands."""

MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""Largest ``[gbdoctor] timeout_s`` (a week); larger values overflow the process-group timeout."""
