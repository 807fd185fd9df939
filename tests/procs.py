"""Whether a process still runs, read from ``/proc`` (Linux): the tests that check no rank or child
outlives its job or session (tests/conftest.py, tests/setup/test_rank_pool.py,
tests/setup/test_faults.py)."""

from __future__ import annotations

from pathlib import Path


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie counts as ended)."""
    try:
        stat = Path("/proc", str(pid), "stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
