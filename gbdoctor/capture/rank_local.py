"""Per-rank capture work that never waits on another rank: FSDP held unsharded.

After the warm-up step (a real training step, in which every rank issues the same collectives),
each rank captures its block kinds, proves its dedupe candidates and probes recompiles on its
own. That work is not the same on every rank when ranks compile differently: a rank-0 print with
the layer index fails rank 0's guards in every layer, so rank 0 re-traces each layer (and a
failed proof stops a forward half-way) while rank 1 runs each layer once. Each block run went
through FSDP's hooks (an all-gather before the forward, a reduce-scatter after the backward), so
the ranks' collectives fell out of step and both ranks waited in them until the scan's deadline:
rank 0 in an all-gather of ``retrace_shared``, rank 1 in a reduce-scatter of ``prove_shared``.

:func:`held_unsharded` takes the FSDP collectives out of that phase: every rank all-gathers every
FSDP module's parameters once, in lock-step (every rank holds the same FSDP modules, in the same
order), and keeps them gathered, with gradient reduction off, until the phase ends. A block run
then issues no FSDP collective at all, and computes on the real gathered weights, so what Dynamo
sees is what it sees in training right after FSDP's pre-forward all-gather. The price: every
rank holds the full parameters of the model (not one block's) for the phase, which
``scan.memory_estimate`` does not count yet. Collectives of the model's own code (tensor
parallel, expert parallel) still cross ranks: ``setup.rank_protocol.capture_wait_s`` bounds them.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch.nn as nn

_held: weakref.WeakSet[nn.Module] = weakref.WeakSet()
"""FSDP modules held unsharded by :func:`held_unsharded`: a failed block run must not reshard
them (``block.reset_fsdp_state``), or the next run would all-gather on one rank only."""


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_held(module: nn.Module) -> bool:
    return module in _held


@contextlib.contextmanager
def held_unsharded(model: nn.Module) -> Iterator[int]:
    """Inside, ``model``'s FSDP modules stay unsharded and reduce no gradients, so running a
    block issues no FSDP collective. Yields how many FSDP modules are held (0: nothing to hold,
    e.g. no FSDP or a world of one rank). Entering is one collective step: call it at the same
    point on every rank."""
    modules = fsdp_modules(model)
    if not modules:
        yield 0
        return
    # Each module's own parameter group only (recurse=False): the order is model.modules()'s,
    # the same on every rank, so the all-gathers pair up.
    for module in modules:
        module.unshard()  # type: ignore[operator]
    resharding = {module: _reshards_after_forward(module) for module in modules}
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)  # type: ignore[operator]
        module.set_reshard_after_backward(False, recurse=False)  # type: ignore[operator]
        module.set_requires_gradient_sync(False, recurse=False)  # type: ignore[operator]
        _held.add(module)
    try:
        yield len(modules)
    finally:
        for module in modules:
            _held.discard(module)
            module.set_reshard_after_forward(resharding[module], recurse=False)  # type: ignore[operator]
            module.set_reshard_after_backward(True, recurse=False)  # type: ignore[operator]
            module.set_requires_gradient_sync(True, recurse=False)  # type: ignore[operator]
            with contextlib.suppress(Exception):
                module.reshard()  # type: ignore[operator]


def _reshards_after_forward(module: nn.Module) -> bool:
    """Whether ``module`` reshards after its forward (FSDP has no public getter): a group with a
    post-forward mesh reshards (to it)."""
    state = module._get_fsdp_state()  # type: ignore[operator]
    groups = getattr(state, "_fsdp_param_groups", None) or (
        [state._fsdp_param_group] if state._fsdp_param_group else []
    )
    return any(group.post_forward_mesh_info is not None for group in groups)
