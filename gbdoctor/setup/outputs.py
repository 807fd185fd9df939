"""The training loss from whatever a model's forward returns.

Models gbdoctor did not write return many things: torchtitan's decoders return logits
``(batch, seq, vocab)``; a Hugging Face base model returns a ``ModelOutput`` holding
``last_hidden_state``; a causal-LM head returns one holding ``logits``; research code returns
tuples, dicts or a scalar loss. The contract (docs/specs.md, "Custom models"):

1. A dict or a ``ModelOutput``-like object is looked up by ``loss``, ``logits``,
   ``last_hidden_state``, in that order (the first present and not None); a tuple or list by its
   first tensor.
2. A 0-dim tensor is the model's own loss: used as it is (divided by the number of data shares,
   so that gradients summed over ranks equal world size 1's).
3. A tensor whose last dimension is the vocabulary and whose leading dimensions are the labels'
   is logits: token-summed cross entropy over the global token count, as torchtitan computes it.
4. Any other floating tensor (hidden states) gets the *surrogate* loss: the mean square of its
   values, averaged over the same global token count. It reaches every block, because each
   block's output feeds the next, so forward and backward of every block run as in training.
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "LossSource",
    "embedding_vocab",
    "loss_note",
    "loss_source",
    "output_tensor",
    "training_loss",
]


class LossSource(StrEnum):
    """Which loss a training step used (scan notes say it)."""

    LOSS = "loss"
    """The model returned its own scalar loss."""
    LOGITS = "logits"
    """Cross entropy over the returned logits."""
    HIDDEN = "hidden"
    """The surrogate: mean square of the returned hidden states."""


_FIELDS = ("loss", "logits", "last_hidden_state")


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)


def output_tensor(output: Any) -> torch.Tensor:
    """The one tensor of ``output`` the loss is computed from (contract steps 1, module doc)."""
    if isinstance(output, torch.Tensor):
        return output
    for name in _FIELDS:
        value = output.get(name) if isinstance(output, dict) else getattr(output, name, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(output, dict):
        values: Any = list(output.values())
    elif isinstance(output, (tuple, list)):
        values = output
    else:
        values = ()
    found = next(_tensors(values), None)
    if found is None:
        raise TypeError(
            f"the model returned {type(output).__name__} with no tensor in it; gbdoctor needs "
            "logits, hidden states or a loss (a tensor, a tuple/list, a dict or a ModelOutput)"
        )
    return found


def _source(tensor: torch.Tensor, labels: torch.Tensor, vocab: int | None) -> LossSource:
    if tensor.dim() == 0:
        return LossSource.LOSS
    if (
        tensor.dim() == labels.dim() + 1
        and tuple(tensor.shape[:-1]) == tuple(labels.shape)
        and (vocab is None or tensor.shape[-1] == vocab)
    ):
        return LossSource.LOGITS
    return LossSource.HIDDEN


def loss_source(output: Any, labels: torch.Tensor, vocab: int | None = None) -> LossSource:
    """Which loss ``training_loss`` computes for ``output`` (for the scan notes)."""
    return _source(output_tensor(output), labels, vocab)


def training_loss(
    output: Any, labels: torch.Tensor, data_shares: int, vocab: int | None = None
) -> tuple[torch.Tensor, LossSource]:
    """(this rank's loss, which one) for ``output``; ``data_shares``: how many ranks split the
    global batch. ``vocab`` (the token embedding's size) tells logits (last dim == vocab) from
    hidden states; without it, any tensor shaped like the labels plus one dim counts as logits."""
    tensor = output_tensor(output)
    source = _source(tensor, labels, vocab)
    tokens = labels.numel() * data_shares
    if source is LossSource.LOSS:
        return tensor.float() / data_shares, source
    if source is LossSource.LOGITS:
        loss_sum = F.cross_entropy(tensor.float().flatten(0, -2), labels.flatten(), reduction="sum")
        return loss_sum / tokens, source
    if not tensor.is_floating_point():
        raise TypeError(
            f"the model returned a {tensor.dtype} tensor of shape {tuple(tensor.shape)}; gbdoctor "
            "needs floating logits, hidden states or a loss to run backward"
        )
    per_token = tensor.float().square().reshape(-1, tensor.shape[-1]).mean(dim=-1)
    return per_token.sum() * (labels.numel() / per_token.numel()) / tokens, source


def embedding_vocab(model: torch.nn.Module) -> int | None:
    """``num_embeddings`` of the model's first ``nn.Embedding`` (the token vocabulary), if any."""
    return next(
        (m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)), None
    )


def loss_note(source: LossSource) -> str:
    """One line for the scan notes."""
    if source is LossSource.LOGITS:
        return "training loss: cross entropy over the model's logits"
    if source is LossSource.LOSS:
        return "training loss: the scalar loss the model returned"
    return (
        "training loss: the model returned hidden states, not logits, so the surrogate loss "
        "(mean square of the last hidden state) drives backward through every block"
    )
