"""Helpers shared by the bad-input corpus and the fault tests."""

from __future__ import annotations

import os
from pathlib import Path

FACTORIES = Path(__file__).resolve().parent / "factories.py"


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path("/proc", entry, "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry))
    return out


def shm_mapped(pid: int | str = "self") -> set[str]:
    """/dev/shm files a process has mapped (a named semaphore or shared memory it holds)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {line.split(None, 5)[-1] for line in maps.splitlines() if "/dev/shm/" in line}


def check_one_error_line(stderr: str, stdout: str, needles: tuple[str, ...]) -> str:
    """Exactly one ``Error:`` line holding every needle (so it was not wrapped), no traceback."""
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    following = stderr.split(errors[0], 1)[1].lstrip("\n").splitlines()
    assert not following or following[0].startswith("Hint:") or not following[0].strip(), stderr
    return errors[0]
