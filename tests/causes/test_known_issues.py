"""Upstream bugs recognised by their error text, with the issue and the workaround."""

from __future__ import annotations

from gbdoctor.frameworks.registry import cause_taxonomy

# The torchtitan mirror contributes the bug (its setup shards the experts on their own).
TAXONOMY = cause_taxonomy()
known_issue, known_issue_note = TAXONOMY.known_issue, TAXONOMY.known_issue_note

# The line torch 2.13's selective checkpoint raises (torch/utils/checkpoint.py), as the warm-up
# note carries it after describe_error.
SAC_REPLAY = (
    "RuntimeError: profiler._record_function_enter_new.default invocation index 3 encountered "
    "during backward but not found in storage. This can happen if the operations in the "
    "checkpointed region are nondeterministic (raised inside PyTorch)"
)


def test_the_fsdp_ep_sac_replay_mismatch_names_its_upstream_issue_and_workaround():
    issue = known_issue(SAC_REPLAY)
    assert issue is not None and "pytorch/torchtitan/issues/3427" in issue.link
    note = known_issue_note(SAC_REPLAY)
    assert note.startswith(" - known upstream bug (") and 'mode = "full"' in note


def test_other_errors_are_not_claimed():
    # The same storage error on a model op is a nondeterministic model, not this bug.
    other = SAC_REPLAY.replace("profiler._record_function_enter_new", "aten.mm")
    assert known_issue(other) is None and known_issue_note(other) == ""
    assert all(issue.link.startswith("https://github.com/") for issue in TAXONOMY.known_issues)
