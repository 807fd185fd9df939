"""The eager warm-up of a scan rank: one training step before the captures (FSDP's lazy init,
the load-balancing hook, and the real arguments every block receives), with weaker fallbacks
when the step fails under the setup, and the error that names why when none runs."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from gbdoctor.capture import describe_error, eager_stance, reset_fsdp_state
from gbdoctor.errors import SetupError
from gbdoctor.frameworks import Framework
from gbdoctor.frameworks.registry import cause_taxonomy
from gbdoctor.setup.apply import Setup
from gbdoctor.setup.train import forward_loss

WarmUp = list[tuple[str, Callable[[], None]]]
"""(name, step) pairs, strongest first: the first that runs is the warm-up."""


_NO_CPU_KERNEL = "with arguments from the 'CPU' backend"
_BF16_FAILURE = re.compile(
    r"BFloat16|bfloat16|same dtype|expected scalar type|dtype mismatch", re.IGNORECASE
)


def warm_up_attempts(
    recipe: Framework, setup: Setup, tokens: torch.Tensor, labels: torch.Tensor
) -> WarmUp:
    """The recipe's training step, then forward-only fallbacks."""

    def full_step() -> None:
        recipe.train_step(setup, tokens, labels)

    from gbdoctor.setup.context_parallel import attention_dispatch
    from gbdoctor.setup.train import loss_context

    # Under CP the failed step's context left the batch sharded (torchtitan's no-restore
    # buffers): the fallbacks need only SDPA's dispatch to ring attention.
    def forward_only() -> None:
        with attention_dispatch(setup), loss_context(setup):
            forward_loss(setup.model, tokens, labels, 1)

    def forward_no_grad() -> None:
        with torch.no_grad(), attention_dispatch(setup), loss_context(setup):
            forward_loss(setup.model, tokens, labels, 1)

    if setup.own_pipeline:
        # The framework's schedule runs the rank's stages; a forward of "the model" has no
        # meaning there (each stage needs the previous one's output).
        return [("the eager training step", full_step)]
    return [
        ("the eager training step", full_step),
        ("an eager forward", forward_only),
        ("an eager forward under no_grad", forward_no_grad),
    ]


def run_warm_up(setup: Any, attempts: WarmUp, notes: list[str]) -> None:
    """One eager training step: FSDP lazy init, the load-balancing hook, the blocks' real inputs.

    If the eager step fails (e.g. eager SAC around an FSDP-managed module fails in backward),
    that is a note, and the inputs come from the next, weaker attempt (a forward with autograd,
    else under no_grad); the per-block captures then show which blocks fail and why.
    """
    failures = []
    for name, attempt in attempts:
        try:
            with eager_stance():
                attempt()
        except Exception as exc:  # noqa: BLE001 - reported, then the next, weaker warm-up
            error = describe_error(exc)
            note = cause_taxonomy().known_issue_note(error)
            failures.append(f"{name} fails under this setup ({error}){note}")
            reset_fsdp_state(setup.model)
            if setup.optimizer is not None:
                setup.optimizer.zero_grad(set_to_none=True)
            continue
        if failures:
            notes.append("; ".join(failures) + f"; blocks were captured after {name}")
        return
    hint = "fix the model or the setup first (run `gbdoctor --debug ...` for the traceback)"
    issue = cause_taxonomy().known_issue(failures[-1])
    if issue is not None:
        hint = f"a known upstream bug ({issue.link}); {issue.workaround}"
    if any(_NO_CPU_KERNEL in f for f in failures):
        # e.g. a flash/varlen attention op: only CUDA kernels are registered for it.
        hint = (
            "an op of this model has no CPU kernel (CUDA only): scan on a GPU machine, or "
            "choose a configuration with a CPU path (e.g. another attention backend)"
        )
    if any(_BF16_FAILURE.search(f) for f in failures):
        # FSDP's MixedPrecisionPolicy casts parameters to bfloat16 (torchtitan's default
        # mixed_precision_param); code that builds fp32 tensors next to them then fails.
        hint = (
            "the parameters run in bfloat16 under FSDP's mixed_precision_param; retry with "
            "--set training.mixed_precision_param=float32"
        )
    raise SetupError(f"the model does not run eagerly under this setup: {failures[-1]}", hint=hint)
