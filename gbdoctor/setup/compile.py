"""Per-block compile strategies: the recipe types, the generic presets, and applying them.

A strategy says, per block kind, which regions are compiled and with which ``fullgraph``:
``block`` compiles the (possibly AC-wrapped) block whole; ``children`` compiles the block's
children one by one and leaves the listed sub-modules (by default ``moe.experts``, which carries
the EP and FSDP hooks) eager; ``none`` compiles nothing. The Dynamo settings are part of the
recipe because they change what breaks (``capture_scalar_outputs`` turns EP's ``.tolist()`` from
a break into a captured scalar).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from gbdoctor.models.structure import expert_paths
from gbdoctor.records import CompileMode
from gbdoctor.setup.ac import unwrap_checkpoint

HEAD_FLAGS = (
    ("capture_scalar_outputs", True),
    ("skip_fwd_side_effects_in_bwd_under_checkpoint", True),
)
V022_FLAGS = (("capture_scalar_outputs", True),)


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockRecipe:
    """How one block kind is compiled and wrapped."""

    mode: str = CompileMode.BLOCK
    """A :class:`CompileMode`: ``none``, ``block`` or ``children``."""
    fullgraph: bool = True
    eager: tuple[str, ...] = ()
    """Sub-FQNs (relative to the block) left eager in ``children`` mode; empty means the
    strategy default (every MoE's expert store, found by structure)."""
    split_ac: bool = False
    """Wrap AC/SAC per child instead of around the whole block."""
    skip_parameterless: bool = True
    """``children`` mode: leave parameter-free leaf children (activations, dropout) eager.
    torchtitan v0.2.1-0.2.2 compiles every child but ``experts``, ``moe.reorderer`` included."""
    compile_kernels: bool = False
    """``children`` mode: also compile, as regions of their own, the kernel functions that an
    eager sub-module names in ``compiled_kernels`` (torchtitan v0.2.1-0.2.2 compiles the
    experts' grouped-mm function separately, ``mark_dynamic`` on its tokens under EP)."""
    compiled_forward: tuple[str, ...] = ()
    """``children`` mode: sub-FQNs among the eager ones whose own ``forward`` is compiled, while
    the hooks they carry (FSDP all-gather, EP dispatch/combine) keep running eagerly around it:
    the module is eager only as far as its hooks go, and its computation (the experts' grouped
    matmuls, most of an MoE block's FLOPs) is compiled like the rest of the block."""


def shown_flags(flags: Iterable[tuple[str, Any]]) -> tuple[tuple[str, str], ...]:
    """Dynamo settings as the reports' ``dynamo_config`` shows them: sorted, values as ``repr``."""
    return tuple(sorted((k, repr(v)) for k, v in flags))


@dataclass(frozen=True, kw_only=True, slots=True)
class Strategy:
    name: str
    dense: BlockRecipe
    moe: BlockRecipe
    flags: tuple[tuple[str, Any], ...] = ()
    summary: str = ""
    per_kind: tuple[tuple[str, BlockRecipe], ...] = field(default=())
    """Overrides by exact kind label (plans use these)."""
    plan: str | None = None
    """Identity of the plan file this strategy applies (``plan.json sha256:...``). When set,
    ``apply_setup`` refuses a model whose block kinds or modules do not match ``per_kind``."""

    def recipe_for(self, kind: str, is_moe: bool) -> BlockRecipe:
        for label, recipe in self.per_kind:
            if label == kind:
                return recipe
        return self.moe if is_moe else self.dense


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            name="none",
            dense=BlockRecipe(mode=CompileMode.NONE),
            moe=BlockRecipe(mode=CompileMode.NONE),
            summary="no compile (eager)",
        ),
        Strategy(
            name="block",
            dense=BlockRecipe(),
            moe=BlockRecipe(),
            flags=HEAD_FLAGS,
            summary="every block compiled whole with fullgraph=True",
        ),
        Strategy(
            name="block-nofullgraph",
            dense=BlockRecipe(fullgraph=False),
            moe=BlockRecipe(fullgraph=False),
            flags=V022_FLAGS,
            summary="every block compiled whole with fullgraph=False",
        ),
        Strategy(
            name="children",
            dense=BlockRecipe(mode=CompileMode.CHILDREN),
            moe=BlockRecipe(mode=CompileMode.CHILDREN),
            flags=V022_FLAGS,
            summary="every block's children compiled fullgraph, experts eager",
        ),
    )
}
"""The generic presets, which any framework set up by these building blocks may offer. A
framework's own presets (the releases it mirrors) are its ``strategies``, built from
:class:`Strategy` and :class:`BlockRecipe` behind the framework seam."""


