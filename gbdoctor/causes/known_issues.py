"""Upstream bugs that a setup hits, recognised by the error they raise.

A scan that reproduces a bug of PyTorch or torchtitan is right to fail: the training run would
fail the same way. What the user needs next is the upstream issue and the workaround, so each
entry names both. Only ``causes/`` reads message text; other stages ask :func:`known_issue`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class KnownIssue:
    """An upstream bug, the error text that identifies it, and what to do until it is fixed."""

    pattern: str
    """Regular expression searched in the one-line error."""
    summary: str
    link: str
    workaround: str
    overrides: tuple[str, ...] = ()
    """The workaround as ``--set`` overrides, when it is a config change: ``run`` retries a
    baseline that fails with the issue under them, and says so."""


KNOWN_ISSUES = (
    KnownIssue(
        pattern=r"profiler\._record_function_enter_new\S* invocation index \d+ encountered "
        r"during backward but not found in storage",
        summary=(
            "per-op selective AC replays a different number of FSDP record_function ops in the "
            "recompute than in the forward when FSDP all-gathers inside the checkpointed block "
            "(torchtitan's separate fully_shard of the experts under EP)"
        ),
        link="https://github.com/pytorch/torchtitan/issues/3427 "
        "(fix: https://github.com/pytorch/pytorch/pull/196862)",
        workaround='activation_checkpoint.mode = "full" (or selective_ac_option = a layer '
        "count) until the torch release with the fix",
        overrides=("activation_checkpoint.mode=full",),
    ),
)


def known_issue(error: str) -> KnownIssue | None:
    """The known upstream bug whose error ``error`` is, if any."""
    for issue in KNOWN_ISSUES:
        if re.search(issue.pattern, error):
            return issue
    return None


def known_issue_note(error: str) -> str:
    """`` - known upstream bug: ...`` to append to a line reporting ``error``; "" if unknown."""
    issue = known_issue(error)
    if issue is None:
        return ""
    return f" - known upstream bug ({issue.summary}): {issue.link}; workaround: {issue.workaround}"
