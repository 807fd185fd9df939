"""The inner loop's tier list (``tests/slow_tests.txt``, written by ``tools/slow_tier.py``)."""

from __future__ import annotations

import re

from repo_paths import REPO

from tools.slow_tier import (  # tests/conftest.py: REPO on sys.path
    FILE_SECONDS,
    LIST,
    heaviest_files_first,
    read_file_seconds,
    read_list,
    seconds_per_file,
    seconds_per_test,
)

LOG = """\
============================= slowest durations ==============================
12.50s setup    tests/a/test_x.py::test_pool[2-ranks]
3.25s call     tests/a/test_x.py::test_pool[2-ranks]
0.40s call     tests/a/test_x.py::test_quick
1.00s teardown tests/b/test_y.py::test_spaced[a b\\n-c]
(20 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def test_a_tests_seconds_are_its_setup_call_and_teardown():
    assert seconds_per_test(LOG) == {
        "tests/a/test_x.py::test_pool[2-ranks]": 15.75,
        "tests/a/test_x.py::test_quick": 0.4,
        "tests/b/test_y.py::test_spaced[a b\\n-c]": 1.0,
    }


def test_every_listed_test_exists():
    """A renamed or moved test would silently rejoin the inner loop: its id must still be a
    test function in its file (rerun ``python -m tools.slow_tier`` after a move)."""
    listed = read_list(LIST)
    assert listed, f"{LIST} lists no test"
    missing = []
    for node in sorted(listed):
        path, _, name = node.partition("::")
        function = name.split("::")[-1].split("[")[0]
        source = REPO / path
        if not source.exists() or not re.search(
            rf"^\s*(async )?def {re.escape(function)}\(", source.read_text(), re.M
        ):
            missing.append(node)
    assert not missing, f"listed in {LIST.name} but not a test now: {missing[:5]}"


def test_files_are_handed_out_heaviest_first_keeping_their_tests_order():
    per_file = seconds_per_file(seconds_per_test(LOG))
    assert per_file == {"tests/a/test_x.py": 16.15, "tests/b/test_y.py": 1.0}
    nodeids = [
        "tests/b/test_y.py::test_one",
        "tests/new/test_z.py::test_new",  # not measured yet: the median file (16.15 of 2)
        "tests/a/test_x.py::test_quick",
        "tests/b/test_y.py::test_two",
        "tests/a/test_x.py::test_pool[2-ranks]",
    ]
    order = [nodeids[i] for i in heaviest_files_first(nodeids, per_file)]
    assert order == [
        "tests/new/test_z.py::test_new",
        "tests/a/test_x.py::test_quick",
        "tests/a/test_x.py::test_pool[2-ranks]",
        "tests/b/test_y.py::test_one",
        "tests/b/test_y.py::test_two",
    ]
    assert heaviest_files_first(nodeids, {}) == list(range(len(nodeids)))


def test_the_file_seconds_name_test_files():
    per_file = read_file_seconds(FILE_SECONDS)
    assert per_file, f"{FILE_SECONDS} lists no file"
    assert all(name.startswith("tests/") and name.endswith(".py") for name in per_file)
