"""A torchtitan (>= 0.3) run resolved to torchtitan's own config: ``MODULE:CONFIG`` plus its
``--section.key`` overrides through its ``ConfigManager``, the ranks its parallelism needs, and the
model its config builds on meta; what torchtitan rejects becomes a one-line ``SpecError`` /
``SetupError``.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
from typing import Any

import torch
import torch.nn as nn

from gbdoctor.errors import SetupError, SpecError
from gbdoctor.frameworks.torchtitan.cpu import triton_stand_in
from gbdoctor.records import RegistryRun, Spec

TORCHTITAN_VERSIONS_TESTED = ("0.3.0",)
"""torchtitan releases the installed-torchtitan path was measured against (torch 2.13.0)."""


def parse_run(name: str, args: tuple[str, ...] = ()) -> RegistryRun:
    """``MODULE:CONFIG`` plus torchtitan's own overrides as the run record."""
    module, sep, config = name.partition(":")
    if not sep or not module or not config:
        raise SpecError(
            f"--torchtitan expects MODULE:CONFIG, got {name!r}",
            hint="e.g. --torchtitan deepseek_v3:deepseek_v3_debugmodel",
        )
    if not all(part.isidentifier() for part in module.split(".")) or not config.isidentifier():
        # A path (../../x) reached importlib as a relative import: an internal error (issue 45).
        raise SpecError(
            f"--torchtitan {name!r}: MODULE must be a dotted module name and CONFIG a name",
            hint="e.g. --torchtitan deepseek_v3:deepseek_v3_debugmodel",
        )
    return RegistryRun(module=module, config=config, args=tuple(args))


def torchtitan_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchtitan")
    except PackageNotFoundError:
        return None


def _registry_path(module: str) -> str:
    """The config registry ``module`` names, found as torchtitan's ``ConfigManager`` finds it:
    a short name of a model (``llama3``) or an experiment (``graph_trainer.llama3``) is
    ``<package>.<name>.config_registry``; anything else is a dotted module path."""
    from torchtitan.experiments import _supported_experiments
    from torchtitan.models import _supported_models

    if module in _supported_models:
        return f"torchtitan.models.{module}.config_registry"
    if module in _supported_experiments:
        return f"torchtitan.experiments.{module}.config_registry"
    return module


def import_torchtitan(run: RegistryRun) -> Any:
    """Import torchtitan's config registry for ``run`` (with the triton stand-in)."""
    if torchtitan_version() is None:
        raise SetupError(
            "torchtitan is not installed",
            hint='pip install "gbdoctor[torchtitan]" (torchtitan 0.3.0), or scan a v0.2.x TOML',
        )
    with triton_stand_in():
        from torchtitan.experiments import _supported_experiments
        from torchtitan.models import _supported_models

        try:
            registry = importlib.import_module(_registry_path(run.module))
        except ImportError as exc:
            missing = getattr(exc, "name", None)
            hint = (
                "torchtitan models: "
                f"{', '.join(sorted(_supported_models | _supported_experiments))}"
                if not missing or missing.startswith(("torchtitan", run.module))
                else f"that model needs {missing!r}, which torchtitan does not install: install "
                "it (on CPU only if it has a CPU path), or choose another model"
            )
            raise SpecError(
                f"cannot import torchtitan module {run.module!r}: {exc}", hint=hint
            ) from exc
        import torchtitan.config.manager  # noqa: F401 - loads the rest of its config code
        import torchtitan.trainer  # noqa: F401
    return registry


def world_size_for(config: Any) -> int:
    """Ranks the parallelism config needs (``dp_shard = -1`` takes what EP needs, at least 1)."""
    p = config.parallelism
    fixed = (
        p.data_parallel_replicate_degree
        * p.context_parallel_degree
        * p.tensor_parallel_degree
        * p.pipeline_parallel_degree
    )
    shard = p.data_parallel_shard_degree
    if shard == -1:
        ep = p.expert_parallel_degree
        inner = p.context_parallel_degree * p.tensor_parallel_degree
        shard = max(1, ep // math.gcd(ep, inner)) if ep > 1 else 1
    return fixed * shard


def load_config(run: RegistryRun) -> Any:
    import_torchtitan(run)
    from torchtitan.config.manager import ConfigManager

    argv = ["--module", run.module, "--config", run.config, *run.args]
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return ConfigManager().parse_args(argv)
    except SystemExit as exc:  # tyro exits on a bad override after printing why
        raise SpecError(
            f"torchtitan rejected the arguments {' '.join(run.args)!r}",
            hint="use torchtitan's own --section.key VALUE overrides (see its --help)",
        ) from exc
    except ImportError as exc:  # e.g. float8 configs: "torchao is not installed"
        raise SetupError(
            f"torchtitan could not load {run.module}:{run.config}: {exc}",
            hint="install what it names (torchtitan does not install it), or choose another "
            "configuration",
        ) from exc
    except (ValueError, AttributeError) as exc:
        raise SpecError(
            f"torchtitan could not load {run.module}:{run.config}: {exc}",
            hint="MODULE is a torchtitan model (deepseek_v3, llama3, ...), CONFIG a "
            "function of its config_registry",
        ) from exc


def registry_run(spec: Spec) -> RegistryRun:
    if spec.registry_run is None:
        raise SpecError(
            f"{spec.path} is not a torchtitan run", hint="name it with --torchtitan MODULE:CONFIG"
        )
    return spec.registry_run


def meta_model(spec: Spec) -> nn.Module:
    """The model torchtitan's config builds, on meta, without a process group (estimates)."""
    return model_on_meta(load_config(registry_run(spec)), overrides=False)


def model_on_meta(config: Any, *, overrides: bool = True) -> nn.Module:
    """``update_from_config`` (plus ``--override`` imports), then the model built on meta; its
    own config checks (e.g. a token dispatcher that needs EP > 1) become one-line errors."""
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.tools import utils as tt_utils

    model_config = config.model_spec.model
    try:
        model_config.update_from_config(config=config)
        if overrides and config.override.imports:
            from torchtitan.config.override import apply_overrides

            apply_overrides(config.override, config)
        with (
            torch.device("meta"),
            tt_utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]),
        ):
            return model_config.build()
    except ValueError as exc:
        raise SpecError(
            f"torchtitan rejects this configuration: {exc}",
            hint="change it with torchtitan's own --section.key overrides after the run name",
        ) from exc
    except ImportError as exc:  # e.g. HybridEP: a torch API newer than the installed torch
        raise SetupError(
            f"this configuration needs code this environment lacks: {exc}",
            hint="install what it names (torch and torchtitan versions that match), or choose "
            "another configuration",
        ) from exc
    except (AssertionError, RuntimeError) as exc:
        if "CUDA" not in str(exc):
            raise
        # e.g. MinimalAsyncEP's token dispatcher allocates CUDA symmetric memory when built.
        raise SetupError(
            f"this configuration builds CUDA-only parts and cannot run on this machine: {exc}",
            hint="scan it on a GPU machine, or choose a configuration with a CPU path "
            "(e.g. the default token dispatcher)",
        ) from exc
