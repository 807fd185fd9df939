"""The installed torchtitan as the setup (torchtitan >= 0.3: Python config registries).

The model is built and set up by torchtitan's own code: its ``ConfigManager`` (``--module`` /
``--config`` plus ``--section.key`` overrides), the config's ``model_spec`` (model registry),
``update_from_config``, the spec's ``parallelize_fn`` (TP/EP, AC, compile, FSDP2 in
torchtitan's order), ``init_weights``, the loss and optimizer builders and the
``post_optimizer_build_fn`` (MoE load balancing). The one change: while ``parallelize_fn``
runs, ``nn.Module.compile`` and ``torch.compile`` are gbdoctor's recording compile, so a region
is compiled exactly where torchtitan compiles it, with a backend that records.

What torchtitan needs on a CPU machine, provided without changing where breaks happen (see
``cpu_stand_ins``): a ``triton`` stand-in while torchtitan's modules load, "cpu" as its device
type, FlexAttention's CPU-backward guard lifted, SUM reductions for FSDP2 on gloo, random token
ids instead of its dataloader.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from gbdoctor.errors import SetupError, SpecError
from gbdoctor.records import RegistryRun, Spec
from gbdoctor.setup.apply import BlockSlot

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
    return RegistryRun(module=module, config=config, args=tuple(args))


def torchtitan_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchtitan")
    except PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------ CPU stand-ins


class _Anything:
    """Any attribute, any call: enough for module-level ``@triton.jit`` and ``tl.constexpr``."""

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Anything()


def _stand_in_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def attr(key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)  # inspect/importlib probe dunders: behave like a module
        return _Anything()

    module.__getattr__ = attr  # type: ignore[method-assign]
    return module


# torch modules that probe triton while they load or cache the answer: imported before the
# stand-in exists so that torch itself never sees it.
_TORCH_TRITON_PROBES = (
    "torch._inductor.compile_fx",
    "torch._inductor.codecache",
    "torch._inductor.runtime.triton_compat",
    "torch._functorch.partitioners",
    "torch.distributed.tensor",
    "torch.distributed.checkpoint",
    "torch.nn.attention.flex_attention",
    "torch.utils._triton",
)


@contextlib.contextmanager
def _triton_stand_in() -> Iterator[None]:
    """torchtitan 0.3 imports triton unconditionally (``distributed/minimal_async_ep/kernels.py``,
    reached from every MoE model) for GPU kernels a CPU run never calls."""
    for name in _TORCH_TRITON_PROBES:
        importlib.import_module(name)
    if importlib.util.find_spec("triton") is not None:
        yield
        return
    triton, language = _stand_in_module("triton"), _stand_in_module("triton.language")
    triton.language = language  # type: ignore[attr-defined]
    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    try:
        yield
    finally:
        del sys.modules["triton"], sys.modules["triton.language"]


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
    with _triton_stand_in():
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


@contextlib.contextmanager
def _cpu_device_type() -> Iterator[None]:
    """torchtitan picks its device from CUDA ("cuda" when none is visible); its modules copy
    ``device_type``/``device_module`` at import, so each copy is pointed at the CPU."""
    patched: list[tuple[Any, str, Any]] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("torchtitan") or module is None:
            continue
        for attr, value in (("device_type", "cpu"), ("device_module", torch.cpu)):
            if attr in vars(module) and isinstance(vars(module)[attr], (str, types.ModuleType)):
                patched.append((module, attr, vars(module)[attr]))
                setattr(module, attr, value)
    try:
        yield
    finally:
        for module, attr, value in reversed(patched):
            setattr(module, attr, value)


@contextlib.contextmanager
def _flex_cpu_backward() -> Iterator[None]:
    """torch 2.13's ``flex_attention`` refuses CPU inputs that require grad before it does
    anything (``_validate_device``); the math implementation underneath runs forward and
    backward on CPU. The check passes silently on CUDA, so lifting it for CPU tensors traces
    the same code a GPU run traces."""
    import torch.nn.attention.flex_attention as flex

    original = flex._validate_device

    def validate(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type != "cpu":
            original(query, key, value)

    flex._validate_device = validate
    # torchtitan compiles flex_attention once, at class level, with inductor, whose CPU
    # FlexAttention kernel has no backward on torch 2.13 (IndexError in the lowering): outside
    # a compiled block (eager training, run's eager mode) it runs through aot_eager instead,
    # the same math. Inside a compiled block it is traced into the block's graph either way.
    attention = sys.modules.get("torchtitan.models.common.attention")
    holder = getattr(attention, "FlexAttention", None)
    compiled = getattr(holder, "_compiled_flex_attn", None)
    if compiled is not None:
        holder._compiled_flex_attn = torch.compile(flex.flex_attention, backend="aot_eager")
    try:
        yield
    finally:
        flex._validate_device = original
        if compiled is not None:
            holder._compiled_flex_attn = compiled


@contextlib.contextmanager
def _no_regional_inductor() -> Iterator[None]:
    """Under ``aot_eager`` torchtitan lowers FlexAttention regions with inductor all the same
    (``distributed/compile.py``, regional inductor); on CPU that lowering has no backward (the
    same ``IndexError``), so on CPU the flex region stays in ``aot_eager`` like the rest."""
    compile_module = sys.modules.get("torchtitan.distributed.compile")
    original = getattr(compile_module, "_maybe_regional_inductor_backend", None)
    if original is None:
        yield
        return
    compile_module._maybe_regional_inductor_backend = lambda model, backend: backend  # type: ignore[union-attr]
    try:
        yield
    finally:
        compile_module._maybe_regional_inductor_backend = original  # type: ignore[union-attr]


@contextlib.contextmanager
def cpu_stand_ins(device: str) -> Iterator[None]:
    """Everything torchtitan needs to run on a CPU machine, undone on exit."""
    if device != "cpu":
        yield
        return
    with _cpu_device_type(), _flex_cpu_backward(), _no_regional_inductor():
        yield


# ------------------------------------------------------------------------------ setup


@dataclass
class TitanMeshes:
    """What ``build`` returns beside the model: torchtitan's loaded config and its
    ``ParallelDims`` (the seam's "meshes"; ``set_up`` hands both to its ``parallelize_fn``)."""

    config: Any
    parallel_dims: Any
    device: torch.device


@dataclass
class TitanSetup:
    """A model as torchtitan's own code set it up, plus what a training step needs (the fields
    the scan, inspect and run stages read of any framework's setup)."""

    config: Any
    model: nn.Module
    blocks: list[BlockSlot]
    optimizer: Any
    meshes: TitanMeshes
    strategy: Any
    loss_fn: Any
    trainer_state: Any
    dynamo_flags: tuple[tuple[str, Any], ...]
    hooks: list[Any] = field(default_factory=list)
    dynamo_restore: tuple[tuple[str, Any], ...] = ()
    """The Dynamo settings torchtitan's setup changed, as they were before: its settings are in
    effect inside ``step_context`` only, so the next setup in this process (or another
    framework's) starts from the same state."""
    fsdp: bool = False
    notes: tuple[str, ...] = ()
    loss_parallel: bool = False
    engine: Any = None
    own_loss: bool = True
    copies_said: bool = False
    """torchtitan's loss (its chunked loss applies the LM head) turns the output into the loss."""

    @property
    def ac_enabled(self) -> bool:
        return any(slot.ac_wrapped for slot in self.blocks)

    def batch(
        self, tokens: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any], torch.Tensor]:
        """Through torchtitan's own ``post_dataloading_process`` (positions, attention masks,
        SPMD annotations)."""
        from torchtitan.trainer import Trainer

        positions = torch.arange(tokens.shape[1]).repeat(tokens.shape[0], 1)
        inputs, labels, extra = Trainer.post_dataloading_process(
            self.trainer_state, {"input": tokens, "positions": positions}, labels
        )
        return inputs, extra, labels


