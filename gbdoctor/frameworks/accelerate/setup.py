"""An Accelerate FSDP2 setup made by the installed accelerate's own functions, in the order of
``Accelerator._prepare_fsdp2``:

1. the Trainer's model checkpointing (``gradient_checkpointing_enable`` with its kwargs), when
   the TrainingArguments ask for it (the Trainer does it before ``prepare``);
2. ``fsdp_plugin.set_auto_wrap_policy``, then activation checkpointing (``fsdp2_apply_ac``);
3. with ``use_regional_compilation``: Dynamo's ``capture_scalar_outputs`` and
   ``skip_fwd_side_effects_in_bwd_under_checkpoint`` set, then ``compile_regions_fsdp2`` (each
   repeated block compiled in place); otherwise ``torch.compile`` of the whole model;
4. ``fsdp2_prepare_model``: ``fully_shard`` by the auto-wrap policy, embeddings and the tail,
   then the root, with ``reshard_after_forward`` and the mixed-precision policy.

What is done by hand, and why: on a CPU machine ``Accelerator()`` does not select FSDP (its
state falls back to no distribution or DDP), so no ``Accelerator`` is made. accelerate's FSDP2
functions read four things of it (``state.fsdp_plugin``, ``mixed_precision``,
``torch_device_mesh``, ``is_main_process``): a stand-in holds exactly those, with a real
``FullyShardedDataParallelPlugin`` built from the config, on gbdoctor's gloo process group.

While ``compile_regions_fsdp2`` runs, ``nn.Module.compile`` goes to the capture session (a
backend that records), so a region is compiled exactly where accelerate compiles it. A
whole-model compile has no per-block region: each block is compiled in place instead, with the
config's ``fullgraph`` (a note says so), so the scan reports per block what that compile meets.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn as nn

from gbdoctor.frameworks.accelerate.config import AccelerateSettings
from gbdoctor.setup.apply import BlockSlot

REGIONAL_DYNAMO_FLAGS = (
    ("capture_scalar_outputs", True),
    ("skip_fwd_side_effects_in_bwd_under_checkpoint", True),
)
"""What ``Accelerator._prepare_fsdp2`` sets before ``compile_regions_fsdp2`` (accelerate 1.15)."""


@dataclass(frozen=True)
class AccelerateStrategy:
    """What a scan or run changes of the configured setup."""

    name: str
    compile: bool | None = None
    """None: as the config says; False: nothing compiled."""
    plan: str | None = None
    settings: tuple[str, ...] = ()
    """``key=json`` settings a plan changes on top of the run's (``plan.plan_strategy``)."""
    summary: str = ""


STRATEGIES = {
    "accelerate": AccelerateStrategy("accelerate", summary="the config's own compile settings"),
    "eager": AccelerateStrategy("eager", compile=False, summary="nothing compiled"),
}


@dataclass
class AccelerateSetup:
    """A model as accelerate's functions prepared it (the fields scan, inspect and run read)."""

    model: nn.Module
    blocks: list[BlockSlot]
    optimizer: Any
    strategy: AccelerateStrategy
    meshes: Any
    settings: AccelerateSettings
    dynamo_flags: tuple[tuple[str, Any], ...] = ()
    hooks: list[Any] = field(default_factory=list)
    fsdp: bool = True
    loss_parallel: bool = False
    engine: Any = None
    own_loss: bool = False
    own_pipeline: bool = False  # interface.OwnPipeline: Accelerate has no pipeline of its own
    notes: tuple[str, ...] = ()

    @property
    def ac_enabled(self) -> bool:
        return any(slot.ac_wrapped for slot in self.blocks)


def accelerate_version() -> str:
    from importlib import metadata

    return metadata.version("accelerate")


