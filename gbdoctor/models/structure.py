"""What a model is made of, found by structure: its repeated blocks and its MoE layers.

gbdoctor scans models it did not write (a Hugging Face decoder built from a config, a research
model), so nothing here keys on a class name or on an attribute name:

- **Blocks.** The repeated transformer blocks are the entries of one ``nn.ModuleList`` /
  ``nn.ModuleDict`` somewhere in the tree (``layers``, ``model.layers``, ``transformer.h``,
  ``transformer.blocks``, ...). Among the containers whose entries are modules and which are
  not nested inside another such container's entries, the one whose repeated entries (modules
  of a class that occurs more than once; every entry of a one-entry container) hold the most
  parameters wins, then the longest, then the shallowest. A hybrid's interleaved mamba and
  attention blocks count together. ``[gbdoctor] blocks = "dotted.path"`` names it explicitly.
- **MoE layers.** A module is an MoE layer when it holds a *router* (a 2-D weight of shape
  ``(num_experts, hidden)``) and an *expert store* for that many experts: a container of
  ``num_experts`` same-class modules, a module whose weights are stacked 3-D tensors with a
  leading ``num_experts`` dimension (per-expert 2-D biases beside them, as in gpt-oss), or one
  whose same-shaped 2-D weights are ``num_experts`` expert matrices concatenated along dim 0
  (DBRX). The MoE layer is the smallest module holding both. When the model's hidden size is
  known, the router must take it as input.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TypeGuard

import torch.nn as nn

from ..errors import SpecError

# What holds blocks or experts. Typed as the container classes, not nn.Module: nn.Module's
# __getattr__ makes every missing attribute (__iter__, __len__) ``Tensor | Module`` to mypy.
Container = nn.ModuleList | nn.ModuleDict | nn.Sequential

_BLOCKS_HINT = (
    'set [gbdoctor] blocks = "dotted.path" to the ModuleList/ModuleDict of transformer blocks'
)


# --------------------------------------------------------------------------- blocks


@dataclass(frozen=True, slots=True)
class BlockContainer:
    """The model's container of repeated blocks."""

    path: str
    """Dotted path from the model root (``model.layers``; ``""`` if the root itself)."""
    container: Container
    """The ``nn.ModuleList`` or ``nn.ModuleDict`` (an ``nn.Sequential`` when named explicitly)."""

    def items(self) -> list[tuple[str, str, nn.Module]]:
        """(fqn, key, block) in container order: ``("model.layers.3", "3", block)``."""
        if isinstance(self.container, nn.ModuleDict):
            pairs = list(self.container.items())
        else:
            pairs = [(str(i), b) for i, b in enumerate(self.container)]
        prefix = f"{self.path}." if self.path else ""
        return [(f"{prefix}{key}", key, block) for key, block in pairs]

    def set(self, key: str, module: nn.Module) -> None:
        """Replace the block under ``key`` (wrappers: AC, compile)."""
        if isinstance(self.container, nn.ModuleDict):
            self.container[key] = module
        else:
            self.container[int(key)] = module


def _is_container(module: nn.Module) -> TypeGuard[nn.ModuleList | nn.ModuleDict]:
    # nn.Sequential is left out on purpose: it is often a model's whole pipeline (embedding,
    # blocks, head), not a list of blocks; ``[gbdoctor] blocks`` can still point at one.
    return isinstance(module, (nn.ModuleList, nn.ModuleDict)) and len(module) > 0


def _entries(container: Container) -> list[nn.Module]:
    return list(container.values()) if isinstance(container, nn.ModuleDict) else list(container)


