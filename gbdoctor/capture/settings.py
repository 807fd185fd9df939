"""Process-wide Dynamo settings a training setup changes that have no public switch."""

from __future__ import annotations


def set_lru_cache(enabled: bool) -> None:
    """Turn Dynamo's LRU ordering of a frame's compiled entries on or off (torchtitan turns it off
    while AC is on: SAC + recompiles). No public API: ``torch._C._dynamo.eval_frame``."""
    import torch

    torch._C._dynamo.eval_frame._set_lru_cache(enabled)  # type: ignore[attr-defined]  # not in torch's stubs
