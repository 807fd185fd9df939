"""Spec files: torchtitan v0.2.x TOML train configs (plus a ``[gbdoctor]`` section) -> ``Spec``.

The accepted keys are torchtitan v0.2.2's ``JobConfig`` fields (``torchtitan/config/job_config.py``
at tag v0.2.2, commit 73a0e697), so any real v0.2.2 config loads. Only the sections and keys that
can change graph breaks are typed into the records; the rest are accepted and dropped. Unknown
sections and unknown keys in the sections gbdoctor reads are errors, never silently ignored.

No torch import here; the model registry (``gbdoctor.models``) is imported lazily.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.frameworks.registry import all_frameworks, framework_named, framework_names
from gbdoctor.records import (
    ACSpec,
    CompileSpec,
    ModelSpec,
    ParallelSpec,
    Spec,
    ToolSpec,
    TrainingSpec,
)

__all__ = [
    "AC_MODES",
    "COMPILE_COMPONENTS",
    "DEVICES",
    "IGNORED_SECTIONS",
    "VALID_KEYS",
    "load_spec",
    "parse_override",
    "spec_notes",
]

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

_RECORDS: dict[str, type] = {
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
_UNSUPPORTED_DEGREES = ("context_parallel_degree", "pipeline_parallel_degree")

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

_TYPE_WORDS = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "a table",
}


# --------------------------------------------------------------------------- overrides


def parse_override(text: str) -> tuple[str, str, object]:
    """``section.key=value`` -> ``(section, key, value)``.

    The value is read as a TOML value when it is one (``true``, ``2``, ``"op"``, ``["model"]``),
    else taken as a bare string (``op``, ``titan-v0.2.2``). ``key`` may be dotted for nested
    tables (``training.dataloader.num_workers=2``).
    """
    name, sep, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not section or not key.strip():
        raise SpecError(
            f"override {text!r} is not section.key=value",
            "write e.g. --set parallelism.expert_parallel_degree=2",
        )
    return section, key.strip(), _parse_value(raw.strip())


def with_overrides(spec: Spec, overrides: Sequence[str]) -> Spec:
    """``spec`` with trusted ``section.key=value`` overrides applied to the loaded record (a known
    issue's workaround; user input goes through :func:`load_spec`, which validates it)."""
    for text in overrides:
        section, key, value = parse_override(text)
        table = getattr(spec, section)
        spec = dataclasses.replace(spec, **{section: dataclasses.replace(table, **{key: value})})
    return spec


def _parse_value(raw: str) -> object:
    try:
        parsed = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        return raw
    # "1\nx = 2" would parse into two keys: not one value, so keep the text as it is.
    return parsed["v"] if list(parsed) == ["v"] else raw


# --------------------------------------------------------------------------- loading


@dataclasses.dataclass
class _Ctx:
    path: str
    origins: dict[tuple[str, str], tuple[str, str | None]]
    """(section, key) -> (override text, raw value text) for keys set with --set."""

    def where(self, section: str, key: str) -> str:
        origin = self.origins.get((section, key))
        return f"{section}.{key}" + (f" (from --set {origin[0]})" if origin else "")

    def fail(self, message: str, hint: str | None = None) -> typing.NoReturn:
        raise SpecError(f"{self.path}: {message}", hint)


def load_spec(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Spec:
    """Read, override, check and type a spec file. Every problem is a one-line ``SpecError``."""
    shown = os.fspath(path)
    data = _read_toml(shown)
    ctx = _Ctx(path=shown, origins={})
    for text in overrides:
        _apply_override(data, text, ctx)
    _check_sections(data, ctx)

    values = {name: _typed_section(data.get(name, {}), name, ctx) for name in _RECORDS}
    seed = _typed_value(data.get("debug", {}).get("seed"), int, "debug", "seed", ctx)
    if seed is not None:
        values["training"]["seed"] = seed

    spec_dir = os.path.dirname(os.path.abspath(shown))
    model = _check_model(values["model"], data, spec_dir, ctx)
    n_experts = _num_experts(model)
    spec = Spec(
        path=shown,
        root=stable_root(shown),
        model=model,
        training=_check_training(values["training"], ctx),
        parallelism=_check_parallelism(
            values["parallelism"],
            model,
            n_experts,
            ctx,
            launch_size=values["gbdoctor"].get("world_size") or 0,
        ),
        activation_checkpoint=_check_ac(values["activation_checkpoint"], ctx),
        compile=_check_compile(values["compile"], ctx),
        gbdoctor=_check_tool(values["gbdoctor"], ctx),
    )
    tokens = spec.capture_batch_size * spec.capture_seq_len
    if tokens > MAX_CAPTURE_TOKENS:
        ctx.fail(
            f"capture batch {spec.capture_batch_size} x {spec.capture_seq_len} = {tokens} tokens "
            f"per rank exceeds gbdoctor's limit of {MAX_CAPTURE_TOKENS}",
            "set [gbdoctor] batch_size and seq_len small (e.g. 2 and 64): breaks do not depend on size",
        )
    tp = spec.parallelism.tensor_parallel_degree
    lengths = (
        ("training", "seq_len", spec.training.seq_len),
        ("gbdoctor", "seq_len", spec.capture_seq_len),
    )
    for section, name, value in lengths:
        if tp > 1 and value % tp:
            # torchtitan asserts it too: sequence parallelism shards the sequence evenly.
            ctx.fail(
                f"{ctx.where(section, name)} = {value} is not divisible by "
                f"tensor_parallel_degree = {tp}",
                f"use a multiple of {tp} for {name}",
            )
    # The framework completes and checks its own part; the others refuse their sections.
    for framework in all_frameworks():
        if framework.name == spec.gbdoctor.framework:
            spec = framework.check_spec(spec, data, "strategy" in values["gbdoctor"], spec_dir, ctx)
        else:
            framework.check_foreign_spec(spec, data, ctx)
    return spec


def stable_root(path: str) -> str:
    """The directory report paths are relative to (``Spec.root``): the nearest ancestor of the
    spec file holding ``.git`` (a directory, or a file in a git worktree), else the spec file's
    directory. Never the working directory (issue #18: keys must not depend on it)."""
    here = os.path.dirname(os.path.abspath(path))
    parent = here
    while True:
        if os.path.exists(os.path.join(parent, ".git")):
            return parent
        up = os.path.dirname(parent)
        if up == parent:
            return here
        parent = up


def _read_toml(path: str) -> dict[str, Any]:
    from gbdoctor.records.io import read_regular_file

    data = read_regular_file(
        path,
        "spec",
        "pass the path of a TOML spec, e.g. fixtures/llama3_debug.toml",
        error=SpecError,
    )
    try:
        # A UTF-8 byte-order mark (some Windows editors write one) is not TOML, but it is
        # harmless: drop it instead of calling the whole file invalid.
        return tomllib.loads(data.decode("utf-8").removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: invalid TOML: {e}", "fix the TOML syntax at that line") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: invalid TOML: not UTF-8 text ({e.reason})") from None
    except RecursionError:
        raise SpecError(
            f"{path}: invalid TOML: nested too deeply to read", "flatten the nested tables"
        ) from None


def _apply_override(data: dict[str, Any], text: str, ctx: _Ctx) -> None:
    section, key, value = parse_override(text)
    raw = text.partition("=")[2].strip()
    _check_section_name(section, ctx, f" (from --set {text})")
    if section in IGNORED_SECTIONS and section != "debug":
        return
    head, *rest = key.split(".")
    if section in VALID_KEYS:
        _check_key(section, head, ctx, f" (from --set {text})")
    table = data.setdefault(section, {})
    if not isinstance(table, dict):
        ctx.fail(
            f"[{section}] must be a table, got {_type_word(table)}",
            f"write the keys under a [{section}] header",
        )
    for part in [head, *rest][:-1]:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            ctx.fail(f"--set {text}: {section}.{part} is not a table")
    table[([head, *rest])[-1]] = value
    ctx.origins[(section, head)] = (text, raw if not rest else None)


def _check_sections(data: Mapping[str, Any], ctx: _Ctx) -> None:
    for section, table in data.items():
        _check_section_name(section, ctx)
        if not isinstance(table, dict):
            ctx.fail(
                f"[{section}] must be a table, got {section} = {table!r}",
                f"write the keys under a [{section}] header",
            )
        if section in VALID_KEYS:
            for key in table:
                _check_key(section, key, ctx)


def _check_section_name(section: str, ctx: _Ctx, origin: str = "") -> None:
    owned = [s for framework in all_frameworks() for s in framework.spec_sections]
    if section in VALID_KEYS or section in IGNORED_SECTIONS or section in owned:
        return
    known = sorted(VALID_KEYS) + owned + sorted(IGNORED_SECTIONS)
    ctx.fail(
        f"unknown section [{section}]{origin}{_did_you_mean(section, known)}; "
        f"known sections: {', '.join(known)}",
        "sections follow torchtitan v0.2.2's JobConfig plus [gbdoctor]; fix the spelling",
    )


def _check_key(section: str, key: str, ctx: _Ctx, origin: str = "") -> None:
    valid = VALID_KEYS[section]
    if key in valid:
        return
    ctx.fail(
        f"[{section}] unknown key '{key}'{origin}{_did_you_mean(key, valid)}; "
        f"valid keys: {', '.join(sorted(valid))}",
        f"fix the spelling or remove the key from [{section}]",
    )


def _did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return f" (did you mean '{by_lower[close[0]]}'?)" if close else ""


# --------------------------------------------------------------------------- typing


def _typed_section(table: Mapping[str, Any], section: str, ctx: _Ctx) -> dict[str, Any]:
    """The keys of ``table`` that are fields of the section's record, type-checked."""
    record = _RECORDS[section]
    hints = typing.get_type_hints(record)
    extra = (
        {"expert_parallel_comm_backend": str, "enable_async_tensor_parallel": bool}
        if section == "parallelism"
        else {}
    )
    out: dict[str, Any] = {}
    for key, value in table.items():
        tp = hints.get(key) if key in VALID_KEYS[section] else None
        tp = tp or extra.get(key)
        if tp is not None:
            out[key] = _typed_value(value, tp, section, key, ctx)
    return out


def _typed_value(value: Any, tp: Any, section: str, key: str, ctx: _Ctx) -> Any:
    if value is None:
        return None
    origin = ctx.origins.get((section, key))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if tp is str:
        if origin is not None and origin[1] is not None and not isinstance(value, str):
            return origin[1]  # --set model.flavor=8 means the string "8"
        if key == "selective_ac_option" and type(value) is int:
            return str(value)  # torchtitan reads it with int(); accept an unquoted number
        if isinstance(value, str):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if type(value) is int:
            return value
    elif tp is float:
        if type(value) in (int, float):
            return float(value)
    elif typing.get_origin(tp) is tuple:
        if origin is not None and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        tp = list  # for the message: an array of strings
    else:  # pragma: no cover - a record field of a type this loader does not know
        raise TypeError(f"unsupported spec field type {tp!r} for {section}.{key}")
    want = "an array of strings" if tp is list else _TYPE_WORDS[tp]
    ctx.fail(
        f"{ctx.where(section, key)} must be {want}, got {value!r} ({_type_word(value)})",
        f"fix the value of {key} in [{section}]",
    )


def _type_word(value: Any) -> str:
    return _TYPE_WORDS.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------- checks


def _check_model(
    values: dict[str, Any], data: Mapping[str, Any], spec_dir: str, ctx: _Ctx
) -> ModelSpec:
    from gbdoctor.models import FAMILIES, family_flavors

    if "model" not in data:
        ctx.fail(
            "missing [model] section",
            'add [model] with name = "llama3" (or llama4, '
            'deepseek_v3, custom) and flavor = "debugmodel"',
        )
    name = values.get("name")
    families = tuple(FAMILIES) + (() if CUSTOM_FAMILY in FAMILIES else (CUSTOM_FAMILY,))
    if name is None:
        ctx.fail("[model] name is required", f"set name to one of: {', '.join(families)}")
    if name not in families:
        ctx.fail(
            f"{ctx.where('model', 'name')} = '{name}' is not a known model family"
            f"{_did_you_mean(name, families)}; choose one of: {', '.join(families)}",
            'for your own model use name = "custom" and factory = "path/to/file.py:build"',
        )
    flavor = values.get("flavor", DEFAULT_FLAVOR)
    factory = values.get("factory")
    if name == CUSTOM_FAMILY:
        if not factory:
            ctx.fail(
                "[model] name = 'custom' needs a factory",
                'set factory = "path/to/file.py:build" or "package.module:build"',
            )
        factory = _resolve_factory(factory, spec_dir, ctx)
    else:
        if factory is not None:
            ctx.fail(
                f"{ctx.where('model', 'factory')} is only used with name = 'custom' "
                f"(name is '{name}')",
                'remove factory, or set name = "custom"',
            )
        flavors = tuple(family_flavors(name))
        if flavor not in flavors:
            ctx.fail(
                f"{ctx.where('model', 'flavor')} = '{flavor}' is not a flavor of {name}"
                f"{_did_you_mean(flavor, flavors)}; valid flavors: {', '.join(flavors)}",
                f"pick one of the {name} flavors",
            )
    return ModelSpec(name=name, flavor=flavor, factory=factory)


def _resolve_factory(factory: str, spec_dir: str, ctx: _Ctx) -> str:
    target, sep, attr = factory.rpartition(":")
    is_path = target.endswith(".py") or "/" in target or os.sep in target
    ok_attr = all(part.isidentifier() for part in attr.split("."))
    ok_module = is_path or all(part.isidentifier() for part in target.split("."))
    if not sep or not target or not ok_attr or not ok_module:
        ctx.fail(
            f"{ctx.where('model', 'factory')} = '{factory}' is not "
            "'path/to/file.py:build' or 'package.module:build'",
            "name the file (relative to the spec file) or module, a colon, and the function",
        )
    if not is_path:
        from gbdoctor.usercode import stdlib_target

        if stdlib_target(target):
            ctx.fail(
                f"{ctx.where('model', 'factory')} = '{factory}' names the standard-library or "
                f"builtin module '{target}', not a model factory",
                "point the factory at your own file or package, which defines "
                "build(flavor) -> nn.Module",
            )
        return factory
    resolved = os.path.normpath(os.path.join(spec_dir, os.path.expanduser(target)))
    return f"{resolved}:{attr}"


def _num_experts(model: ModelSpec) -> int | None:
    if model.name == CUSTOM_FAMILY:
        return None
    from gbdoctor.models import num_experts

    return num_experts(model.name, model.flavor)


def _check_training(values: dict[str, Any], ctx: _Ctx) -> TrainingSpec:
    for key in ("local_batch_size", "seq_len", "steps"):
        if key in values and values[key] < 1:
            ctx.fail(
                f"{ctx.where('training', key)} must be a positive integer, got {values[key]}",
                f"fix {key} in [training]",
            )
    for key in ("mixed_precision_param", "mixed_precision_reduce"):
        if key in values and values[key] not in MIXED_PRECISION_DTYPES:
            ctx.fail(
                f"{ctx.where('training', key)} = '{values[key]}' is not one of "
                f"{', '.join(MIXED_PRECISION_DTYPES)}",
                f"fix {key} in [training]",
            )
    return TrainingSpec(**values)


def _check_parallelism(
    values: dict[str, Any],
    model: ModelSpec,
    n_experts: int | None,
    ctx: _Ctx,
    launch_size: int = 0,
) -> ParallelSpec:
    comm_backend = values.pop("expert_parallel_comm_backend", "standard")
    async_tp = values.pop("enable_async_tensor_parallel", False)
    p = ParallelSpec(**values)
    for key in _DEGREES:
        degree = getattr(p, key)
        if degree < 1 and not (key == "data_parallel_shard_degree" and degree == -1):
            allowed = (
                "a positive integer or -1"
                if key == "data_parallel_shard_degree"
                else "a positive integer"
            )
            ctx.fail(
                f"{ctx.where('parallelism', key)} must be {allowed}, got {degree}",
                "degrees count ranks; 1 means no parallelism along that dimension",
            )
    unsupported = [
        f"{ctx.where('parallelism', key)} = {getattr(p, key)}"
        for key in _UNSUPPORTED_DEGREES
        if getattr(p, key) > 1
    ]
    if unsupported:
        ctx.fail(
            f"{', '.join(unsupported)}: not supported yet (gbdoctor sets up FSDP, HSDP, EP, TP)",
            "set them to 1 (e.g. --set parallelism.pipeline_parallel_degree=1) to scan the "
            "blocks under FSDP/EP/TP",
        )
    if p.fsdp_reshard_after_forward not in RESHARD_POLICIES:
        ctx.fail(
            f"{ctx.where('parallelism', 'fsdp_reshard_after_forward')} = "
            f"'{p.fsdp_reshard_after_forward}' is not one of {', '.join(RESHARD_POLICIES)}",
            "torchtitan's values: default, always, never",
        )

    ep, tp = p.expert_parallel_degree, p.tensor_parallel_degree
    _check_tp(p, model, async_tp, ctx)
    where = ctx.where("parallelism", "expert_parallel_degree")
    if ep > 1:
        if comm_backend != "standard":
            ctx.fail(
                f"{ctx.where('parallelism', 'expert_parallel_comm_backend')} = "
                f"'{comm_backend}' with expert parallelism: not supported yet",
                'use the standard all-to-all backend: expert_parallel_comm_backend = "standard"',
            )
        if model.name != CUSTOM_FAMILY and n_experts is None:
            ctx.fail(
                f"{where} = {ep}, but {model.name} '{model.flavor}' is a dense model (no experts)",
                "set expert_parallel_degree = 1 or pick an MoE model",
            )
        if n_experts is not None and n_experts % ep:
            ctx.fail(
                f"{where} = {ep} does not divide the {n_experts} experts of "
                f"{model.name} '{model.flavor}'",
                f"use a divisor of {n_experts} for expert_parallel_degree",
            )
    # EP borrows its ranks from the FSDP dimension ("dp2ep"). torchtitan resolves -1 to every
    # rank the launch has left (world // the other degrees); without a stated launch size, -1
    # resolves to the smallest world that hosts EP.
    dp_shard = p.data_parallel_shard_degree
    replicate = p.data_parallel_replicate_degree
    others = (
        replicate
        * p.tensor_parallel_degree
        * p.context_parallel_degree
        * p.pipeline_parallel_degree
    )
    size_where = ctx.where("gbdoctor", "world_size")
    if launch_size < 0:
        ctx.fail(
            f"{size_where} must be a positive integer (or 0: not stated), got {launch_size}",
            "the number of ranks the training job launches, e.g. --world-size 64",
        )
    if dp_shard == -1 and launch_size:
        if launch_size % others:
            ctx.fail(
                f"{size_where} = {launch_size} is not a multiple of the other degrees' product "
                f"({others}), so data_parallel_shard_degree = -1 cannot be resolved",
                f"state a launch size that is a multiple of {others}",
            )
        dp_shard = launch_size // others
        if dp_shard % ep:
            ctx.fail(
                f"{where} = {ep} does not divide the {dp_shard} ranks that "
                f"data_parallel_shard_degree = -1 resolves to with {size_where} = {launch_size} "
                "(EP borrows its ranks from FSDP)",
                f"state a launch size that is a multiple of {others * ep}",
            )
    elif dp_shard == -1:
        dp_shard = max(1, ep)
    elif launch_size and launch_size != others * dp_shard:
        ctx.fail(
            f"{size_where} = {launch_size} does not match the degrees: their product is "
            f"{others * dp_shard}",
            "drop the world size, or set data_parallel_shard_degree = -1 to take every rank",
        )
    elif dp_shard % ep:
        shard_where = ctx.where("parallelism", "data_parallel_shard_degree")
        ctx.fail(
            f"{where} = {ep} does not divide {shard_where} = {dp_shard} "
            "(EP borrows its ranks from FSDP)",
            "make data_parallel_shard_degree a multiple of expert_parallel_degree, or -1",
        )
    world_size = p.data_parallel_replicate_degree * dp_shard * tp
    if world_size > MAX_WORLD_SIZE:
        ctx.fail(
            f"world size {world_size} "
            f"({ctx.where('parallelism', 'data_parallel_replicate_degree')} x "
            f"{ctx.where('parallelism', 'data_parallel_shard_degree')} x "
            f"{ctx.where('parallelism', 'tensor_parallel_degree')}) exceeds gbdoctor's "
            f"limit of {MAX_WORLD_SIZE} ranks",
            "check the degrees for a typo; breaks do not depend on the world size beyond the EP "
            "and FSDP degrees",
        )
    return dataclasses.replace(p, dp_shard=dp_shard, world_size=world_size)


def _check_tp(p: ParallelSpec, model: ModelSpec, async_tp: bool, ctx: _Ctx) -> None:
    """What tensor parallelism gbdoctor sets up: torchtitan's plans for the built-in families,
    on a (dp_shard x tp) mesh; async TP, expert TP and EP together with TP are refused."""
    tp, where = p.tensor_parallel_degree, ctx.where("parallelism", "tensor_parallel_degree")
    etp = p.expert_tensor_parallel_degree
    # torchtitan v0.2.2 accepts etp in {1, tp}. Without EP, experts are tensor-parallel on the TP
    # mesh whatever etp says (its apply_moe_ep_tp uses TensorParallel when there is no EP mesh),
    # which is what gbdoctor sets up; etp only matters when EP and TP combine.
    if etp not in (1, tp):
        ctx.fail(
            f"{ctx.where('parallelism', 'expert_tensor_parallel_degree')} = {etp} with "
            f"{where} = {tp}: torchtitan accepts only 1 or the TP degree",
            f"set expert_tensor_parallel_degree = 1 or {tp}",
        )
    if tp == 1:
        return
    if async_tp:
        ctx.fail(
            f"{ctx.where('parallelism', 'enable_async_tensor_parallel')} = true: async TP is not "
            "supported (it rewrites compiled graphs into symmetric-memory CUDA kernels, which a "
            "CPU capture cannot show)",
            "set enable_async_tensor_parallel = false; the TP breaks and recompiles are the same",
        )
    if model.name == CUSTOM_FAMILY:
        ctx.fail(
            f"{where} = {tp} with a custom model: TP plans exist for the built-in families "
            "(llama3, llama4, deepseek_v3), which address modules by name",
            "set tensor_parallel_degree = 1 for custom models",
        )
    if p.expert_parallel_degree > 1:
        ctx.fail(
            f"{where} = {tp} together with expert_parallel_degree = {p.expert_parallel_degree}: "
            "EP borrowing ranks from TP is not supported yet",
            "use TP (experts sharded on their hidden size) or EP, not both",
        )


def _check_ac(values: dict[str, Any], ctx: _Ctx) -> ACSpec:
    ac = ACSpec(**values)
    if ac.mode not in AC_MODES:
        ctx.fail(
            f"{ctx.where('activation_checkpoint', 'mode')} = '{ac.mode}' is not one of "
            f"{', '.join(AC_MODES)}{_did_you_mean(ac.mode, AC_MODES)}",
            'use mode = "selective", "full" or "none"',
        )
    if ac.mode == "memory_budget":
        ctx.fail(
            f"{ctx.where('activation_checkpoint', 'mode')} = 'memory_budget': not supported yet",
            'use mode = "selective", "full" or "none"',
        )
    option = ac.selective_ac_option.strip()
    if option != "op":
        # isdigit() alone accepts '²', which int() refuses.
        if not (option.isascii() and option.isdigit()) or int(option) < 1:
            ctx.fail(
                f"{ctx.where('activation_checkpoint', 'selective_ac_option')} = "
                f"'{ac.selective_ac_option}' must be a positive integer (wrap every Nth "
                "block) or 'op' (per-op SAC)",
                'write e.g. selective_ac_option = "2" or "op"',
            )
        option = str(int(option))
    return dataclasses.replace(ac, selective_ac_option=option)


def _check_compile(values: dict[str, Any], ctx: _Ctx) -> CompileSpec:
    c = CompileSpec(**values, backend_set="backend" in values)
    unknown = [x for x in c.components if x not in COMPILE_COMPONENTS]
    if unknown:
        ctx.fail(
            f"{ctx.where('compile', 'components')} has unknown component(s) "
            f"{', '.join(map(repr, unknown))}; valid: {', '.join(COMPILE_COMPONENTS)}",
            'write e.g. components = ["model", "loss"]',
        )
    return c


def _check_tool(values: dict[str, Any], ctx: _Ctx) -> ToolSpec:
    t = ToolSpec(**values)
    frameworks = framework_names()
    if t.framework not in frameworks:
        default_name, *others = frameworks
        ctx.fail(
            f"{ctx.where('gbdoctor', 'framework')} = '{t.framework}' is not one of "
            f"{', '.join(frameworks)}{_did_you_mean(t.framework, frameworks)}",
            f"{default_name} (the default) or {' or '.join(others)}",
        )
    framework = framework_named(t.framework)
    names = framework.strategy_names
    if "strategy" in values and t.strategy not in names:
        default = framework.default_strategy
        ctx.fail(
            f"{ctx.where('gbdoctor', 'strategy')} = '{t.strategy}' is not a known strategy "
            f"(framework '{t.framework}'){_did_you_mean(t.strategy, names)}; choose one of: "
            f"{', '.join(names)}",
            f'see the README\'s compile strategies; the default is "{default}"',
        )
    if t.device not in DEVICES:
        ctx.fail(
            f"{ctx.where('gbdoctor', 'device')} = '{t.device}' is not one of {', '.join(DEVICES)}",
            "auto picks cuda when available, else cpu",
        )
    for key in ("batch_size", "seq_len"):
        if getattr(t, key) < 0:
            ctx.fail(
                f"{ctx.where('gbdoctor', key)} must be a positive integer (or 0 for the "
                f"[training] value), got {getattr(t, key)}",
                f"fix {key} in [gbdoctor]",
            )
    if not math.isfinite(t.timeout_s) or not 0 < t.timeout_s <= MAX_TIMEOUT_S:
        ctx.fail(
            f"{ctx.where('gbdoctor', 'timeout_s')} must be a number of seconds in (0, "
            f"{MAX_TIMEOUT_S:g}], got {t.timeout_s}",
            "a wall-clock limit in seconds for multi-rank jobs, e.g. 600",
        )
    return t


# --------------------------------------------------------------------------- notes


def spec_notes(spec: Spec) -> tuple[str, ...]:
    """What a report must say about how the spec was read: the resolved -1 degree, and a config
    whose training run would not compile the blocks that the scan compiles."""
    notes = []
    p, c = spec.parallelism, spec.compile
    if p.data_parallel_shard_degree == -1:
        if spec.gbdoctor.world_size:
            notes.append(
                f"data_parallel_shard_degree = -1 resolved to {p.dp_shard} (every rank of the "
                f"stated launch size {spec.gbdoctor.world_size}, as torchtitan does)"
            )
        else:
            notes.append(
                f"data_parallel_shard_degree = -1 resolved to {p.dp_shard} (no launch size "
                "stated: the smallest world that hosts EP); pass --world-size N (or [gbdoctor] "
                "world_size) to use the launch size, as torchtitan does"
            )
    # Some frameworks compile as [gbdoctor] strategy says, whatever the [compile] section says.
    compiles_per_section = framework_named(spec.gbdoctor.framework).compiles_per_compile_section()
    if compiles_per_section and (not c.enable or "model" not in c.components):
        why = (
            "[compile] enable = false"
            if not c.enable
            else f'[compile] components = {list(c.components)} lacks "model"'
        )
        notes.append(
            f"{why}: training with this config would not compile the blocks; the scan "
            "shows what would happen if it did"
        )
    return tuple(notes)