def _repeated_params(container: Container) -> int:
    """Parameters in entries whose class occurs more than once (a hybrid's mamba and attention
    blocks both repeat; a list of distinct heads does not); all of them for a single entry."""
    entries = _entries(container)
    counts: dict[type, int] = {}
    for entry in entries:
        counts[type(entry)] = counts.get(type(entry), 0) + 1
    return sum(_n_params(e) for e in entries if counts[type(e)] > 1 or len(entries) == 1)


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_blocks(model: nn.Module, path: str | None = None) -> BlockContainer:
    """The model's block container: ``path`` when given, else found by structure (module doc)."""
    if path is not None and path.strip() != "":
        return _explicit_blocks(model, path.strip())
    candidates: list[tuple[str, Container]] = []
    for name, module in model.named_modules():
        if not _is_container(module) or not any(_n_params(e) for e in _entries(module)):
            continue
        if any(name.startswith(outer + ".") or (outer == "" and name) for outer, _ in candidates):
            continue  # nested in a container already found (experts inside a block); outermost wins
        candidates.append((name, module))
    if not candidates:
        plain = [
            f"{name}.{attr}" if name else attr
            for name, module in model.named_modules()
            for attr, value in vars(module).items()
            if isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, nn.Module) for v in value)
        ]
        found = f" ({plain[0]} is a plain Python list of modules)" if plain else ""
        hint = (
            "wrap the blocks in nn.ModuleList so that they are registered"
            if plain
            else _BLOCKS_HINT
        )
        raise SpecError(
            f"model {type(model).__name__} has no non-empty ModuleList/ModuleDict of blocks "
            f"with parameters{found}",
            hint=hint,
        )
    name, container = max(
        candidates, key=lambda c: (_repeated_params(c[1]), len(c[1]), -c[0].count("."))
    )
    return BlockContainer(path=name, container=container)


def _explicit_blocks(model: nn.Module, path: str) -> BlockContainer:
    try:
        module = model.get_submodule(path)
    except AttributeError:
        containers = [n for n, m in model.named_modules() if _is_container(m)]
        shown = ", ".join(containers[:6]) or "none"
        raise SpecError(
            f"[gbdoctor] blocks = {path!r}: the model has no module at that path",
            hint=f"ModuleList/ModuleDict paths in this model: {shown}",
        ) from None
    if not isinstance(module, (nn.ModuleList, nn.ModuleDict, nn.Sequential)) or len(module) == 0:
        raise SpecError(
            f"[gbdoctor] blocks = {path!r} is a {type(module).__name__}, not a non-empty "
            "ModuleList/ModuleDict/Sequential",
            hint=_BLOCKS_HINT,
        )
    return BlockContainer(path=path, container=module)


# --------------------------------------------------------------------------- MoE


@dataclass(frozen=True, slots=True)
class MoELayer:
    """One MoE layer found by structure; paths are relative to the module searched."""

    path: str
    """The smallest module holding the router and the experts (``mlp``, ``block_sparse_moe``)."""
    router: str
    """The module owning the router weight (``mlp.gate``)."""
    experts: str
    """The expert store (``mlp.experts``): what EP shards and what plans leave eager."""
    num_experts: int
    stacked: bool
    """Experts are stacked weight tensors (one module), not a container of expert modules."""


def _expert_count(module: nn.Module) -> tuple[int, bool] | None:
    """(experts, stacked) when ``module`` looks like an expert store, else None."""
    if _is_container(module):
        entries = _entries(module)
        if (
            len(entries) >= 2
            and len({type(e) for e in entries}) == 1
            and all(_n_params(e) for e in entries)
        ):
            return len(entries), False
        return None
    own = [p for _, p in module.named_parameters(recurse=False)]
    if not own:
        return None
    # Stacked weights (E, in, out), and per-expert biases (E, out) beside them (gpt-oss).
    if (
        any(p.dim() >= 3 for p in own)
        and all(p.dim() >= 2 for p in own)
        and len({p.shape[0] for p in own}) == 1
        and own[0].shape[0] >= 2
    ):
        return int(own[0].shape[0]), True
    return None


def _own_stacked(module: nn.Module) -> bool:
    return not _is_container(module) and bool(module._parameters)


def _flat_shape(module: nn.Module) -> tuple[int, int] | None:
    """The one shape of ``module``'s own weights when they are 2 or more same-shaped 2-D ones
    (what a flat expert store has, whatever its expert count), else None."""
    own = [p for _, p in module.named_parameters(recurse=False)]
    if len(own) < 2 or any(p.dim() != 2 for p in own) or len({tuple(p.shape) for p in own}) != 1:
        return None
    rows, cols = own[0].shape
    return int(rows), int(cols)


def _flat_expert_store(shape: tuple[int, int] | None, num_experts: int, hidden: int) -> bool:
    """Same-shaped 2-D weights ``(num_experts * d, hidden)``: experts concatenated on dim 0."""
    if shape is None:
        return False
    rows, cols = shape
    return rows % num_experts == 0 and rows > num_experts and cols == hidden


