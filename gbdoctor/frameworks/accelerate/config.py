"""The two files Accelerate users have on disk, read strictly into one :class:`AccelerateSettings`:

- the YAML ``accelerate config`` writes (``distributed_type: FSDP``, ``fsdp_config``,
  ``dynamo_config``, ``mixed_precision``);
- the Trainer's ``TrainingArguments`` as JSON or YAML (``fsdp``, ``fsdp_config``,
  ``torch_compile*``, ``gradient_checkpointing*``, ``bf16``), which the Trainer turns into the
  same Accelerate plugins (``TrainingArguments._process_fsdp_args`` and the
  ``ACCELERATE_DYNAMO_*`` variables it sets).

Every key is checked: a key neither file has is refused with the nearest valid one, and what
gbdoctor cannot set up (FSDP1, DeepSpeed or Megatron through Accelerate, no FSDP at all, CPU
offload) is refused in one line naming the key and the supported alternative (exit 2). No torch
import: spec loading reads this.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from gbdoctor.errors import SpecError

ACCELERATE_CONFIG = "accelerate-config"
TRAINING_ARGUMENTS = "training-arguments"

WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
"""accelerate's ``FSDP_AUTO_WRAP_POLICY``."""


@dataclass(frozen=True)
class AccelerateSettings:
    """What of an Accelerate setup can change graph breaks, from either file."""

    source: str
    """:data:`ACCELERATE_CONFIG` or :data:`TRAINING_ARGUMENTS`."""
    mixed_precision: str = "no"
    """``no``, ``bf16`` or ``fp16`` (FSDP2's ``MixedPrecisionPolicy``)."""
    auto_wrap_policy: str = "TRANSFORMER_BASED_WRAP"
    transformer_layer_cls_to_wrap: tuple[str, ...] = ()
    """Empty: the model's ``_no_split_modules`` (accelerate's default)."""
    min_num_params: int = 0
    activation_checkpointing: bool = False
    """``fsdp_activation_checkpointing``: accelerate's ``fsdp2_apply_ac`` wraps each layer."""
    reshard_after_forward: bool = True
    dynamo_backend: str = "no"
    """Lower case, as accelerate's ``TorchDynamoPlugin.to_dict`` writes it; ``no``: no compile."""
    dynamo_mode: str = "default"
    fullgraph: bool = False
    dynamic: bool | None = None
    regional: bool = False
    """``dynamo_use_regional_compilation``: each repeated block compiled in place
    (``compile_regions_fsdp2``); else the whole model with ``torch.compile``."""
    gradient_checkpointing: bool = False
    """The model's own checkpointing (the Trainer's ``gradient_checkpointing``)."""
    use_reentrant: bool | None = None
    """``gradient_checkpointing_kwargs.use_reentrant``; None: transformers' default (False)."""

    @property
    def compiles(self) -> bool:
        return self.dynamo_backend != "no"

    def as_args(self) -> tuple[str, ...]:
        """``key=value`` strings (JSON values), sorted: how a spec carries the settings to ranks."""
        return tuple(f"{k}={json.dumps(v)}" for k, v in sorted(asdict(self).items()))

    @classmethod
    def from_args(cls, args: tuple[str, ...]) -> AccelerateSettings:
        values: dict[str, Any] = {}
        for item in args:
            key, _, raw = item.partition("=")
            values[key] = json.loads(raw)
        values["transformer_layer_cls_to_wrap"] = tuple(
            values.get("transformer_layer_cls_to_wrap", ())
        )
        return cls(**values)


def _fail(path: str, message: str, hint: str) -> SpecError:
    return SpecError(f"{path}: {message}", hint=hint)


def _unknown(path: str, where: str, key: str, known: list[str]) -> SpecError:
    near = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(sorted(known))}"
    return _fail(path, f"{where}{key!r} is not a key of this file", hint)


