"""Causes: the taxonomy, the installed torch's graph-break registry, reason parsing and the
classification rules. The only package that reads Dynamo's message text; no torch import.

``taxonomy`` (``CAUSES``, fixes, plan actions per cause) <- ``rules`` (``classify``) <-
``parse`` (reason text -> parts) and ``gb_registry`` (gb_type -> ``GBxxxx``).
"""

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
from gbdoctor.causes.known_issues import KNOWN_ISSUES, KnownIssue, known_issue, known_issue_note
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
    CAUSE_IDS,
    CAUSES,
    EFFORTS,
    OWNERS,
    PLAN_ACTIONS,
    Cause,
    explain_cause,
    flags_removing,
    plan_actions_for,
)
from gbdoctor.torch_compat import release_name, torch_release

__all__ = [
    "NO_FRAMEWORK_HOOKS",
    "FrameworkHooks",
    "GB_RENAMES",
    "GbRename",
    "gb_type_in",
    "release_name",
    "renamed",
    "torch_release",
    "KNOWN_ISSUES",
    "is_torch_file",
    "KnownIssue",
    "known_issue",
    "known_issue_note",
    "BLOCKER_EXPLANATIONS",
    "CAUSES",
    "CAUSE_IDS",
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
    "explain_cause",
    "flags_removing",
    "gb_id_for",
    "gb_id_from_text",
    "is_frame_skip",
    "load_registry",
    "parse_graph_break_log",
    "parse_reason",
    "parse_reasons",
    "plan_actions_for",
    "recompile_cause",
    "registry",
    "registry_path",
    "stable_text",
]