def _is_checkpoint_wrapper(module: nn.Module) -> bool:
    return hasattr(module, "_checkpoint_wrapped_module")


def _unwrap(module: nn.Module) -> nn.Module:
    while True:
        inner = getattr(module, "_checkpoint_wrapped_module", None) or getattr(
            module, "_orig_mod", None
        )
        if inner is None:
            return module
        module = inner


class _RecordingCompile:
    """``nn.Module.compile`` / ``torch.compile`` as gbdoctor's recording compile while
    torchtitan's ``parallelize_fn`` runs; records every region it compiled."""

    def __init__(self, model: nn.Module, session: Any) -> None:
        self.model = model
        self.session = session
        self.compiled: dict[str, bool] = {}
        """Region FQN -> fullgraph, the latest compile of each."""
        self.in_place: dict[str, nn.Module] = {}

    @property
    def regions(self) -> list[tuple[str, bool]]:
        """Compiled regions, less in-place compiles undone since (a plan's eager layers, set
        by gbdoctor's strategy or by an emitted ``parallelize`` wrapper)."""
        return [
            (fqn, fullgraph)
            for fqn, fullgraph in self.compiled.items()
            if fqn not in self.in_place or self.in_place[fqn]._compiled_call_impl is not None
        ]

    def _fqn(self, obj: Any) -> str:
        for name, module in self.model.named_modules():
            if module is obj:
                return ".".join(
                    p
                    for p in name.split(".")
                    if p not in ("_checkpoint_wrapped_module", "_orig_mod")
                )
        return getattr(obj, "__qualname__", type(obj).__name__)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        original_module_compile = nn.Module.compile
        original_compile = torch.compile
        recorder = self

        def module_compile(module: nn.Module, *args: Any, **kwargs: Any) -> None:
            fqn = recorder._fqn(module)
            fullgraph = bool(kwargs.get("fullgraph", False))
            recorder.compiled[fqn] = fullgraph
            recorder.in_place[fqn] = module
            if recorder.session is None:
                return original_module_compile(module, *args, **kwargs)
            with recorder.originals():  # the session calls the real ones
                recorder.session.compile_in_place(module, fqn, fullgraph)

        def compile_(target: Any = None, **kwargs: Any) -> Any:
            if target is None:  # decorator form
                return lambda fn: compile_(fn, **kwargs)
            fqn = recorder._fqn(target)
            fullgraph = bool(kwargs.get("fullgraph", False))
            recorder.compiled[fqn] = fullgraph
            if recorder.session is None:
                return original_compile(target, **kwargs)
            with recorder.originals():
                return recorder.session.compile_fn(target, fqn, fullgraph)

        self._originals = (original_module_compile, original_compile)
        self._recording = (module_compile, compile_)
        self._swap(self._recording)
        try:
            yield
        finally:
            self._swap(self._originals)

    @staticmethod
    def _swap(pair: tuple[Any, Any]) -> None:
        nn.Module.compile, torch.compile = pair  # type: ignore[method-assign,assignment]

    @contextlib.contextmanager
    def originals(self) -> Iterator[None]:
        self._swap(self._originals)
        try:
            yield
        finally:
            self._swap(self._recording)


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
    except (ValueError, ImportError, AttributeError) as exc:
        raise SpecError(
            f"torchtitan could not load {run.module}:{run.config}: {exc}",
            hint="MODULE is a torchtitan model (deepseek_v3, llama3, ...), CONFIG a "
            "function of its config_registry",
        ) from exc


