"""``setup.rank_pool.RankPool``: spawned ranks that run a series of jobs (``price``'s rounds) on a
real gloo group. Each job finds a fresh state; a failed job, or one past its deadline, kills
every rank and the next job gets new ones; all children are dead after close."""

from __future__ import annotations

import os
import sys

import pytest
from corpus.pool_jobs import (
    fail_on_rank1,
    hang,
    leave_state,
    report_stages,
    state_found,
    threads_used,
    uneven_block_runs_under_rank_local_fsdp,
    wait_in_a_collective_rank1_never_joins,
    working_directory,
)
from procs import running

from gbdoctor.errors import DeadlineError, SpecError
from gbdoctor.setup.dist import RankPool, fresh_ranks, run_ranks, shared_ranks
from gbdoctor.setup.rank_main import rank_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _pids_of_a_job() -> list[int]:
    """The pids of the ranks a 1-rank ``run_ranks`` job ran on."""
    return [
        r[0] for r in run_ranks(state_found, None, world_size=1, device_type="cpu", timeout_s=300)
    ]


@pytest.fixture(scope="module")
def two_ranks():
    """One 2-rank pool for the tests at the end of this file, which need ranks to run their jobs
    on, not new ones (the tests above check that each job on a pool finds a fresh state, and
    that a failed job leaves new ranks to the next): a test whose job kills the ranks leaves new
    ones to the next test. Each spawn costs two torch imports; these tests ran four, now two
    (the order below: the two that keep their ranks first). Closed at the end, its ranks dead."""
    with RankPool(world_size=2, device_type="cpu", timeout_s=300) as pool:
        yield pool
        last = pool.pids()  # the ranks of the last test; the tests check those they kill
    assert not any(running(p) for p in last)


