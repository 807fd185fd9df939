"""Which block each Dynamo compile of a pipeline schedule's run belongs to, and the AOTAutograd
setting zero-bubble schedules trip over.

A schedule (``torch.distributed.pipelining``) calls each stage's blocks itself, microbatch by
microbatch, so a scan cannot wrap a block's call to learn which block compiled. The backend
does: every block's parameters reach it as graph inputs (Dynamo lifts them, as it inlines
``nn.Module``s), so a compile is attributed to the block that owns them; a compile with no block
parameters (the loss) gets the label it was made with. Graphs then run as ``aot_eager`` runs
them: AOTAutograd builds the forward and backward graphs as inductor's would (donated buffers
included, which is what breaks the split backward), without generating code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class StageCompile:
    """One Dynamo compile seen during a schedule run."""

    owner: str
    """The block (``layers.3``) whose parameters the graph takes, or the backend's label."""
    step: int
    """The schedule step it happened in (:attr:`StageCompiles.step` at the time)."""
    shapes: tuple[tuple[int, ...], ...]
    """Shapes of the graph's non-parameter tensor inputs (the microbatch's hidden states)."""
    logged: int
    """How many recompile log records existed when it happened (pairs it with its reason)."""


@dataclass
class StageCompiles:
    """Counts compiles per block; :meth:`backend` is what the blocks are compiled with."""

    owners: dict[int, str]
    """``id(parameter)`` -> the block that owns it."""
    step: int = 0
    compiles: list[StageCompile] = field(default_factory=list)
    log_size: Any = None
    """A callable returning the recompile watch's record count, so compiles pair with reasons."""

    def backend(self, label: str = "") -> Any:
        """A Dynamo backend recording each compile, then running ``aot_eager``. One object per
        label: Dynamo guards on the backend, so blocks must share one, as training's do."""
        from torch._dynamo.backends.debugging import aot_eager

        def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            owner, shapes = label, []
            for value in example_inputs:
                if not isinstance(value, torch.Tensor):
                    continue
                if id(value) in self.owners:
                    owner = self.owners[id(value)]
                else:
                    shapes.append(tuple(value.shape))
            logged = self.log_size() if self.log_size is not None else 0
            self.compiles.append(StageCompile(owner, self.step, tuple(shapes), logged))
            return aot_eager(gm, example_inputs)

        return backend

    def per_owner(self) -> dict[str, list[StageCompile]]:
        out: dict[str, list[StageCompile]] = {}
        for c in self.compiles:
            out.setdefault(c.owner, []).append(c)
        return out


@contextlib.contextmanager
def donated_buffers(enabled: bool) -> Iterator[None]:
    """AOTAutograd's ``donated_buffer`` (on by default): a backward graph compiled with donated
    buffers refuses ``retain_graph=True``, which the zero-bubble split backward (input
    gradients first, weights later) needs. Off is the workaround (pytorch#161904)."""
    from torch._functorch import config

    with config.patch(donated_buffer=enabled):
        yield