def _dynamo_settings() -> dict[str, Any]:
    import torch._dynamo

    return {
        k: v
        for k, v in torch._dynamo.config.get_config_copy().items()
        if isinstance(v, (bool, int, float, str, type(None)))
    }


def build(spec: Spec, device_type: str) -> tuple[nn.Module, TitanMeshes]:
    """torchtitan's config and its model on meta (it materializes after parallelizing)."""
    run = registry_run(spec)
    config = load_config(run)
    with cpu_stand_ins(device_type):
        model, parallel_dims = _build_model(spec, config)
    return model, TitanMeshes(config, parallel_dims, torch.device(device_type))


def meta_model(spec: Spec) -> nn.Module:
    """The model torchtitan's config builds, on meta, without a process group (estimates)."""
    return _model_on_meta(load_config(registry_run(spec)), overrides=False)


def _model_on_meta(config: Any, *, overrides: bool = True) -> nn.Module:
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


def registry_run(spec: Spec) -> RegistryRun:
    if spec.registry_run is None:
        raise SpecError(
            f"{spec.path} is not a torchtitan run", hint="name it with --torchtitan MODULE:CONFIG"
        )
    return spec.registry_run


def _build_model(spec: Spec, config: Any) -> tuple[nn.Module, Any]:
    import torch.distributed as dist
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils

    world = dist.get_world_size()
    try:
        parallel_dims = ParallelDims.from_config(config.parallelism, world)
    except (AssertionError, ValueError) as exc:
        raise SpecError(
            f"torchtitan rejects this parallelism on {world} rank(s): {exc}",
            hint="adjust --parallelism.* degrees",
        ) from exc
    dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
    torch.manual_seed(spec.training.seed)
    model = _model_on_meta(config)
    return model, parallel_dims


