"""Which tests leave the inner loop: the ``slow`` tier from a measured run (issue 41).

``-m "not slow"`` is the contributor's inner loop. Tests marked ``slow`` by hand are the ones
that are slow by nature (multi-rank, inductor); many others spawn a CLI subprocess, run a real
scan on pooled ranks or compile a whole Hugging Face model, and cost seconds each without saying
so. This reads a ``python -m pytest -q --durations=0`` log, adds up each test's setup, call and
teardown, and writes the ids of those over ``--threshold`` seconds to ``tests/slow_tests.txt``;
``tests/conftest.py`` marks the tests listed there ``slow``. The full suite still runs every test.

    python -m pytest -q -m "not slow" --durations=0 > fast.log    # or the whole suite
    python -m tools.slow_tier fast.log --threshold 2

A log of the fast tier only adds to the list (the tests already listed stay: they were not run);
``--replace`` starts from nothing (use it with a log of the whole suite). A fixture's setup is
paid by the first test that uses it, so run the fast tier again after a change to the list: the
next user of that fixture may cross the threshold in turn. A listed id that no test has any
more is dropped with a message (a renamed or deleted test).

With ``--replace`` or ``--files-only`` (a log of the whole suite) it writes
``tests/file_seconds.txt``: each test file's measured seconds. Under pytest-xdist (the README's
``-n auto``) ``tests/conftest.py`` hands the workers whole files heaviest first from it, so that
no long file starts last and runs alone while the other workers are idle (longest-first
scheduling). ``--files-only`` leaves the slow list as it is.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIST = REPO / "tests" / "slow_tests.txt"
FILE_SECONDS = REPO / "tests" / "file_seconds.txt"
FILE_SECONDS_HEADER = """\
# Each test file's seconds (setup + call + teardown of its tests) in a measured run of the whole
# suite; tests/conftest.py schedules files heaviest first under pytest-xdist. Written by
# `python -m tools.slow_tier LOG --replace` or `--files-only` (docs/testing.md); edit by
# rerunning it, not by hand.
"""
HEADER = """\
# Tests the inner loop (`python -m pytest -m "not slow"`) leaves out because a measured run
# found them slower than the threshold; tests/conftest.py marks them `slow`. Written by
# `python -m tools.slow_tier LOG` (docs/testing.md); edit by rerunning it, not by hand.
"""
DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*?)\s*$")


def seconds_per_test(log: str) -> dict[str, float]:
    """Each test's setup + call + teardown seconds in a ``--durations`` report."""
    seconds: dict[str, float] = defaultdict(float)
    for line in log.splitlines():
        match = DURATION.match(line)
        if match:
            seconds[match.group(3)] += float(match.group(1))
    return dict(seconds)


def seconds_per_file(seconds: dict[str, float]) -> dict[str, float]:
    """The per-test seconds summed per test file (the part of the id before ``::``)."""
    per_file: dict[str, float] = defaultdict(float)
    for node, s in seconds.items():
        per_file[node.partition("::")[0]] += s
    return dict(per_file)


def read_file_seconds(path: Path = FILE_SECONDS) -> dict[str, float]:
    """``tests/file_seconds.txt`` as {file: seconds}; empty when there is none."""
    if not path.exists():
        return {}
    per_file = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, _, name = line.strip().partition(" ")
            per_file[name] = float(seconds)
    return per_file


def heaviest_files_first(nodeids: list[str], per_file: dict[str, float]) -> list[int]:
    """The indices of ``nodeids`` ordered by their file's seconds in ``per_file``, heaviest first,
    the order within a file kept: longest-first scheduling of whole files, so that no long file
    starts last and runs alone while the other workers are idle. A file ``per_file`` does not
    know (new since it was measured) counts as the median file."""
    if not per_file:
        return list(range(len(nodeids)))
    unknown = sorted(per_file.values())[len(per_file) // 2]
    weight = [per_file.get(node.partition("::")[0], unknown) for node in nodeids]
    return sorted(range(len(nodeids)), key=lambda i: (-weight[i], i))


def read_list(path: Path = LIST) -> set[str]:
    if not path.exists():
        return set()
    lines = (line.strip() for line in path.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


def collected_ids() -> set[str]:
    """Every test id the suite has now (``--collect-only``), to drop ids that went away."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    return {line.strip() for line in done.stdout.splitlines() if "::" in line}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="output of pytest -q --durations=0")
    parser.add_argument("--threshold", type=float, default=2.0, help="seconds (default 2)")
    parser.add_argument("--replace", action="store_true", help="start from an empty list")
    parser.add_argument(
        "--files-only",
        action="store_true",
        help="write only tests/file_seconds.txt (a whole-suite log; the slow list unchanged)",
    )
    args = parser.parse_args(argv)
    seconds = seconds_per_test(args.log.read_text())
    if not seconds:
        parser.error(f"{args.log}: no durations in it; run pytest with --durations=0")
    if args.files_only:
        _write_file_seconds(seconds)
        return 0
    kept = set() if args.replace else read_list()
    slow = kept | {node for node, s in seconds.items() if s > args.threshold}
    existing = collected_ids()
    gone = sorted(slow - existing)
    for node in gone:
        print(f"dropped (no such test now): {node}")
    slow -= set(gone)
    LIST.write_text(HEADER + "".join(f"{node}\n" for node in sorted(slow)))
    added = len(slow - kept)
    print(f"{LIST.relative_to(REPO)}: {len(slow)} tests ({added} added, {len(gone)} dropped)")
    if args.replace:  # only a whole-suite log measures every file
        _write_file_seconds(seconds)
    return 0


def _write_file_seconds(seconds: dict[str, float]) -> None:
    per_file = sorted(seconds_per_file(seconds).items(), key=lambda item: (-item[1], item[0]))
    rows = "".join(f"{s:.1f} {name}\n" for name, s in per_file)
    FILE_SECONDS.write_text(FILE_SECONDS_HEADER + rows)
    print(f"{FILE_SECONDS.relative_to(REPO)}: {len(per_file)} files")


if __name__ == "__main__":
    sys.exit(main())
