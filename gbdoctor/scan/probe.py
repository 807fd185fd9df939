"""The scan's recompile probe: run a captured block again where training would change its inputs.

A graph break is not the only way a compiled block loses time: a guard that fails on the next
step recompiles it, and after ``recompile_limit`` (8) compiles of a frame Dynamo runs it eagerly
for good. Which guards fail depends on what changes between steps, so after a block's capture
(step 0) the probe runs two more steps, each an eager training step of the whole model (so that
state the model sets in its own forward, FSDP and the EP hooks move on as in training) followed
by a replay of the block with the inputs it received in that step:

* new data in both: under EP another routing outcome, hence other split sizes;
* another sequence length where the model runs at it: step 1 at half the capture length, step 2
  at three quarters (variable-length batches: a short last batch, validation at another length,
  unpadded packing). If the model does not run at another length, the probe keeps the capture
  length and says so in the notes.

Dynamo's first recompile for a new size is expected (the size becomes dynamic: "automatic
dynamic shapes"), so a recompile in step 1 is recorded with ``measured=False``. A recompile in
step 2 means the block recompiles on every step (``measured=True``): that is what
``gate --recompiles`` fails on.

With a shape stream (``scan --shapes``, docs/shapes.md) the probe steps are instead the
stream's distinct ``(batch, seq)``, in the order they first appear (rank 0's), each probed once:
what each new shape does to the block. The first recompile on a tensor dim is the expected one
(``measured=False``); a second on the same dim (the size did not become dynamic: static
settings, a specialization) or a ``recompile_limit`` hit is ``measured=True``: the stream keeps
recompiling the block. The Dynamo state is the capture's (no reset in between), and the
capture session is paused, so the probe adds no graphs or breaks to the block's records.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gbdoctor.capture import (
    collect_block_inputs,
    describe_error,
    fresh_inputs,
    reset_fsdp_state,
    run_block,
    watch_recompiles,
)
from gbdoctor.capture.locate import portable_path
from gbdoctor.records import Recompile

PROBE_STEPS = (1, 2)
"""Step numbers of the probe (step 0 is the capture)."""
MIN_PROBE_SEQ = 8

BatchFn = Callable[[int, int, int | None], tuple[Any, Any]]
"""(step, seq len, batch or None for the capture's) -> (tokens, labels) of this rank for a
probe step."""
MAX_STREAM_PROBES = 32
"""Distinct stream shapes probed at most (each costs an eager step and a block replay)."""
_DIM = re.compile(r"tensor '(?P<name>.+)' (?:size|stride) mismatch at index (?P<dim>\d+)\.")
StepFn = Callable[[Any, Any, list[str]], None]
"""(tokens, labels, notes): the recipe's eager training step with the warm-up's fallbacks
(``warm_up.run_warm_up``); raises if none runs."""


def probe_seq_len(seq_len: int, step: int) -> int:
    """The sequence length of a probe step: 1/2 then 3/4 of the capture length, in multiples of 8
    (the capture length itself when the capture is too short to change)."""
    changed = (seq_len * (step + 1) // 4) // MIN_PROBE_SEQ * MIN_PROBE_SEQ
    return changed if MIN_PROBE_SEQ <= changed < seq_len else seq_len


class RecompileProbe:
    """Probe steps for one scan rank (see the module docstring), for any recipe: it needs the
    set-up model (``model``, ``optimizer``), the capture's sequence length, a batch maker and the
    recipe's eager step (with the warm-up's fallbacks)."""

    def __init__(
        self,
        setup: Any,
        seq_len: int,
        batch: BatchFn,
        step: StepFn,
        root: str | None = None,
        shapes: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.setup = setup
        self.seq_len = seq_len
        self.batch = batch
        self.step = step
        self.root = root
        self.shapes = shapes[:MAX_STREAM_PROBES]
        """A stream's distinct (batch, seq) in first-appearance order; empty: the synthetic
        lengths."""

    def run(self, slot: Any, notes: list[str]) -> tuple[Recompile, ...]:
        """Recompiles of ``slot``'s compiled regions over the probe steps (portable paths);
        what goes wrong is added to ``notes``."""
        path_fn = functools.partial(portable_path, root=self.root)
        steps = tuple(range(1, len(self.shapes) + 1)) if self.shapes else PROBE_STEPS
        with watch_recompiles(path_fn) as watch:
            for step in steps:
                inputs = self._step_inputs(slot, step, notes)
                if inputs is None:
                    break
                watch.tag(step=step, measured=step == PROBE_STEPS[-1])
                args, kwargs = fresh_inputs(inputs)
                try:
                    run_block(slot.outer, args, kwargs)
                except Exception as exc:  # noqa: BLE001 - a probe failure is a note, the capture stands
                    notes.append(
                        f"recompile probe step {step} of {slot.fqn} failed: "
                        f"{describe_error(exc, self.root)}"
                    )
                    reset_fsdp_state(self.setup.model)
                    break
                finally:
                    if self.setup.optimizer is not None:
                        self.setup.optimizer.zero_grad(set_to_none=True)
        return self._measured(tuple(watch.records)) if self.shapes else tuple(watch.records)

    @staticmethod
    def _measured(records: tuple[Recompile, ...]) -> tuple[Recompile, ...]:
        """A stream's recompiles: the first on a tensor dim is expected, a later one on the same
        dim, or a limit hit, is the stream recompiling the block (module docstring)."""
        seen: set[tuple[str, str]] = set()
        out = []
        for rec in records:
            found = _DIM.match(rec.reason.strip())
            subject = (rec.function, f"{found['name']}[{found['dim']}]" if found else rec.reason)
            out.append(replace(rec, measured=rec.limit_hit or subject in seen))
            seen.add(subject)
        return tuple(out)

    def _step_inputs(self, slot: Any, step: int, notes: list[str]) -> Any:
        """One eager training step at the probe's shape; the block's inputs in it (None if none)."""
        seq = self.seq_len
        rows: int | None = None
        lengths: tuple[int, ...] = (probe_seq_len(seq, step), seq)
        if self.shapes:
            rows, wanted = self.shapes[step - 1]
            lengths = (wanted,)
        for length in dict.fromkeys(lengths):
            tokens, labels = self.batch(step, length, rows)
            store, remove = collect_block_inputs(self.setup.model, {slot.fqn: slot.outer})
            try:
                # Eager, with the warm-up's fallbacks: notes that repeat the warm-up's are
                # deduplicated by the caller.
                self.step(tokens, labels, notes)
            except Exception as exc:  # noqa: BLE001 - try the capture length next
                reset_fsdp_state(self.setup.model)
                if length == lengths[-1]:
                    notes.append(
                        "recompile probe: the model does not run a step "
                        f"({describe_error(exc, self.root)})"
                    )
                    return None
                notes.append(
                    f"recompile probe: the model does not run at seq len {length} "
                    f"({describe_error(exc, self.root)}); probed at the capture length {seq} "
                    "with new data"
                )
                continue
            finally:
                remove()
            return store.get(slot.fqn)
        return None