def fsdp_plugin(settings: AccelerateSettings) -> Any:
    """accelerate's own ``FullyShardedDataParallelPlugin`` for these settings."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy=settings.auto_wrap_policy.lower(),
        transformer_cls_names_to_wrap=list(settings.transformer_layer_cls_to_wrap) or None,
        min_num_params=settings.min_num_params,
        activation_checkpointing=settings.activation_checkpointing,
        reshard_after_forward=settings.reshard_after_forward,
        mixed_precision_policy=None
        if settings.mixed_precision == "no"
        else settings.mixed_precision,
    )


def accelerator_stand_in(settings: AccelerateSettings, device: torch.device) -> Any:
    """What ``fsdp2_apply_ac`` and ``fsdp2_prepare_model`` read of an ``Accelerator`` (see the
    module docstring: ``Accelerator()`` does not select FSDP on CPU)."""
    import torch.distributed as dist

    return types.SimpleNamespace(
        state=types.SimpleNamespace(fsdp_plugin=fsdp_plugin(settings)),
        mixed_precision=settings.mixed_precision,
        torch_device_mesh=None,  # accelerate's own default without a parallelism_config
        parallelism_config=None,
        is_main_process=dist.get_rank() == 0,
        device=device,
    )


def outer_name(model: nn.Module, module: nn.Module) -> str:
    """``module``'s FQN in ``model`` without torch's wrapper attributes."""
    for name, candidate in model.named_modules():
        if candidate is module:
            return ".".join(
                p for p in name.split(".") if p not in ("_checkpoint_wrapped_module", "_orig_mod")
            )
    return type(module).__name__


@contextlib.contextmanager
def recording_module_compile(
    model: nn.Module, compile_region: Any, regions: dict[str, bool]
) -> Iterator[None]:
    """``nn.Module.compile`` as ``compile_region(module, fqn, fullgraph)`` (and recorded in
    ``regions``) while accelerate compiles."""
    original = nn.Module.compile

    def module_compile(module: nn.Module, *args: Any, **kwargs: Any) -> None:
        fqn = outer_name(model, module)
        regions[fqn] = bool(kwargs.get("fullgraph", False))
        nn.Module.compile = original  # type: ignore[method-assign,assignment]
        try:
            compile_region(module, fqn, regions[fqn], **kwargs)
        finally:
            nn.Module.compile = module_compile  # type: ignore[method-assign,assignment]

    nn.Module.compile = module_compile  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.compile = original  # type: ignore[method-assign,assignment]


def prepare(
    model: nn.Module,
    settings: AccelerateSettings,
    *,
    compile_region: Any | None,
    backend: str | None,
    strategy: AccelerateStrategy,
) -> tuple[nn.Module, dict[str, bool], tuple[tuple[str, Any], ...], list[str]]:
    """Steps 1-4 of the module docstring on ``model``: (model, compiled regions, Dynamo flags
    set, notes). ``compile_region(module, fqn, fullgraph, **kwargs)``: how a region is compiled
    (a capture session's recording compile); None: ``module.compile`` with the config's options
    (``backend`` replacing its backend)."""
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model
    from accelerate.utils.other import compile_regions_fsdp2

    from gbdoctor.models.structure import find_blocks

    notes: list[str] = []
    if settings.gradient_checkpointing:
        kwargs = (
            None if settings.use_reentrant is None else {"use_reentrant": settings.use_reentrant}
        )
        cast(Any, model).gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    # The device the model was built on: accelerate's own is the process's (LOCAL_RANK's GPU).
    accelerator = accelerator_stand_in(settings, next(model.parameters()).device)
    accelerator.state.fsdp_plugin.set_auto_wrap_policy(model)
    if settings.activation_checkpointing:
        model = fsdp2_apply_ac(accelerator, model)

    regions: dict[str, bool] = {}
    flags: tuple[tuple[str, Any], ...] = ()
    compiles = settings.compiles and strategy.compile is not False

    def real_compile(module: nn.Module, fqn: str, fullgraph: bool, **kwargs: Any) -> None:
        module.compile(**{**kwargs, **({"backend": backend} if backend else {})})

    region_compile = compile_region or real_compile
    options = _compile_kwargs(settings)
    if compiles and settings.regional:
        flags = REGIONAL_DYNAMO_FLAGS
        with recording_module_compile(model, region_compile, regions):
            model = compile_regions_fsdp2(model, **options)
    elif compiles:
        # accelerate: torch.compile(model) before fully_shard. Per block instead (module docstring).
        blocks = [outer for _, _, outer in find_blocks(model).items()]
        with recording_module_compile(model, region_compile, regions):
            for outer in blocks:
                outer.compile(**options)
        notes.append(
            f"accelerate compiles the whole model with one torch.compile "
            f"(fullgraph={settings.fullgraph}) before fully_shard; gbdoctor compiled each of the "
            f"{len(blocks)} blocks in place with the same options instead, so each block's breaks "
            "are what that compile meets inside it"
        )
    model = fsdp2_prepare_model(accelerator, model)
    return model, regions, flags, notes


def _compile_kwargs(settings: AccelerateSettings) -> dict[str, Any]:
    """``TorchDynamoPlugin.to_kwargs()`` of the config's dynamo settings (accelerate's own)."""
    from accelerate.utils import TorchDynamoPlugin

    plugin = TorchDynamoPlugin(
        backend=settings.dynamo_backend,
        mode=settings.dynamo_mode,
        fullgraph=settings.fullgraph,
        dynamic=settings.dynamic,
        use_regional_compilation=settings.regional,
    )
    kwargs = plugin.to_kwargs()
    kwargs["backend"] = plugin.to_dict()["backend"]
    return kwargs


def block_slots(model: nn.Module, regions: dict[str, bool]) -> list[BlockSlot]:
    """Blocks and MoE layers found by structure (``models.structure``), as for any model."""
    from gbdoctor.models.structure import find_blocks, find_moe_layers, hidden_size

    hidden = hidden_size(model)
    out = []
    for fqn, key, outer in find_blocks(model).items():
        inner = getattr(outer, "_checkpoint_wrapped_module", outer)
        mine = [(r, fg) for r, fg in regions.items() if r == fqn or r.startswith(fqn + ".")]
        ac = ("",) if inner is not outer else ()
        moe = bool(find_moe_layers(inner, hidden))
        out.append(
            BlockSlot(
                fqn=fqn,
                key=str(key),
                block=inner,
                outer=outer,
                is_moe=moe,
                kind=("moe" if moe else "dense") + ("+ac" if ac else ""),
                ac_wrapped=ac,
                regions=tuple(r for r, _ in mine),
                fullgraph_regions=tuple(r for r, fg in mine if fg),
            )
        )
    return out


def set_up(
    model: nn.Module,
    meshes: Any,
    settings: AccelerateSettings,
    strategy: AccelerateStrategy,
    options: Any,
) -> AccelerateSetup:
    """accelerate's preparation (``prepare``), the optimizer, the blocks, the notes."""
    if strategy.settings:
        changed = AccelerateSettings.from_args(settings.as_args() + strategy.settings)
        settings = changed
    session = getattr(options.compile_fn, "__self__", None)
    compile_region = None
    if session is not None:

        def compile_region(module: nn.Module, fqn: str, fullgraph: bool, **kwargs: Any) -> None:
            session.compile_in_place(module, fqn, fullgraph)

    model, regions, flags, notes = prepare(
        model, settings, compile_region=compile_region, backend=options.backend, strategy=strategy
    )
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    blocks = block_slots(model, regions)
    notes.insert(
        0,
        f"set up by accelerate {accelerate_version()}'s own FSDP2 functions (fsdp2_apply_ac, "
        "compile_regions_fsdp2, fsdp2_prepare_model) on gloo ranks; by hand: the Accelerator "
        "they read (CPU Accelerator() does not select FSDP), torch AdamW, random token ids",
    )
    return AccelerateSetup(
        model=model,
        blocks=blocks,
        optimizer=optimizer,
        strategy=strategy,
        meshes=meshes,
        settings=settings,
        dynamo_flags=flags,
        notes=tuple(notes),
    )