def _routers(block: nn.Module, hidden: int | None) -> list[tuple[str, int, int]]:
    """(module path, num_experts, input width) of every 2-D weight that could route tokens."""
    found = []
    for name, module in block.named_modules():
        weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if weight is None or weight.dim() != 2:
            continue
        experts, width = int(weight.shape[0]), int(weight.shape[1])
        if experts >= 2 and (hidden is None or width == hidden):
            found.append((name, experts, width))
    return found


def _ancestors(path: str) -> list[str]:
    """``a.b.c`` -> ``["a.b", "a", ""]`` (strict ancestors, innermost first)."""
    parts = path.split(".") if path else []
    return [".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]


def _inside(path: str, root: str) -> bool:
    return not root or path == root or path.startswith(root + ".")


def find_moe_layers(block: nn.Module, hidden: int | None = None) -> list[MoELayer]:
    """Every MoE layer inside ``block`` (the block itself may be one), outermost path order."""
    # Every 2-D weight with the hidden width is a router candidate (attention and MLP
    # projections too), each tried under every ancestor up to the root: read each module's
    # store shape once, and search only the modules that could be a store (a whole 48-layer
    # model has 700 modules and 400 candidates: 1.7 s a search when each try read them all).
    stores = [
        (name, module, count, flat)
        for name, module in block.named_modules()
        for count, flat in [(_expert_count(module), _flat_shape(module))]
        if count is not None or flat is not None
    ]
    layers: dict[str, MoELayer] = {}
    for router, num_experts, width in _routers(block, hidden):
        for parent in _ancestors(router):
            store = _store_under(stores, parent, router, num_experts, hidden or width)
            if store is not None:
                path, stacked = store
                if parent not in layers:
                    layers[parent] = MoELayer(
                        path=parent,
                        router=router,
                        experts=path,
                        num_experts=num_experts,
                        stacked=stacked,
                    )
                break
    return [layers[k] for k in sorted(layers, key=lambda p: (p.count("."), p))]


def _store_under(
    stores: list[tuple[str, nn.Module, tuple[int, bool] | None, tuple[int, int] | None]],
    parent: str,
    router: str,
    num_experts: int,
    hidden: int,
) -> tuple[str, bool] | None:
    """The shallowest expert store for ``num_experts`` experts in ``parent``'s subtree (``parent``
    included), outside the router's own subtree. ``stores``: (name, module, its
    ``_expert_count``, its ``_flat_shape``) of the modules that could be one, in module order."""
    best: tuple[str, bool] | None = None
    for name, module, count, flat in stores:
        if not _inside(name, parent) or _inside(name, router):
            continue
        if _inside(router, name) and not _own_stacked(module):
            continue  # a module holding the router is the store only through its own weights
        hit = (count is not None and count[0] == num_experts) or _flat_expert_store(
            flat, num_experts, hidden
        )
        if hit and (best is None or name.count(".") < best[0].count(".")):
            best = (name, count[1] if count is not None else True)
    return best


def is_moe(block: nn.Module, hidden: int | None = None) -> bool:
    return bool(find_moe_layers(block, hidden))


def expert_paths(block: nn.Module, hidden: int | None = None) -> tuple[str, ...]:
    """Expert stores inside ``block`` (relative paths), sorted: what plans leave eager."""
    return tuple(sorted(m.experts for m in find_moe_layers(block, hidden)))


def hidden_size(model: nn.Module) -> int | None:
    """Width of the token embedding (the residual stream), or None without an ``nn.Embedding``."""
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return module.embedding_dim
    return None


def ep_refusal(moe: MoELayer, experts: nn.Module) -> str | None:
    """Why gbdoctor's EP cannot dispatch for this MoE layer, or None if it can.

    gbdoctor's dispatch is torchtitan's: a pre-hook on the expert store receives the tokens
    sorted by expert plus the per-expert token counts, ``experts(tokens, num_tokens_per_expert)``,
    and the expert weights are stacked so that dim 0 can be sharded over the EP ranks.
    """
    if not moe.stacked:
        return (
            f"{moe.experts} is a container of {moe.num_experts} expert modules; gbdoctor's EP "
            "shards stacked expert weights (num_experts, ...) on dim 0"
        )
    try:
        params = [
            p
            for p in inspect.signature(experts.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    if len(params) != 2:
        return (
            f"{moe.experts}.forward takes {len(params)} positional argument(s); gbdoctor's EP "
            "dispatch calls experts(tokens_sorted_by_expert, num_tokens_per_expert)"
        )
    return None
