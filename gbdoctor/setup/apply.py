"""The one function that sets a model up the way training does, used by every command.

Order (torchtitan v0.2.2's ``parallelize_*``): TP -> EP -> AC -> compile -> FSDP2 -> optimizer
with the load-balancing pre-step hook. The Dynamo settings of the compile strategy are not applied
here but returned, to be entered with ``recipe_context`` around the code that runs the model,
so that they are restored afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn as nn

from gbdoctor.errors import SpecError
from gbdoctor.models.structure import ep_refusal, find_blocks, find_moe_layers, hidden_size
from gbdoctor.records import BlockKind, Spec
from gbdoctor.setup import ac as ac_mod
from gbdoctor.setup.balance import load_balanced_moes, register_load_balancing
from gbdoctor.setup.compile import (
    STRATEGIES,
    CompileFn,
    Strategy,
    apply_compile,
    default_eager,
)
from gbdoctor.setup.ep import apply_ep
from gbdoctor.setup.fsdp import apply_fsdp
from gbdoctor.setup.optim import build_adamw
from gbdoctor.setup.pipeline import PipelineLayout, pipeline_layout
from gbdoctor.setup.tp import TP_INSTALLER, apply_tp, check_divisible


@dataclass
class BlockSlot:
    """One transformer block as set up."""

    fqn: str
    """``layers.3``."""
    key: str
    """Key in the ``layers`` container."""
    block: nn.Module
    """The model's own block module (inside every wrapper)."""
    outer: nn.Module
    """What the container now holds (FSDP-managed; maybe compiled and/or AC-wrapped)."""
    is_moe: bool
    kind: str
    """Kind label before structural dedupe (``dense``, ``moe+sac``...)."""
    ac_wrapped: tuple[str, ...] = ()
    """Sub-FQNs (relative to the block) wrapped by AC; ``""`` means the whole block."""
    regions: tuple[str, ...] = ()
    fullgraph_regions: tuple[str, ...] = ()
    stage: int | None = None
    """The pipeline stage that holds this block (None without pipeline parallelism)."""


@dataclass
class InstalledHook:
    module: str
    """Module FQN (or ``optimizer``)."""
    kind: str
    """forward_pre, forward, backward, optimizer_pre_step."""
    installer: str
    """ep, load-balancing (gbdoctor's setup); fsdp and user hooks are discovered by inspect."""
    fn: Any


class SetupStrategy(Protocol):
    """What a Setup reads from the strategy it was set up with: any framework's own strategy
    (``compile.Strategy`` here; DeepSpeed's and others' are theirs)."""

    @property
    def flags(self) -> tuple[tuple[str, Any], ...]:
        """Dynamo config settings the training step runs under."""
        ...


@dataclass
class Setup:
    model: nn.Module
    blocks: list[BlockSlot]
    optimizer: torch.optim.Optimizer | None
    strategy: SetupStrategy
    meshes: Any
    hooks: list[InstalledHook] = field(default_factory=list)
    fsdp: bool = True
    loss_parallel: bool = False
    """TP keeps the logits vocabulary-sharded DTensors: the loss runs under ``loss_parallel()``."""
    pipeline: PipelineLayout | None = None
    """How pipeline parallelism splits the model (None without it)."""
    engine: Any = None
    """The DeepSpeed engine (``frameworks.deepspeed.setup``): it runs forward, backward and step."""
    own_loss: bool = False
    """The framework's step turns the model's output into the loss itself (the installed
    torchtitan's chunked loss applies the LM head): no note on what the model returned."""
    own_pipeline: bool = False
    """The framework's own pipeline code set this rank up (``interface.OwnPipeline``): its
    warm-up step is the framework's schedule step, and no probe or forward-only step runs."""

    @property
    def dynamo_flags(self) -> tuple[tuple[str, Any], ...]:
        return self.strategy.flags

    @property
    def ac_enabled(self) -> bool:
        return any(slot.ac_wrapped for slot in self.blocks)


def block_slots(model: nn.Module, path: str | None = None) -> list[tuple[str, str, nn.Module]]:
    """(fqn, container key, block) for the model's block container, found by structure unless
    ``path`` (``[gbdoctor] blocks``) names it; FQNs are the model's own (``model.layers.3``)."""
    return find_blocks(model, path).items()


def _expert_stores(fqn: str, block: nn.Module, hidden: int | None) -> list[tuple[str, nn.Module]]:
    """(FQN, module) of the block's expert stores (MoE found by structure), which EP shards;
    refuses (exit 2) an MoE layer gbdoctor's torchtitan-style dispatch cannot drive."""
    found = []
    for moe in find_moe_layers(block, hidden):
        experts = block.get_submodule(moe.experts)
        reason = ep_refusal(moe, experts)
        if reason is not None:
            where = f"{fqn}.{moe.path}" if moe.path else fqn
            raise SpecError(
                f"expert parallelism is not supported for {where}: {reason}",
                hint="set parallelism.expert_parallel_degree = 1 for this model",
            )
        found.append((f"{fqn}.{moe.experts}", experts))
    return found


