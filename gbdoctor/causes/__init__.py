"""Causes: the taxonomy, the installed torch's graph-break registry, reason parsing and the
classification rules. The only package that reads Dynamo's message text; no torch import.

``taxonomy`` (``GENERIC_CAUSES``, fixes, plan actions per cause) <- ``rules`` (``classify``) <-
``parse`` (reason text -> parts) and ``gb_registry`` (gb_type -> ``GBxxxx``). ``contributions``:
what a framework adds (its causes, precedents of fixes, upstream bugs) and the combined
:class:`Taxonomy` (the stages above read it from ``frameworks.registry.cause_taxonomy``).
"""

from gbdoctor.causes.contributions import (
    GENERIC_TAXONOMY,
    BlockerPrecedent,
    CauseKnowledge,
    Precedent,
    Taxonomy,
    combine,
)
from gbdoctor.causes.cudagraph_blockers import BLOCKER_EXPLANATIONS
from gbdoctor.causes.gb_registry import (
    RegistryEntry,
    gb_id_for,
    gb_id_from_text,
    is_torch_file,
    load_registry,
    registry,
    registry_path,
)
from gbdoctor.causes.hooks import NO_FRAMEWORK_HOOKS, FrameworkHooks
from gbdoctor.causes.known_issues import KnownIssue
from gbdoctor.causes.parse import (
    Reason,
    called_function,
    chain_reasons,
    is_frame_skip,
    parse_graph_break_log,
    parse_reason,
    parse_reasons,
    stable_text,
)
from gbdoctor.causes.renames import GB_RENAMES, GbRename, gb_type_in, renamed
from gbdoctor.causes.rules import RULE_ORDER, classify, recompile_cause
from gbdoctor.causes.taxonomy import (
    EFFORTS,
    GENERIC_CAUSES,
    OWNERS,
    PLAN_ACTIONS,
    Cause,
    flags_removing,
)
from gbdoctor.torch_compat import release_name, torch_release

__all__ = [
    "GENERIC_CAUSES",
    "GENERIC_TAXONOMY",
    "BlockerPrecedent",
    "CauseKnowledge",
    "Precedent",
    "Taxonomy",
    "combine",
    "NO_FRAMEWORK_HOOKS",
    "FrameworkHooks",
    "GB_RENAMES",
    "GbRename",
    "gb_type_in",
    "release_name",
    "renamed",
    "torch_release",
    "is_torch_file",
    "KnownIssue",
    "BLOCKER_EXPLANATIONS",
    "EFFORTS",
    "OWNERS",
    "PLAN_ACTIONS",
    "RULE_ORDER",
    "Cause",
    "Reason",
    "RegistryEntry",
    "called_function",
    "chain_reasons",
    "classify",
    "flags_removing",
    "gb_id_for",
    "gb_id_from_text",
    "is_frame_skip",
    "load_registry",
    "parse_graph_break_log",
    "parse_reason",
    "parse_reasons",
    "recompile_cause",
    "registry",
    "registry_path",
    "stable_text",
]
