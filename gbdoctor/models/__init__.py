"""The model zoo: torchtitan v0.2.2-style llama3, llama4 and deepseek_v3, plus user factories.

Everything the rest of gbdoctor needs from a model goes through this module: building it (on any
device, ``meta`` included), its blocks (``block_container``), its vocabulary (``vocab_size``) and
what a flavor says about its structure before it is built (``model_facts``: heads, layers,
attention, experts; one reading of the flavor's args for every stage).
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType

import torch
from torch import nn

from ..errors import SpecError
from ..records import ModelFacts, ModelSpec
from . import deepseek_v3, llama3, llama4
from .custom import load_factory
from .moe import MoEArgs, grouped_mm_supported
from .structure import find_blocks, find_moe_layers

FAMILIES: tuple[str, ...] = ("custom", "deepseek_v3", "llama3", "llama4")

_BUILTIN: dict[str, ModuleType] = {"deepseek_v3": deepseek_v3, "llama3": llama3, "llama4": llama4}

__all__ = [
    "FAMILIES",
    "block_container",
    "build_model",
    "family_flavors",
    "find_blocks",
    "find_moe_layers",
    "flavor_args",
    "grouped_mm_supported",
    "load_factory",
    "model_facts",
    "num_experts",
    "vocab_size",
]


def _family(name: str) -> ModuleType | None:
    if name not in FAMILIES:
        raise SpecError(
            f"unknown model family {name!r}",
            hint=f"[model] name must be one of: {', '.join(FAMILIES)}",
        )
    return _BUILTIN.get(name)


def family_flavors(name: str) -> tuple[str, ...]:
    """Sorted flavor names of a family; ``()`` for ``custom`` (the factory decides)."""
    module = _family(name)
    return () if module is None else tuple(sorted(module.FLAVORS))


def flavor_args(name: str, flavor: str):
    """The frozen model-args dataclass of a built-in flavor (None for ``custom``)."""
    module = _family(name)
    if module is None:
        return None
    try:
        return module.FLAVORS[flavor]
    except KeyError:
        raise SpecError(
            f"unknown flavor {flavor!r} for model {name!r}",
            hint=f"[model] flavor must be one of: {', '.join(sorted(module.FLAVORS))}",
        ) from None


def model_facts(model: ModelSpec) -> ModelFacts:
    """What ``model``'s flavor says about its structure (:class:`~gbdoctor.records.ModelFacts`),
    the one reading of a flavor's args outside building it. Nothing is known (every field None)
    for a custom factory or a flavor this zoo does not have (the installed torchtitan names its
    own configs), rather than an error: the callers decide from what is known."""
    module = _BUILTIN.get(model.name)
    args = None if module is None else module.FLAVORS.get(model.flavor)
    if args is None:
        return ModelFacts()
    moe = getattr(args, "moe", None)
    if not isinstance(moe, MoEArgs):
        moe = None  # a dense flavor: no experts
    return ModelFacts(
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        attn_type=args.attn_type,
        num_experts=None if moe is None else moe.num_experts,
        top_k=None if moe is None else moe.top_k,
    )


def num_experts(name: str, flavor: str) -> int | None:
    """Routed experts per MoE layer, or None for dense flavors and custom models."""
    flavor_args(name, flavor)  # an unknown family or flavor is the spec's error, not "dense"
    return model_facts(ModelSpec(name=name, flavor=flavor)).num_experts


def build_model(
    spec: ModelSpec, *, device: torch.device | str = "cpu", max_seq_len: int | None = None
) -> nn.Module:
    """Build ``spec``'s model on ``device``; ``"meta"`` allocates nothing.

    Custom factories are called under ``torch.device(device)``. Built-in models are constructed on
    meta and materialised with ``to_empty(device)`` + ``init_weights()``.

    Initialisation is deterministic given the caller's ``torch.manual_seed``. ``max_seq_len`` (built-in
    families only) sizes the RoPE table, as torchtitan's ``update_from_config`` sets it from
    ``training.seq_len``; the flavor default is 4096. Longer inputs still run (the table is extended
    on the fly in ``forward``), so passing it is an optimisation, not a requirement.
    """
    module = _family(spec.name)
    if module is None:
        if not spec.factory:
            raise SpecError(
                "model name 'custom' needs a factory",
                hint="set [model] factory = 'path/to/file.py:build' or 'package.module:build'",
            )
        with torch.device(device):
            return load_factory(spec.factory, spec.flavor)
    args = flavor_args(spec.name, spec.flavor)
    if max_seq_len is not None:
        args = replace(args, max_seq_len=max_seq_len)
    moe = getattr(args, "moe", None)
    if isinstance(moe, MoEArgs) and moe.use_grouped_mm is None:
        args = replace(args, moe=replace(moe, use_grouped_mm=grouped_mm_supported(device)))
    # Construct on meta, then materialise and initialise once on the target device: skips the
    # default (discarded) nn.Linear init, and makes a direct build identical to torchtitan's
    # meta-build -> to_empty -> init_weights path under the same seed.
    with torch.device("meta"):
        model = module.build(args)
    if torch.device(device).type != "meta":
        model.to_empty(device=device)
        with torch.device(device):
            model.init_weights(buffer_device=device)
    return model


def vocab_size(model: nn.Module) -> int:
    """``num_embeddings`` of the first ``nn.Embedding`` in ``model`` (built-in or custom)."""
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            return m.num_embeddings
    raise SpecError(
        f"model {type(model).__name__} has no nn.Embedding",
        hint="gbdoctor feeds token ids; the model must start with an nn.Embedding",
    )


def block_container(model: nn.Module, path: str | None = None) -> list[tuple[str, nn.Module]]:
    """``[("layers.0", block), ...]`` in container order (ModuleDict keys or ModuleList indices),
    with the model's real FQNs (``model.layers.0`` for a Hugging Face decoder); the container is
    found by structure unless ``path`` names it (``models.structure.find_blocks``)."""
    return [(fqn, block) for fqn, _, block in find_blocks(model, path).items()]