def set_up(model: nn.Module, meshes: TitanMeshes, strategy: Any, compile_fn: Any) -> TitanSetup:
    """torchtitan's ``parallelize_fn`` (with the recording compile when ``compile_fn`` belongs
    to a capture session), then ``strategy``'s changes (eager: nothing compiled; a plan: its
    per-layer compile and Dynamo flags, ``layer_plan``), weights, loss, optimizer."""
    with cpu_stand_ins(meshes.device.type):
        return _set_up(model, meshes, strategy, compile_fn)


def _set_up(model: nn.Module, meshes: TitanMeshes, strategy: Any, compile_fn: Any) -> TitanSetup:
    from torchtitan.components.loss import ChunkedLossWrapper
    from torchtitan.distributed import utils as dist_utils

    from gbdoctor.frameworks.torchtitan.cudagraph_wrappers import wrapper_graph_check
    from gbdoctor.frameworks.torchtitan.layer_plan import apply_layer_plan
    from gbdoctor.frameworks.torchtitan.whole_model import (
        compile_blocks_when_traced_whole,
        simple_fsdp_note,
        unapplied_ac_note,
    )

    config, parallel_dims, device = meshes.config, meshes.parallel_dims, meshes.device.type
    if strategy.compile is not None:
        config.compile.enable = strategy.compile
    spec = config.model_spec
    model_config = spec.model
    before = _dynamo_settings()
    # A capture session's compile_fn comes with the session: torchtitan >= 0.3 compiles in
    # place (Module.compile), which the session does with compile_in_place.
    session = getattr(compile_fn, "__self__", None)
    if session is not None and wrapper_graph_check not in session.graph_checks:
        session.graph_checks.append(wrapper_graph_check)  # torchtitan's own CUDA-graph wrappers
    recorder = _RecordingCompile(model, session)
    with recorder.installed():
        try:
            model = spec.parallelize_fn(
                model,
                parallel_dims=parallel_dims,
                training=config.training,
                parallelism=config.parallelism,
                compile_config=config.compile,
                ac_config=config.activation_checkpoint,
                dump_folder=config.dump_folder,
            )
        except ImportError as exc:  # e.g. --compile.enable_autoparallel: 'autoparallel'
            raise SpecError(
                f"torchtitan's parallelize_fn needs {exc.name or exc}, which is not installed",
                hint="install it, or drop the option that asks for it",
            ) from exc
        per_block = compile_blocks_when_traced_whole(model, recorder, config.compile, strategy)
        if strategy.layers or strategy.flags:
            apply_layer_plan(model, strategy.layers, strategy.flags, config.compile.backend)
    after = _dynamo_settings()
    flags = tuple(sorted((k, v) for k, v in after.items() if before.get(k) != v))
    restore = tuple((k, before[k]) for k, _ in flags if k in before)
    _set_dynamo(restore)  # in effect inside step_context only (inspect enters none)

    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    fsdp = _sum_reductions_on_gloo(model)
    simple_fsdp = simple_fsdp_note(model)

    loss_fn = config.loss.build(compile_config=config.compile)
    if isinstance(loss_fn, ChunkedLossWrapper):
        loss_fn.set_lm_head(model.lm_head)
        model._skip_lm_head = True
    optimizer = config.optimizer.build(model_parts=[model])
    if spec.post_optimizer_build_fn is not None:
        spec.post_optimizer_build_fn(optimizer, [model], parallel_dims)
    trainer_state = types.SimpleNamespace(
        config=config,
        model_config=model_config,
        model_parts=[model],
        parallel_dims=parallel_dims,
        ntokens_seen=0,
        loss_fn=loss_fn,
        device=torch.device(device),
        train_context=dist_utils.get_spmd_context(
            parallel_dims=parallel_dims, spmd_typechecking=False
        ),
    )

    ac = config.activation_checkpoint
    ac_label = "sac" if ac is not None and type(ac).__qualname__.startswith("Selective") else "ac"
    blocks = _blocks(model, recorder.regions, ac_label)
    notes = [stand_in_note()]
    notes += [n for n in (per_block, simple_fsdp, unapplied_ac_note(config, blocks)) if n]
    if not recorder.regions and strategy.compile is not False:
        notes.append("torchtitan compiled nothing under this config (pass --compile.enable)")
    return TitanSetup(
        config=config,
        model=model,
        blocks=blocks,
        optimizer=optimizer,
        meshes=meshes,
        strategy=strategy,
        loss_fn=loss_fn,
        trainer_state=trainer_state,
        dynamo_flags=flags,
        dynamo_restore=restore,
        fsdp=fsdp or simple_fsdp is not None,
        notes=tuple(notes),
    )


