"""What a framework adds to the cause taxonomy (:class:`CauseKnowledge`), and the whole taxonomy
that the generic one and every framework's additions make (:class:`Taxonomy`, :func:`combine`).

The generic taxonomy (``taxonomy``, ``cudagraph_blockers``) names no framework. A framework
contributes what only it knows: a cause its own library meets (DeepSpeed's ``zero-hook``), the
precedent of a generic fix (a setup that applies it: "torchtitan's order: compile, then FSDP"),
and upstream bugs its setups hit. The stages above ``frameworks/`` read the combined taxonomy
(``frameworks.registry.cause_taxonomy``); this package imports no framework.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gbdoctor.causes.cudagraph_blockers import BLOCKER_EXPLANATIONS
from gbdoctor.causes.known_issues import KnownIssue
from gbdoctor.causes.taxonomy import GENERIC_CAUSES, Cause
from gbdoctor.errors import SpecError
from gbdoctor.records import BlockerKind


@dataclass(frozen=True)
class Precedent:
    """A setup that applies a generic fix, said in the fix as `` (text)``: after ``after`` (a
    part of the fix that it holds once), or at its end."""

    cause: str
    fix: int
    """Which of the cause's fixes (0: the first, the one hints show)."""
    text: str
    after: str = ""


@dataclass(frozen=True)
class BlockerPrecedent:
    """A setup that applies the fix of a CUDA-graph blocker kind (see :class:`Precedent`)."""

    kind: BlockerKind
    text: str
    after: str = ""


@dataclass(frozen=True)
class CauseKnowledge:
    """One framework's additions to the taxonomy (``frameworks.interface.CauseContributor``)."""

    causes: tuple[Cause, ...] = ()
    """Causes that only this framework's setups meet (a new id, listed by ``gbdoctor causes``)."""
    precedents: tuple[Precedent, ...] = ()
    blocker_precedents: tuple[BlockerPrecedent, ...] = ()
    known_issues: tuple[KnownIssue, ...] = ()
    """Upstream bugs this framework's setups hit, recognised by their error."""


@dataclass(frozen=True)
class Taxonomy:
    """Every cause, CUDA-graph blocker and known upstream bug, with the frameworks' additions."""

    causes: Mapping[str, Cause]
    """Cause id -> cause: the generic ones in their order, then the frameworks'."""
    blockers: Mapping[BlockerKind, tuple[str, str]] = field(default_factory=dict)
    """Per blocker kind: (what it is, the fix)."""
    known_issues: tuple[KnownIssue, ...] = ()

    @property
    def cause_ids(self) -> tuple[str, ...]:
        return tuple(self.causes)

    def explain(self, cause_id: str) -> Cause:
        """The :class:`Cause` for ``cause_id``; :class:`SpecError` naming the valid ids otherwise."""
        try:
            return self.causes[cause_id]
        except KeyError:
            raise SpecError(
                f"unknown cause {cause_id!r}",
                hint=f"valid causes: {', '.join(self.causes)}",
            ) from None

    def plan_actions(self, cause_id: str) -> tuple[str, ...]:
        """The plan actions a cause allows, preferred first (``()`` if unknown)."""
        cause = self.causes.get(cause_id)
        return cause.plan_actions if cause is not None else ()

    def fix_hint(self, cause_id: str) -> str:
        """The first fix of a cause; ``""`` for an unknown cause id."""
        cause = self.causes.get(cause_id)
        return cause.fixes[0] if cause is not None and cause.fixes else ""

    def known_issue(self, error: str) -> KnownIssue | None:
        """The known upstream bug whose error ``error`` is, if any."""
        return next((i for i in self.known_issues if re.search(i.pattern, error)), None)

    def known_issue_note(self, error: str) -> str:
        """`` - known upstream bug: ...`` to append to a line reporting ``error``; "" if unknown."""
        issue = self.known_issue(error)
        if issue is None:
            return ""
        return (
            f" - known upstream bug ({issue.summary}): {issue.link}; workaround: {issue.workaround}"
        )


def combine(contributions: Iterable[CauseKnowledge]) -> Taxonomy:
    """The generic taxonomy with ``contributions`` added, in their order. A contribution that
    redefines a cause, or a precedent of a fix that does not exist, is a programming error of the
    framework (ValueError): the taxonomy is the JSON contract's vocabulary."""
    knowledge = tuple(contributions)
    causes = dict(GENERIC_CAUSES)
    for contribution in knowledge:
        for cause in contribution.causes:
            if cause.id in causes:
                raise ValueError(f"cause {cause.id!r} is defined twice")
            causes[cause.id] = cause
    blockers = dict(BLOCKER_EXPLANATIONS)
    for precedent in (p for c in knowledge for p in c.precedents):
        fixed = causes.get(precedent.cause)
        if fixed is None or not 0 <= precedent.fix < len(fixed.fixes):
            raise ValueError(f"precedent of no fix: {precedent.cause!r} fix {precedent.fix}")
        fixes = list(fixed.fixes)
        fixes[precedent.fix] = _said(fixes[precedent.fix], precedent.text, precedent.after)
        causes[fixed.id] = replace(fixed, fixes=tuple(fixes))
    for blocker in (p for c in knowledge for p in c.blocker_precedents):
        what, fix = blockers[blocker.kind]
        blockers[blocker.kind] = (what, _said(fix, blocker.text, blocker.after))
    issues = tuple(issue for c in knowledge for issue in c.known_issues)
    return Taxonomy(causes=causes, blockers=blockers, known_issues=issues)


def _said(fix: str, text: str, after: str) -> str:
    """``fix`` with `` (text)`` after ``after`` (at the end without it)."""
    if not after:
        return f"{fix} ({text})"
    if fix.count(after) != 1:
        raise ValueError(f"precedent {text!r}: {after!r} is not once in the fix {fix!r}")
    head, _, tail = fix.partition(after)
    return f"{head}{after} ({text}){tail}"


GENERIC_TAXONOMY = combine(())
"""The taxonomy without any framework's additions."""