def default_eager(block: nn.Module) -> tuple[str, ...]:
    """The block's expert stores (MoE recognised by structure, ``models.structure``): where EP
    and FSDP hook in, so ``children`` mode leaves them eager."""
    return expert_paths(block)


CompileFn = Callable[[Any, str, bool], Any]
"""(module or function, region fqn, fullgraph) -> the compiled stand-in (an OptimizedModule
for a module, a callable for a function)."""

KERNELS_ATTR = "compiled_kernels"
"""A module may name, in this attribute, the instance attributes holding the kernel functions
its ``forward`` calls (the built-in ``GroupedExperts``: ``run_grouped_mm``), so that a strategy
can compile them the way torchtitan compiles its module-level grouped-mm function."""


def compile_kernels(
    block: nn.Module,
    eager: tuple[str, ...],
    fullgraph: bool,
    compile_fn: CompileFn,
    region_prefix: str,
    *,
    dynamic_tokens: bool,
) -> list[str]:
    """Compile the kernel functions of the eager sub-modules; returns their region names
    (``moe.experts.run_grouped_mm``, relative to the block)."""
    regions = []
    for sub in eager:
        module = submodule_through_ac(block, sub)
        for attr in getattr(module, KERNELS_ATTR, ()):
            # Under EP the tokens an expert group receives change every step: torchtitan v0.2.2
            # marks them dynamic before calling its compiled grouped mm (w1, w2, w3, x, counts).
            regions.append(
                _compile_attribute(
                    module,
                    sub,
                    attr,
                    fullgraph,
                    compile_fn,
                    region_prefix,
                    tokens_arg=3 if dynamic_tokens else None,
                )
            )
    return regions


def compile_forwards(
    block: nn.Module,
    subs: tuple[str, ...],
    fullgraph: bool,
    compile_fn: CompileFn,
    region_prefix: str,
    *,
    dynamic_tokens: bool,
) -> list[str]:
    """Compile the own ``forward`` of each sub-module in ``subs``, as an instance attribute, so
    that ``nn.Module.__call__`` still runs the module's hooks eagerly before and after the
    compiled forward. Returns the regions (``moe.experts.forward``, relative to the block)."""
    stores = {id(block.get_submodule(path)) for path in expert_paths(block)}
    regions = []
    for sub in subs:
        module = submodule_through_ac(block, sub)
        # EP's dispatch hook hands the expert store a different number of tokens every step.
        dynamic = dynamic_tokens and id(module) in stores
        regions.append(
            _compile_attribute(
                module,
                sub,
                "forward",
                fullgraph,
                compile_fn,
                region_prefix,
                tokens_arg=0 if dynamic else None,
            )
        )
    return regions


def _compile_attribute(
    module: nn.Module,
    sub: str,
    attr: str,
    fullgraph: bool,
    compile_fn: CompileFn,
    region_prefix: str,
    *,
    tokens_arg: int | None,
) -> str:
    """Replace the callable ``module.<attr>`` by its compiled stand-in, a region of its own
    (``<region_prefix>.<sub>.<attr>``), with dimension 0 of positional argument ``tokens_arg``
    marked dynamic when given. Returns the region relative to the block (``<sub>.<attr>``)."""
    compiled = compile_fn(getattr(module, attr), f"{region_prefix}.{sub}.{attr}", fullgraph)
    if tokens_arg is not None:
        from gbdoctor.capture import tokens_dynamic

        compiled = tokens_dynamic(compiled, arg=tokens_arg)
    setattr(module, attr, compiled)
    return f"{sub}.{attr}"