def stand_in_note() -> str:
    return (
        f"set up by torchtitan {torchtitan_version()}'s own code; CPU stand-ins: triton "
        "stand-in while torchtitan loads, 'cpu' device type, FlexAttention's CPU-backward guard "
        "lifted, FSDP2 SUM reductions on gloo, random token ids instead of its dataloader"
    )


def _sum_reductions_on_gloo(model: nn.Module) -> bool:
    """gloo has no PREMUL_SUM, which FSDP2 uses for torchtitan's gradient divide factor: the
    same division as SUM plus an eager post-scale (backward, outside every compiled region)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if dist.get_backend() == "gloo":
        for module in sharded:
            module.set_force_sum_reduction_for_comms(True)
    return bool(sharded)


def _blocks(model: nn.Module, regions: list[tuple[str, bool]], ac_label: str) -> list[BlockSlot]:
    """Blocks and MoE layers found by structure (``models.structure``), as for any model."""
    from gbdoctor.models.structure import find_blocks, find_moe_layers, hidden_size

    hidden = hidden_size(model)
    out = []
    for fqn, key, outer in find_blocks(model).items():
        inner = _unwrap(outer)
        mine = [(r, fg) for r, fg in regions if r == fqn or r.startswith(fqn + ".")]
        ac = (
            ("",)
            if _is_checkpoint_wrapper(outer)
            else tuple(
                name.replace("._checkpoint_wrapped_module", "")
                for name, m in outer.named_modules()
                if name and _is_checkpoint_wrapper(m)
            )
        )
        moe = bool(find_moe_layers(inner, hidden))
        kind = ("moe" if moe else "dense") + (f"+{ac_label}" if ac else "")
        out.append(
            BlockSlot(
                fqn=fqn,
                key=str(key),
                block=inner,
                outer=outer,
                is_moe=moe,
                kind=kind,
                ac_wrapped=ac,
                regions=tuple(r for r, _ in mine),
                fullgraph_regions=tuple(r for r, fg in mine if fg),
            )
        )
    return out


@contextlib.contextmanager
def step_context(setup: TitanSetup) -> Iterator[None]:
    """torchtitan set its Dynamo globals itself (``apply_compile``); the CPU stand-ins and its
    SPMD train context stay on while steps and captures run. torchtitan never unsets those
    globals: they are put back on exit (a plan's re-scans run in one process)."""
    _set_dynamo(setup.dynamo_flags)
    try:
        with cpu_stand_ins(setup.meshes.device.type), setup.trainer_state.train_context():
            yield
    finally:
        _set_dynamo(setup.dynamo_restore)


def _set_dynamo(settings: tuple[tuple[str, Any], ...]) -> None:
    import torch._dynamo

    for name, value in settings:
        setattr(torch._dynamo.config, name, value)


def timed_train_step(
    setup: TitanSetup, tokens: torch.Tensor, labels: torch.Tensor, sync: Any = None
) -> tuple[float, tuple[float, float, float]]:
    """torchtitan's ``_forward_backward_body``, then the optimizer step (whose pre-step hook is
    its MoE load balancing), split into (forward with the loss, backward, optimizer) seconds.
    The body stays torchtitan's own: the forward/backward boundary is read when its loss
    function returns (it is wrapped for the call), so the forward includes the loss."""
    import time

    from torchtitan.trainer import Trainer

    def now() -> float:
        if sync is not None:
            sync()
        return time.perf_counter()

    inputs, extra, labels = setup.batch(tokens, labels)
    if not setup.copies_said:  # what torchtitan's CUDA-graph wrappers would copy per replay
        from gbdoctor.frameworks.torchtitan.cudagraph_wrappers import step_copies_note

        setup.notes += (step_copies_note(setup.config, inputs, labels, extra),)
        setup.copies_said = True
    state = setup.trainer_state
    loss_fn = state.loss_fn
    marks: list[float] = []

    def timed_loss(*args: Any, **kwargs: Any) -> Any:
        out = loss_fn(*args, **kwargs)
        marks.append(now())
        return out

    state.loss_fn = timed_loss
    try:
        t0 = now()
        loss = Trainer._forward_backward_body(
            state, inputs, labels, torch.tensor(labels.numel()), extra
        )
        t2 = now()
    finally:
        state.loss_fn = loss_fn
    setup.optimizer.step()
    setup.optimizer.zero_grad()
    t3 = now()
    t1 = marks[-1] if marks else t2
    return float(loss.detach()), (t1 - t0, t2 - t1, t3 - t2)