def test_rank_threads_share_the_cores_and_omp_num_threads_caps_them(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [rank_threads(w) for w in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    for omp, expected in (("2", 2), ("16", 4), ("0", 4), ("two", 4)):
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
        assert rank_threads(2) == expected, omp


def test_a_spawned_rank_runs_on_the_threads_the_environment_allows(monkeypatch):
    """What a spawned rank really sets: its share of the usable cores, or the caller's
    ``OMP_NUM_THREADS`` when lower (pytest-xdist workers set 1: tests/conftest.py)."""
    cores = len(os.sched_getaffinity(0))

    def threads(omp: str | None) -> int:
        if omp is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)
        with fresh_ranks():
            (used,) = run_ranks(threads_used, None, world_size=1, device_type="cpu", timeout_s=300)
        return used

    assert threads(None) == cores
    assert threads("1") == 1


def test_jobs_share_the_ranks_from_a_fresh_state_and_a_failure_brings_new_ranks():
    with RankPool(world_size=2, device_type="cpu", timeout_s=300) as pool:
        left = pool.run(leave_state, None)
        # The probe sees what the first job changed (the check below can fail) ...
        assert all(
            env and not default and frames > 0 and graphs > 0
            for _, env, default, frames, graphs in left
        ), left
        found = pool.run(state_found, None)
        # ... and the next job, in the same processes, finds none of it.
        assert [f[0] for f in found] == [f[0] for f in left] == pool.pids()
        assert [f[1:] for f in found] == [(False, True, 0, 0)] * 2, found
        first = pool.pids()
        with pytest.raises(SpecError, match="rank 1: rank 1 refuses") as raised:
            pool.run(fail_on_rank1, None)
        assert raised.value.hint == "a hint"
        assert pool.pids() == [] and not any(running(p) for p in first)
        again = pool.run(state_found, None)
        assert not set(first) & {f[0] for f in again}
        assert [f[1:] for f in again] == [(False, True, 0, 0)] * 2
        last = pool.pids()
    assert not any(running(p) for p in last)


def test_a_job_runs_in_the_parents_working_directory_of_now(tmp_path, monkeypatch):
    """As on a fresh spawn: not the directory the ranks were spawned in, nor the one an earlier
    job's user code moved to (a test's ``monkeypatch.chdir`` on the session's ranks)."""
    first, second, moved = (tmp_path / name for name in ("first", "second", "moved"))
    for folder in (first, second, moved):
        folder.mkdir()
    with RankPool(world_size=1, device_type="cpu", timeout_s=300) as pool:
        monkeypatch.chdir(first)
        assert pool.run(working_directory, None) == [str(first)]
        monkeypatch.chdir(second)
        assert pool.run(working_directory, str(moved)) == [str(moved)]
        assert pool.run(working_directory, None) == [str(second)]


@pytest.mark.fresh_ranks
def test_run_ranks_inside_shared_ranks_reuses_one_pool_and_closes_it():
    with shared_ranks():
        first = _pids_of_a_job()
        with shared_ranks():  # nested: the outer scope's ranks
            assert _pids_of_a_job() == first
    assert not any(running(p) for p in first)
    assert _pids_of_a_job() != first


@pytest.mark.fresh_ranks
def test_fresh_ranks_spawns_per_job_inside_shared_ranks_and_keeps_the_pool():
    """What a job that needs a new process uses (``run``'s rounds, the ``fresh_ranks`` marker of
    tests/conftest.py): its own ranks, dead when it returns; the scope's pool stays for after."""

    with shared_ranks():
        pooled = _pids_of_a_job()
        with fresh_ranks():
            own = _pids_of_a_job()
        assert own != pooled and not any(running(p) for p in own)
        assert all(running(p) for p in pooled)
        assert _pids_of_a_job() == pooled
    assert not any(running(p) for p in pooled)


def test_rank_0_reports_its_stages_to_the_parent_while_the_job_runs(two_ranks):
    said: list[tuple[str, int, int]] = []
    pool = two_ranks
    answers = pool.run(report_stages, None, progress=lambda *message: said.append(message))
    # Progress messages are not answers: each rank's answer is its rank.
    assert answers == [0, 1]
    assert said == [("stage 1 on rank 0", 0, 2), ("stage 2 on rank 0", 1, 2)]
    # Without a receiver the messages are dropped, and the next job still answers.
    assert pool.run(report_stages, None) == [0, 1]


def test_ranks_that_run_blocks_a_different_number_of_times_under_rank_local_fsdp_do_not_wait(
    two_ranks,
):
    """The scan's capture phase (``capture.rank_local_fsdp`` + ``rank_local_collectives``): FSDP's
    collectives are served on the rank and gbdoctor's own all-reduces stay there, so uneven work
    finishes well within the bound (it waited forever before: rank 0 in an all-gather, rank 1 in
    a reduce-scatter), and real collectives pair up again after it."""
    two_ranks.run(state_found, None)  # the ranks' start, outside the bound below
    (losses0, same0), (losses1, same1) = two_ranks.run(
        uneven_block_runs_under_rank_local_fsdp, None, timeout_s=60
    )
    assert len(losses0) == 3 and len(losses1) == 1
    assert same0 and same1  # the real gathered weights, not this rank's shard repeated


def test_a_job_past_its_deadline_raises_and_leaves_no_rank(two_ranks):
    pool = two_ranks
    ranks = [r[0] for r in pool.run(state_found, None)]
    with pytest.raises(DeadlineError, match=r"rank\(s\) \[0, 1\] did not finish within 3 s"):
        pool.run(hang, None, timeout_s=3)
    assert pool.pids() == []
    assert not any(running(p) for p in ranks)


def test_a_rank_waiting_on_a_peer_in_a_collective_ends_at_the_deadline_naming_its_block(
    two_ranks,
):
    """The cross-rank wait a rank-divergent capture could fall into: bounded by the job's
    deadline, and the error names where each unfinished rank was (``report_stage``)."""
    import time

    pool = two_ranks
    ranks = [r[0] for r in pool.run(state_found, None)]
    start = time.monotonic()
    with pytest.raises(DeadlineError) as raised:
        pool.run(wait_in_a_collective_rank1_never_joins, None, timeout_s=5)
    assert time.monotonic() - start < 5 + 15  # the deadline, plus killing the ranks
    message = str(raised.value)
    assert "rank(s) [0, 1] did not finish within 5 s" in message
    assert "rank 0 at capturing layers.1" in message and "rank 1 at capturing layers.0" in message
    assert not any(running(p) for p in ranks)
