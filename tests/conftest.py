"""Shared test helpers: specs written on the fly, pointing at the repository's fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from procs import running
from repo_paths import EXTRA_INSTALL, FIXTURES, REPO, extra_installed

if str(REPO) not in sys.path:  # tools/ is a package of the repository, not of the install
    sys.path.insert(0, str(REPO))

from tools.slow_tier import heaviest_files_first, read_file_seconds  # noqa: E402
from tools.slow_tier import read_list as measured_slow_tests  # noqa: E402


def _usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def _threads_per_worker() -> None:
    """Under pytest-xdist, each worker and the ranks it spawns get the worker's share of the
    cores (``OMP_NUM_THREADS``, which ``setup.rank_main.rank_threads`` honours): with torch's
    default of every core per process, the workers' and ranks' idle OpenMP threads spin
    against the busy ones. A value the caller set wins; a serial run keeps torch's default."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return
    cores = _usable_cores()
    threads = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # imported before this file: the variable came too late for it
        sys.modules["torch"].set_num_threads(threads)


_threads_per_worker()

# The scan's recompile probe (about two eager steps and two block replays per block kind) runs
# only in the tests that check recompiles: they ask for it (``scan(..., recompiles=True)``,
# ``--recompile-probe``). Every other scan records that it ran without it. Spawned ranks and
# CLI subprocesses inherit this.
os.environ.setdefault("GBDOCTOR_RECOMPILE_PROBE", "0")

FRESH_RANKS_ENV = "GBDOCTOR_TEST_FRESH_RANKS"
"""Set to 1, every in-process multi-rank job of the session spawns its own ranks, as without
:func:`shared_rank_processes`: the paired "before" of benchmarks/results/suite_speed.md, and a
check that a test's result does not depend on the ranks it ran on."""


@pytest.fixture(scope="session", autouse=True)
def shared_rank_processes():
    """One set of spawned ranks per world size for the whole session (``setup.dist.shared_ranks``,
    what ``price`` does for its rounds): a test's multi-rank job runs on ranks that already
    imported torch and joined their group, each job from a fresh state (``capture.job_state``:
    Dynamo reset, configs and the environment as a fresh spawn would have them now). A job
    that fails kills its ranks and the next one spawns new ones. Tests of the spawn itself use
    ``RankPool`` directly or the CLI in a subprocess, which this does not reach; a test marked
    ``fresh_ranks`` spawns its own. At the end every pool is closed and none of its ranks may
    still run (checked by pid)."""
    from gbdoctor.setup import dist

    if os.environ.get(FRESH_RANKS_ENV) == "1":  # every job on fresh ranks: the suite as before
        yield
        return
    with dist.shared_ranks():
        yield
        # The pools' ranks at the session's end: closing them must leave none running.
        ranks = [pid for pool in (dist._shared_pools or {}).values() for pid in pool.pids()]
    left = [pid for pid in ranks if running(pid)]
    assert not left, f"the session's rank processes outlived their pools: {left}"


@pytest.fixture(autouse=True)
def _fresh_ranks_when_marked(request):
    if request.node.get_closest_marker("fresh_ranks") is None:
        yield
        return
    from gbdoctor.setup.dist import fresh_ranks

    with fresh_ranks():  # the session's pools stay open for the next test
        yield


WORKER_GIB = 4
"""Memory one pytest-xdist worker can hold at once: the worker (about 1.4 GiB with torch, Dynamo
and a model) plus the session's ranks of its pool (0.4-1.1 GiB each, two to four of them),
measured with ``ps`` during a run of the whole suite on 2 workers."""


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per usable core, but no more than the available memory holds at
    :data:`WORKER_GIB` each (each worker spawns its own ranks: 32 cores and 16 GiB must not
    start 32 of them)."""
    cores = _usable_cores()
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        available = next(line for line in meminfo if line.startswith("MemAvailable:"))
        available_kib = int(available.split()[1])
    except (OSError, StopIteration, ValueError):  # not Linux: the cores decide
        return cores
    return max(1, min(cores, available_kib // (WORKER_GIB * 1024 * 1024)))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` the tests listed in ``tests/slow_tests.txt`` (before ``-m`` selects), so
    ``-m "not slow"`` stays an inner loop; the full suite runs them all (docs/testing.md).

    Skip tests marked ``extra("NAME")`` when that extra is not installed, naming the install
    command; ``python -m pytest -m extra`` runs exactly them (stage 2 of ``.ci/run``)."""
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker's collection: the controller hands out whole files in this order
        # (``--dist loadfile --no-loadscope-reorder``, pyproject), so the longest go first.
        order = heaviest_files_first([item.nodeid for item in items], read_file_seconds())
        items[:] = [items[i] for i in order]
    slow = measured_slow_tests()  # tests/slow_tests.txt, written by tools/slow_tier.py
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
        for marker in item.iter_markers("extra"):
            (extra,) = marker.args
            if extra not in EXTRA_INSTALL:
                raise pytest.UsageError(f"{item.nodeid}: unknown extra {extra!r}")
            if not extra_installed(extra):
                reason = f"needs the {extra} extra: {EXTRA_INSTALL[extra]}"
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def custom_spec(tmp_path: Path):
    """Write a custom-factory spec for ``fixtures/models/<file>`` and return its path."""

    def make(factory: str, flavor: str, *, ac: str = "none", extra: str = "") -> Path:
        path = tmp_path / f"{flavor}.toml"
        path.write_text(
            f'[model]\nname = "custom"\nflavor = "{flavor}"\nfactory = "{FIXTURES / "models" / factory}:build"\n'
            f"[training]\nlocal_batch_size = 2\nseq_len = 16\n"
            f'[activation_checkpoint]\nmode = "{ac}"\n'
            f'[gbdoctor]\nstrategy = "titan-v0.2.0"\n{extra}'
        )
        return path

    return make