def default_compile_fn(backend: str) -> CompileFn:
    def compile_region(module: Any, fqn: str, fullgraph: bool) -> Any:
        return torch.compile(module, backend=backend, fullgraph=fullgraph)

    return compile_region


_PLAN_HINT = "make the plan for this spec with `gbdoctor plan SPEC --emit-config json -o FILE`"


def check_plan_matches(strategy: Strategy, kinds: list[str], blocks: list[nn.Module]) -> None:
    """A plan is for one model: the same block kinds, and every module it leaves eager exists in
    the blocks of its kind. SpecError (exit 2) otherwise, instead of a scan that silently applies
    defaults to the kinds it does not know and reports "all clean" (issue #18)."""
    planned = dict(strategy.per_kind)
    if set(planned) != set(kinds):
        raise SpecError(
            f"plan {strategy.plan} does not match this model: the plan covers block kinds "
            f"{', '.join(sorted(planned)) or 'none'}, the model has {', '.join(sorted(set(kinds)))}",
            hint=_PLAN_HINT,
        )
    for kind, block in zip(kinds, blocks, strict=True):
        for name in planned[kind].eager:
            try:
                block.get_submodule(name)
            except AttributeError:
                raise SpecError(
                    f"plan {strategy.plan} leaves module {name!r} of the {kind} blocks eager, but "
                    "this model's blocks have no such module",
                    hint=_PLAN_HINT,
                ) from None