def submodule_through_ac(block: nn.Module, path: str) -> nn.Module:
    """``block.get_submodule(path)``, looking through AC wrappers (split AC wraps children)."""
    module = unwrap_checkpoint(block)
    for part in path.split("."):
        module = unwrap_checkpoint(getattr(module, part))
    return module


def compile_children(
    parent: nn.Module,
    prefix: str,
    eager: tuple[str, ...],
    fullgraph: bool,
    compile_fn: CompileFn,
    region_prefix: str,
    skip_parameterless: bool = True,
) -> list[str]:
    """Compile every child of ``parent`` that contains no eager sub-module; recurse into those
    that do. Returns the compiled regions' FQNs (relative to the block)."""
    regions: list[str] = []
    for name, child in list(parent.named_children()):
        sub = f"{prefix}{name}"
        if sub in eager:
            continue
        if any(e.startswith(sub + ".") for e in eager):
            # An AC-wrapped child (split AC) is looked through: its own children get compiled
            # inside the checkpoint region, as torchtitan v0.2.2 does under full AC.
            regions += compile_children(
                unwrap_checkpoint(child),
                sub + ".",
                eager,
                fullgraph,
                compile_fn,
                region_prefix,
                skip_parameterless,
            )
            continue
        if (
            skip_parameterless
            and not any(True for _ in child.parameters())
            and not list(child.children())
        ):
            # Parameter-free leaves (activations, dropout) are not worth a compile boundary.
            continue
        setattr(parent, name, compile_fn(child, f"{region_prefix}.{sub}", fullgraph))
        regions.append(sub)
    return regions


def apply_compile(
    outer: nn.Module,
    block_fqn: str,
    recipe: BlockRecipe,
    is_moe: bool,
    compile_fn: CompileFn,
    *,
    dynamic_tokens: bool = False,
) -> tuple[nn.Module, tuple[str, ...], tuple[str, ...]]:
    """Compile one block per ``recipe``; returns (new outer module, regions, fullgraph regions).

    ``outer`` is the block as AC left it (maybe a CheckpointWrapper): ``block`` mode compiles
    that, as torchtitan does (compile after AC, before FSDP).
    """
    if recipe.mode == CompileMode.NONE:
        return outer, (), ()
    if recipe.mode == CompileMode.BLOCK:
        compiled = compile_fn(outer, block_fqn, recipe.fullgraph)
        regions: tuple[str, ...] = (block_fqn,)
        return compiled, regions, regions if recipe.fullgraph else ()
    if recipe.mode != CompileMode.CHILDREN:
        raise ValueError(f"unknown compile mode {recipe.mode!r}")
    inner = unwrap_checkpoint(outer)
    eager = recipe.eager or default_eager(inner)
    # A child that is itself a CheckpointWrapper (split AC) is compiled as compile(AC(child)),
    # the same order torchtitan uses for whole blocks.
    rel = compile_children(
        inner, "", eager, recipe.fullgraph, compile_fn, block_fqn, recipe.skip_parameterless
    )
    if recipe.compile_kernels:
        rel += compile_kernels(
            inner, eager, recipe.fullgraph, compile_fn, block_fqn, dynamic_tokens=dynamic_tokens
        )
    rel += compile_forwards(
        inner,
        recipe.compiled_forward,
        recipe.fullgraph,
        compile_fn,
        block_fqn,
        dynamic_tokens=dynamic_tokens,
    )
    regions = tuple(f"{block_fqn}.{r}" for r in rel)
    return outer, regions, regions if recipe.fullgraph else ()
