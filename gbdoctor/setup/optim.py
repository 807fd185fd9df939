"""The optimizer torchtitan builds: AdamW with its fused kernel where the device has one.

torchtitan v0.2.x's ``build_optimizers`` passes ``fused=True`` for its default
``[optimizer] implementation = "fused"`` and ``foreach=True`` for ``"foreach"``. The fused kernel
updates every parameter in one launch per dtype/device group, which keeps the optimizer from
hiding the blocks in a step; it exists for CUDA and, since torch 2.4, CPU (DTensor parameters
included). Where the device has none, the multi-tensor ``foreach`` path is the next best.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def adamw_implementation(device_type: str) -> str:
    """``fused`` where torch has a fused AdamW kernel for ``device_type``, else ``foreach``."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return "fused" if device_type in _get_fused_kernels_supported_devices() else "foreach"


def build_adamw(
    params: Iterable[torch.nn.Parameter],
    *,
    lr: float,
    device_type: str,
    weight_decay: float = 0.1,
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW as torchtitan builds it (betas 0.9/0.95, its default weight decay), fused or foreach."""
    impl = adamw_implementation(device_type)
    kwargs: dict[str, Any] = {"fused": True} if impl == "fused" else {"foreach": True}
    return torch.optim.AdamW(
        list(params), lr=lr, betas=(0.9, 0.95), eps=eps, weight_decay=weight_decay, **kwargs
    )