def _bool(path: str, where: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _fail(path, f"{where} = {value!r} is not true or false", f"set {where} to true or false")


def read_file(path: str) -> Mapping[str, Any]:
    """The YAML or JSON mapping at ``path``; SpecError (exit 2) when it is none."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except OSError as exc:
        raise _fail(
            path, f"cannot read it ({exc.strerror})", "give the path of an existing file"
        ) from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _fail(
            path,
            f"not valid {'JSON' if path.endswith('.json') else 'YAML'}: {first}",
            "fix the syntax",
        ) from None
    if not isinstance(data, dict):
        raise _fail(
            path,
            "not a mapping of keys",
            "give an Accelerate config YAML or a TrainingArguments JSON/YAML",
        )
    return data


def load_settings(path: str) -> AccelerateSettings:
    """The Accelerate config or TrainingArguments file at ``path``, checked strictly."""
    data = read_file(path)
    if "distributed_type" in data or "compute_environment" in data:
        return _from_accelerate_config(path, data)
    return _from_training_arguments(path, data)


# ------------------------------------------------------------------ accelerate config YAML

_TOP_KEYS = {
    # Launch and machine keys `accelerate config` writes: they decide where processes run, not
    # what Dynamo sees (gbdoctor launches its own ranks).
    "compute_environment", "debug", "distributed_type", "downcast_bf16", "enable_cpu_affinity",
    "gpu_ids", "machine_rank", "main_process_ip", "main_process_port", "main_training_function",
    "mixed_precision", "num_machines", "num_processes", "rdzv_backend", "same_network",
    "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "use_cpu", "fsdp_config", "dynamo_config",
}  # fmt: skip
_REFUSED_TOP = {
    "deepspeed_config": "DeepSpeed through Accelerate is not set up by this framework: scan the "
    'DeepSpeed config itself with [gbdoctor] framework = "deepspeed"',
    "megatron_lm_config": "Megatron-LM through Accelerate is not supported: use distributed_type: FSDP "
    "with fsdp_version: 2",
    "parallelism_config": "Accelerate's parallelism_config (TP/CP/HSDP meshes) is not supported yet: "
    "drop it to scan FSDP2 over every rank",
    "fp8_config": "FP8 training needs CUDA kernels gbdoctor does not set up: drop fp8_config",
}
_FSDP_KEYS = {
    "fsdp_version", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params", "fsdp_activation_checkpointing", "fsdp_reshard_after_forward",
    "fsdp_offload_params", "fsdp_state_dict_type", "fsdp_cpu_ram_efficient_loading",
}  # fmt: skip
_FSDP1_KEYS = (
    "fsdp_sharding_strategy", "fsdp_backward_prefetch", "fsdp_forward_prefetch",
    "fsdp_use_orig_params", "fsdp_sync_module_states",
)  # fmt: skip
_DYNAMO_KEYS = {
    "dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic",
    "dynamo_use_regional_compilation",
}  # fmt: skip
_FSDP_HINT = "set distributed_type: FSDP with fsdp_config: {fsdp_version: 2, ...}"


def _from_accelerate_config(path: str, data: Mapping[str, Any]) -> AccelerateSettings:
    for key in data:
        if key in _REFUSED_TOP:
            raise _fail(path, f"{key} is not supported", _REFUSED_TOP[key])
        if key not in _TOP_KEYS:
            raise _unknown(path, "", key, sorted(_TOP_KEYS))
    kind = str(data.get("distributed_type", "NO"))
    if kind != "FSDP":
        alternative = {
            "DEEPSPEED": _REFUSED_TOP["deepspeed_config"],
            "MEGATRON_LM": _REFUSED_TOP["megatron_lm_config"],
        }.get(kind, _FSDP_HINT)
        raise _fail(path, f"distributed_type: {kind} is not supported (FSDP2 only)", alternative)
    fsdp = data.get("fsdp_config") or {}
    dynamo = data.get("dynamo_config") or {}
    if not isinstance(fsdp, dict) or not isinstance(dynamo, dict):
        raise _fail(path, "fsdp_config and dynamo_config must be mappings", _FSDP_HINT)
    for key in fsdp:
        if key in _FSDP1_KEYS:
            raise _fail(
                path,
                f"fsdp_config.{key} is an FSDP1 option",
                "FSDP2 has no such option: drop it and keep fsdp_version: 2",
            )
        if key not in _FSDP_KEYS:
            raise _unknown(path, "fsdp_config.", key, sorted(_FSDP_KEYS))
    for key in dynamo:
        if key not in _DYNAMO_KEYS:
            raise _unknown(path, "dynamo_config.", key, sorted(_DYNAMO_KEYS))
    version = str(fsdp.get("fsdp_version", 1))
    if version != "2":
        raise _fail(
            path,
            f"fsdp_config.fsdp_version: {version} is FSDP1, which gbdoctor does not set up",
            "set fsdp_version: 2 (FSDP2, fully_shard)",
        )
    layers = fsdp.get("fsdp_transformer_layer_cls_to_wrap") or ""
    names = layers if isinstance(layers, list) else str(layers).split(",")
    return _checked(
        path,
        AccelerateSettings(
            source=ACCELERATE_CONFIG,
            mixed_precision=str(data.get("mixed_precision", "no")),
            auto_wrap_policy=str(fsdp.get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")),
            transformer_layer_cls_to_wrap=tuple(n.strip() for n in names if n.strip()),
            min_num_params=int(fsdp.get("fsdp_min_num_params", 0)),
            activation_checkpointing=_bool(
                path,
                "fsdp_config.fsdp_activation_checkpointing",
                fsdp.get("fsdp_activation_checkpointing", False),
            ),
            reshard_after_forward=_bool(
                path,
                "fsdp_config.fsdp_reshard_after_forward",
                fsdp.get("fsdp_reshard_after_forward", True),
            ),
            dynamo_backend=str(dynamo.get("dynamo_backend", "no")).lower(),
            dynamo_mode=str(dynamo.get("dynamo_mode", "default")),
            fullgraph=_bool(
                path,
                "dynamo_config.dynamo_use_fullgraph",
                dynamo.get("dynamo_use_fullgraph", False),
            ),
            dynamic=(
                None
                if dynamo.get("dynamo_use_dynamic") is None
                else _bool(path, "dynamo_config.dynamo_use_dynamic", dynamo["dynamo_use_dynamic"])
            ),
            regional=_bool(
                path,
                "dynamo_config.dynamo_use_regional_compilation",
                dynamo.get("dynamo_use_regional_compilation", False),
            ),
        ),
        offload=_bool(
            path, "fsdp_config.fsdp_offload_params", fsdp.get("fsdp_offload_params", False)
        ),
        offload_key="fsdp_config.fsdp_offload_params",
    )


# ------------------------------------------------------------------ TrainingArguments

_TA_FSDP_KEYS = {
    "version", "auto_wrap_policy", "transformer_layer_cls_to_wrap", "min_num_params",
    "activation_checkpointing", "reshard_after_forward", "cpu_offload", "state_dict_type",
    "cpu_ram_efficient_loading", "xla", "xla_fsdp_grad_ckpt", "xla_fsdp_settings",
}  # fmt: skip


def _training_argument_names() -> list[str]:
    from transformers import TrainingArguments

    return [f.name for f in fields(TrainingArguments)]


def _from_training_arguments(path: str, data: Mapping[str, Any]) -> AccelerateSettings:
    known = _training_argument_names()
    for key in data:
        if key not in known:
            raise _unknown(path, "", key, known)
    if data.get("deepspeed"):
        raise _fail(
            path, "deepspeed is not supported with this framework", _REFUSED_TOP["deepspeed_config"]
        )
    fsdp = data.get("fsdp")
    if not fsdp:
        raise _fail(
            path,
            "fsdp is not set: gbdoctor sets the Trainer up with FSDP2 only",
            'set "fsdp": true and "fsdp_config": {"version": 2, ...}',
        )
    config = data.get("fsdp_config") or {}
    if isinstance(config, str):
        config = read_file(os.path.join(os.path.dirname(path), config))
    config = {k.removeprefix("fsdp_"): v for k, v in dict(config).items()}
    for key in config:
        if key not in _TA_FSDP_KEYS:
            raise _unknown(path, "fsdp_config.", key, sorted(_TA_FSDP_KEYS))
    if _bool(path, "fsdp_config.xla", config.get("xla", False)):
        raise _fail(
            path, "fsdp_config.xla (PyTorch/XLA FSDP) is not supported", "drop xla: FSDP2 on torch"
        )
    if str(config.get("version", 2)) != "2":
        raise _fail(
            path,
            f"fsdp_config.version: {config['version']} is FSDP1, which gbdoctor does not set up",
            'set "version": 2 (FSDP2, fully_shard)',
        )
    reshard = config.get("reshard_after_forward")
    offload = _bool(path, "fsdp_config.cpu_offload", config.get("cpu_offload", False))
    if isinstance(
        fsdp, (str, list)
    ):  # the Trainer's legacy form, as _apply_legacy_fsdp_to_config reads it
        for item in fsdp.split() if isinstance(fsdp, str) else list(fsdp):
            if item in ("full_shard", "shard_grad_op") and reshard is None:
                reshard = item == "full_shard"
            elif item == "offload":
                offload = True
            elif item != "auto_wrap":
                raise _fail(
                    path,
                    f"fsdp: {item!r} is an FSDP1 sharding strategy",
                    'use "full_shard" or "shard_grad_op" (FSDP2), or "fsdp": true',
                )
    layers = config.get("transformer_layer_cls_to_wrap") or ()
    layers = [layers] if isinstance(layers, str) else list(layers)
    compile_on = bool(data.get("torch_compile")) or any(
        data.get(k) is not None for k in ("torch_compile_backend", "torch_compile_mode")
    )
    kwargs = data.get("gradient_checkpointing_kwargs") or {}
    if not isinstance(kwargs, dict) or set(kwargs) - {"use_reentrant"}:
        raise _fail(
            path,
            f"gradient_checkpointing_kwargs {kwargs!r}: only use_reentrant is read",
            'give {"use_reentrant": false} or drop the other keys',
        )
    mixed = "bf16" if data.get("bf16") else "fp16" if data.get("fp16") else "no"
    return _checked(
        path,
        AccelerateSettings(
            source=TRAINING_ARGUMENTS,
            mixed_precision=mixed,
            auto_wrap_policy=str(config.get("auto_wrap_policy", "TRANSFORMER_BASED_WRAP")),
            transformer_layer_cls_to_wrap=tuple(layers),
            min_num_params=int(config.get("min_num_params", 0)),
            activation_checkpointing=_bool(
                path,
                "fsdp_config.activation_checkpointing",
                config.get("activation_checkpointing", False),
            ),
            reshard_after_forward=True
            if reshard is None
            else _bool(path, "fsdp_config.reshard_after_forward", reshard),
            # The Trainer sets ACCELERATE_DYNAMO_BACKEND/_MODE: accelerate then compiles the
            # whole model (TrainingArguments have no regional-compilation field).
            dynamo_backend=str(data.get("torch_compile_backend") or "inductor").lower()
            if compile_on
            else "no",
            dynamo_mode=str(data.get("torch_compile_mode") or "default"),
            gradient_checkpointing=bool(data.get("gradient_checkpointing")),
            use_reentrant=kwargs.get("use_reentrant"),
        ),
        offload=offload,
        offload_key="fsdp_config.cpu_offload",
    )


def _checked(
    path: str, settings: AccelerateSettings, *, offload: bool, offload_key: str
) -> AccelerateSettings:
    if offload:
        raise _fail(
            path,
            f"{offload_key} (FSDP2 CPU offload) is not supported: it moves parameters, not graph breaks",
            f"set {offload_key} to false for the scan",
        )
    if settings.mixed_precision not in ("no", "bf16", "fp16"):
        raise _fail(
            path,
            f"mixed_precision: {settings.mixed_precision} is not no, bf16 or fp16",
            "choose one of them",
        )
    if settings.auto_wrap_policy not in WRAP_POLICIES:
        raise _fail(
            path,
            f"auto wrap policy {settings.auto_wrap_policy!r} is not one of {', '.join(WRAP_POLICIES)}",
            "use TRANSFORMER_BASED_WRAP (with the decoder layer class)",
        )
    if settings.auto_wrap_policy == "NO_WRAP" and settings.activation_checkpointing:
        raise _fail(
            path,
            "activation checkpointing with auto wrap policy NO_WRAP wraps no layer in accelerate",
            "use TRANSFORMER_BASED_WRAP, or turn activation checkpointing off",
        )
    return settings
