"""Upstream bugs that a setup hits, recognised by the error they raise (:class:`KnownIssue`).

A scan that reproduces a bug of PyTorch or of a training framework is right to fail: the
training run would fail the same way. What the user needs next is the upstream issue and the
workaround, so each entry names both. The framework whose setups hit a bug contributes it
(``contributions.CauseKnowledge``); other stages ask ``Taxonomy.known_issue``.
"""

from __future__ import annotations

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