def generic_strategy(name: str) -> Strategy:
    """The generic preset ``name`` (``setup.compile.STRATEGIES``); a framework's own presets are
    objects the caller takes from its ``strategies``."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise SpecError(
            f"{name!r} is not a generic compile strategy",
            hint=f"pass one of {', '.join(STRATEGIES)}, or a Strategy (a framework's strategies)",
        ) from None


def apply_setup(
    model: nn.Module,
    spec: Spec,
    meshes: Any,
    *,
    strategy: Strategy | str,
    compile_fn: CompileFn | None = None,
    backend: str | None = None,
    fsdp: bool = True,
    lr: float = 8e-4,
    build_optimizer: bool | None = None,
) -> Setup:
    """Set ``model`` up in place in torchtitan's order and return what was installed where.

    ``build_optimizer``: None builds the optimizer unless the model is on meta (it could not
    step); simulation passes True because it materializes the model (as fakes) before stepping.
    """
    if isinstance(strategy, str):
        strategy = generic_strategy(strategy)
    if compile_fn is None:
        compile_fn = default_compile_fn(backend or spec.compile.backend)
    ac = spec.activation_checkpoint
    container = find_blocks(model, spec.gbdoctor.blocks or None)
    raw = container.items()
    hidden = hidden_size(model)
    moe_blocks = {fqn for fqn, _, block in raw if find_moe_layers(block, hidden)}
    hooks: list[InstalledHook] = []
    layout = (
        pipeline_layout(spec.parallelism, len(raw), spec.training.local_batch_size)
        if spec.parallelism.pp_enabled
        else None
    )
    stage_of = layout.stage_of_layer() if layout is not None else {}

    # 0. TP: torchtitan's plans (sequence-parallel norms, column/row-wise linears, MoE in/out).
    loss_parallel = False
    tensor_parallel = meshes is not None and getattr(meshes, "tp", None) is not None
    if tensor_parallel:
        tp = meshes.tp.size()
        uneven = check_divisible(model, tp)
        if uneven:
            raise SpecError(
                f"tensor_parallel_degree = {tp} does not divide {', '.join(uneven[:4])}",
                "pick a TP degree that divides the heads and hidden sizes",
            )
        loss_parallel = not spec.parallelism.disable_loss_parallel
        blocks = [(fqn, b) for fqn, _, b in raw]
        for fqn, kind, fn in apply_tp(model, blocks, meshes.tp, loss_parallel=loss_parallel):
            hooks.append(InstalledHook(module=fqn, kind=kind, installer=TP_INSTALLER, fn=fn))

    # 1. EP: dispatch/combine hooks on each MoE's expert store, experts sharded on dim 0.
    experts: dict[str, nn.Module] = {}
    if meshes is not None and meshes.ep is not None:
        if not moe_blocks:
            raise SpecError(
                f"expert_parallel_degree = {meshes.ep.size()} but the model has no MoE layer "
                "(a router plus stacked or repeated experts)",
                hint="set parallelism.expert_parallel_degree = 1 for this model",
            )
        for fqn, _, block in raw:
            stores = _expert_stores(fqn, block, hidden)
            for experts_fqn, kind, fn in apply_ep(stores, meshes.ep):
                hooks.append(InstalledHook(module=experts_fqn, kind=kind, installer="ep", fn=fn))
            if stores:
                experts[fqn] = stores[0][1]

    # 2. AC, with kind labels known before wrapping (plans are keyed by them). Under PP each
    # rank sets up its own stages, so torchtitan's every-Nth-layer counter counts the blocks of
    # the rank's stages, in stage order, not the whole model's.
    ac_index = ac_counter_index(layout, len(raw))
    wrapped_idx = {i for i in range(len(raw)) if ac_mod.is_wrapped(ac, ac_index[i])}
    kinds = []
    for i, (fqn, _, _) in enumerate(raw):
        label = BlockKind(
            base="moe" if fqn in moe_blocks else "dense",
            wrap=ac_mod.ac_label(ac) if i in wrapped_idx else "",
        )
        kinds.append(str(label))
    if strategy.plan is not None:
        check_plan_matches(strategy, kinds, [b for _, _, b in raw])
    recipes = [
        strategy.recipe_for(kind, fqn in moe_blocks) for kind, (fqn, _, _) in zip(kinds, raw)
    ]
    split = {
        fqn: (r.eager or default_eager(b)) for (fqn, _, b), r in zip(raw, recipes) if r.split_ac
    }
    wrapped = ac_mod.apply_ac(
        [(fqn, b) for fqn, _, b in raw], ac, split=split, tensor_parallel=tensor_parallel
    )

    # 3. Compile per block (after AC, before FSDP: FSDP's block hooks stay outside).
    slots: list[BlockSlot] = []
    for i, ((fqn, key, block), kind, recipe) in enumerate(zip(raw, kinds, recipes)):
        outer, ac_subs = wrapped[fqn]
        outer, regions, fg = apply_compile(
            outer,
            fqn,
            recipe,
            fqn in moe_blocks,
            compile_fn,
            dynamic_tokens=meshes is not None and meshes.ep is not None,
        )
        container.set(key, outer)
        slots.append(
            BlockSlot(
                fqn=fqn,
                key=key,
                block=block,
                outer=outer,
                is_moe=fqn in moe_blocks,
                kind=kind,
                ac_wrapped=ac_subs,
                regions=regions,
                fullgraph_regions=fg,
                stage=stage_of.get(i),
            )
        )

    # 4. FSDP2.
    if fsdp and meshes is not None:
        apply_fsdp(
            model,
            [(s.fqn, s.outer) for s in slots],
            experts,
            meshes,
            param_dtype=spec.training.mixed_precision_param,
            reduce_dtype=spec.training.mixed_precision_reduce,
            reshard_after_forward=spec.parallelism.fsdp_reshard_after_forward,
            pp_enabled=layout is not None,
        )

    # 5. Optimizer with the expert-bias pre-step hook.
    optimizer = None
    if build_optimizer is None:
        build_optimizer = not _on_meta(model)
    if build_optimizer and any(p.requires_grad for p in model.parameters()):
        # torchtitan's optimizer: fused AdamW where the device has the kernel (setup/optim.py).
        device_type = next(model.parameters()).device.type
        optimizer = build_adamw(model.parameters(), lr=lr, device_type=device_type)
        moes = load_balanced_moes(model)
        if moes:
            recomputed = [_recomputed(name, slots) for name, _ in moes]
            group = meshes.dp_group if meshes is not None else None
            fn = register_load_balancing(optimizer, moes, recomputed, group)
            hooks.append(
                InstalledHook(
                    module="optimizer", kind="optimizer_pre_step", installer="load-balancing", fn=fn
                )
            )
    return Setup(
        model=model,
        blocks=slots,
        optimizer=optimizer,
        strategy=strategy,
        meshes=meshes,
        hooks=hooks,
        fsdp=fsdp and meshes is not None,
        loss_parallel=loss_parallel,
        pipeline=layout,
    )


def ac_counter_index(layout: PipelineLayout | None, n_blocks: int) -> list[int]:
    """Block index -> the count torchtitan's layer-selective AC sees for it: its position among
    the blocks its rank sets up (the whole model without PP; the rank's stages, in stage
    order, with it)."""
    if layout is None:
        return list(range(n_blocks))
    index = list(range(n_blocks))
    for rank in range(layout.degree):
        layers = [layer for stage in layout.stages_of_rank(rank) for layer in stage.layers]
        for position, layer in enumerate(layers):
            index[layer] = position
    return index


def _on_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def _recomputed(moe_fqn: str, slots: list[BlockSlot]) -> bool:
    """Whether eager AC recomputes this MoE's forward (torchtitan halves its counts then)."""
    for slot in slots:
        if moe_fqn == slot.fqn or moe_fqn.startswith(slot.fqn + "."):
            rel = moe_fqn[len(slot.fqn) + 1 :]
            return any(
                sub == "" or rel == sub or rel.startswith(sub + ".") for sub in slot.ac_wrapped
            )
    return False


@contextlib.contextmanager
def recipe_context(flags: tuple[tuple[str, Any], ...], *, ac_enabled: bool) -> Iterator[None]:
    """Enter the strategy's Dynamo settings (restored on exit).

    torchtitan also disables Dynamo's LRU cache whenever AC is on (SAC + recompiles).
    """
    from gbdoctor.capture.settings import set_lru_cache as set_lru
    from gbdoctor.torch_compat import dynamo_config

    with dynamo_config().patch(**dict(flags)):
        if ac_enabled:
            set_lru(False)
        try:
            yield
        finally:
            if ac_enabled:
                set_lru(True)
