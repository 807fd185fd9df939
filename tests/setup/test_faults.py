"""Faults of multi-rank jobs, through the real CLI in a subprocess: signals to the main process
and to its process group, kill -9 of a rank and of the main process, a rank that hangs or ends
early. Each must exit with the documented code within its deadline, say what happened in one
line, and leave no process and no /dev/shm file behind. Plus: the rendezvous listens on
loopback only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cli_runs import interruptible
from corpus.harness import (
    FACTORIES,
    check_one_error_line,
    children_of,
    shm_mapped,
)
from corpus.probe import listening
from procs import running
from repo_paths import REPO

from gbdoctor.setup.dist import run_ranks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

STARTUP_S = 240
"""How long two ranks may take to import torch and reach the model build on a loaded machine."""


class Job:
    """A ``gbdoctor scan`` of a 2-rank custom spec in its own session, with every descendant
    process and every /dev/shm file they map recorded while it runs."""

    def __init__(self, tmp: Path, flavor: str, timeout_s: float = 120) -> None:
        spec = tmp / "fault.toml"
        spec.write_text(
            f'[model]\nname = "custom"\nflavor = "{flavor}"\nfactory = "{FACTORIES.as_posix()}:build"\n'
            f"[training]\nlocal_batch_size = 2\nseq_len = 16\n[parallelism]\ndata_parallel_shard_degree = 2\n"
            f'[gbdoctor]\nstrategy = "titan-v0.2.0"\ntimeout_s = {timeout_s}\n'
        )
        self.tmp = tmp
        env = {**os.environ, "PYTHONPATH": str(REPO), "GBDOCTOR_FAULT_DIR": str(tmp)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gbdoctor", "scan", str(spec)],
            cwd=tmp,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=interruptible,
        )
        self.pids: set[int] = set()
        self.shm: set[str] = set()
        self.first_child_at: float | None = None
        """When the first child (resource tracker or rank) was seen: the job's clock starts about then."""
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._sample, daemon=True)
        self._watch.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            frontier = [self.proc.pid]
            while frontier:
                pid = frontier.pop()
                if pid not in self.pids:
                    self.pids.add(pid)
                    if pid != self.proc.pid and self.first_child_at is None:
                        self.first_child_at = time.monotonic()
                    self.shm |= shm_mapped(pid)
                frontier += children_of(pid)
            time.sleep(0.1)

    def wait_ready(self) -> dict[int, int]:
        """Rank -> pid once every rank is inside the model's build and the sampler has recorded
        both ranks (so ``assert_clean`` knows them). Conditions, not delays: on a loaded machine
        a fixed grace for the sampler was too short and the signal tests failed."""
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            ranks = self._ready_ranks()
            if ranks and set(ranks.values()) <= self.pids:
                return ranks
            assert self.proc.poll() is None, self.proc.communicate()
            time.sleep(0.1)  # polling interval, not a synchronisation
        self._fail(f"ranks did not start within {STARTUP_S} s")

    def _ready_ranks(self) -> dict[int, int] | None:
        ready = {r: self.tmp / f"rank{r}.ready" for r in (0, 1)}
        try:
            return {r: int(p.read_text()) for r, p in ready.items()}
        except (OSError, ValueError):  # not written yet, or caught mid-write
            return None

    def finish(self, within_s: float) -> tuple[int, str, str, float]:
        start = time.monotonic()
        try:
            out, err = self.proc.communicate(timeout=within_s)
        except subprocess.TimeoutExpired:
            self._fail(f"gbdoctor did not exit within {within_s} s")
        return self.proc.returncode, out, err, time.monotonic() - start

    def _fail(self, what: str) -> None:
        """Kill the job and fail with what it printed (a red run must say why)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        out, err = self.proc.communicate()
        pytest.fail(f"{what}; load {os.getloadavg()}\n--- stderr ---\n{err}\n--- stdout ---\n{out}")

    def assert_clean(self, within_s: float = 15) -> None:
        """No process of the job is left (ranks, resource tracker) and no /dev/shm file it mapped."""
        deadline = time.monotonic() + within_s
        alive = self.pids
        while time.monotonic() < deadline:
            alive = {p for p in self.pids if running(p)}
            if not alive:
                break
            time.sleep(0.2)
        self._stop.set()
        for pid in alive:  # clean up before failing
            os.kill(pid, signal.SIGKILL)
        assert not alive, f"processes left behind: {sorted(alive)}"
        assert len(self.pids) >= 3, "the sampler never saw the ranks"
        left = {f for f in self.shm if os.path.exists(f)}
        assert not left, f"/dev/shm files left behind: {left}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, group, code, line",
    [
        (signal.SIGINT, False, 130, "Interrupted."),
        (signal.SIGINT, True, 130, "Interrupted."),
        (signal.SIGTERM, False, 143, "Terminated."),
        (signal.SIGTERM, True, 143, "Terminated."),
    ],
    ids=["sigint-main", "sigint-group", "sigterm-main", "sigterm-group"],
)
def test_signal_stops_every_rank(tmp_path, sig, group, code, line) -> None:
    job = Job(tmp_path, "sleep")
    job.wait_ready()
    if group:
        os.killpg(job.proc.pid, sig)
    else:
        job.proc.send_signal(sig)
    rc, _out, err, _ = job.finish(within_s=20)
    assert rc == code, err
    assert line in err.splitlines() and "Traceback" not in err, err
    job.assert_clean()


@pytest.mark.slow
def test_kill_9_of_the_main_process_takes_the_ranks_down(tmp_path) -> None:
    job = Job(tmp_path, "sleep")
    ranks = job.wait_ready()
    job.proc.kill()
    job.finish(within_s=10)
    job.assert_clean(within_s=10)
    assert not any(running(pid) for pid in ranks.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    "flavor, needles, deadline_s",
    [
        (
            "osexit1-rank1",
            ("rank 1: user code called os._exit(1) at", "factories.py:", "(in _misbehave)"),
            30,
        ),
        ("native-exit0-rank1", ("rank 1 exited with code 0 before reporting a result",), 30),
    ],
    ids=["rank-os-exit", "rank-native-exit"],
)
def test_a_failing_rank_is_named(tmp_path, flavor, needles, deadline_s) -> None:
    job = Job(tmp_path, flavor)
    job.wait_ready()
    rc, out, err, _ = job.finish(within_s=deadline_s)
    assert rc == 3, err
    check_one_error_line(err, out, needles)
    job.assert_clean()


@pytest.mark.slow
def test_a_hung_rank_is_stopped_at_the_deadline(tmp_path) -> None:
    """Rank 1 sleeps in its build, rank 0 waits for it in a collective. The job's limit counts
    from the launch (rank start-up included), so on a loaded machine the ranks may still be
    starting when it expires: either way the job ends at the deadline, exit 3. The limit was 40 s,
    every second of it spent waiting; 20 s is still past the ranks' start on a quiet machine."""
    timeout_s = 20
    job = Job(tmp_path, "sleep-rank1", timeout_s=timeout_s)
    rc, out, err, _ = job.finish(within_s=timeout_s + STARTUP_S)
    assert job.first_child_at is not None
    took = time.monotonic() - job.first_child_at
    assert timeout_s - 1 <= took <= timeout_s + 20, took
    assert rc == 3, err
    check_one_error_line(err, out, (f"did not finish within {timeout_s} s",))
    job.assert_clean()


@pytest.mark.slow
def test_kill_9_of_a_rank_is_reported_as_that_rank(tmp_path) -> None:
    job = Job(tmp_path, "sleep-rank1")
    ranks = job.wait_ready()
    os.kill(ranks[1], signal.SIGKILL)
    rc, out, err, _ = job.finish(within_s=30)
    assert rc == 3, err
    check_one_error_line(err, out, ("rank 1 was killed by SIGKILL", "before reporting a result"))
    job.assert_clean()


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_keyboard_interrupt_raised_by_user_code_is_a_user_code_failure(tmp_path, sigint) -> None:
    """Exit 3 naming the line, not "Interrupted." and 130: no one pressed Ctrl-C. Also when
    gbdoctor starts with SIGINT ignored (a background job), where its own handler is not
    installed."""
    spec = tmp_path / "ki.toml"
    spec.write_text(
        f'[model]\nname = "custom"\nflavor = "keyboard-interrupt"\n'
        f'factory = "{FACTORIES.as_posix()}:build"\n[training]\nlocal_batch_size = 2\nseq_len = 16\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "gbdoctor", "scan", str(spec)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=interruptible
        if sigint == "default"
        else lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert done.returncode == 3, done.stderr
    check_one_error_line(
        done.stderr, done.stdout, ("user code raised KeyboardInterrupt at", "factories.py:")
    )


@pytest.mark.slow
@pytest.mark.fresh_ranks  # the rendezvous under this GLOO_SOCKET_IFNAME: warm ranks met before it
def test_the_rendezvous_listens_on_loopback_only(monkeypatch) -> None:
    """Also when the environment names an external interface for gloo (left there for the
    user's own multi-node jobs): the ranks this job spawns all run here."""
    external = [n for _, n in socket.if_nameindex() if n not in ("lo", "lo0")]
    if external:
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", external[-1])
    found = run_ranks(listening, None, world_size=2, device_type="cpu", timeout_s=300)
    sockets = sorted(set(found[0]) | set(found[1]))
    parent = os.getpid()
    assert any(pid == parent for pid, _ in sockets), (
        f"the store should listen in this process: {sockets}"
    )
    assert any(pid != parent for pid, _ in sockets), f"gloo's ranks should listen too: {sockets}"
    loopback = (
        "127.0.0.1:",
        "00000000000000000000000001000000:",
    )  # IPv4, and ::1 as /proc writes it
    assert all(addr.startswith(loopback) for _, addr in sockets), sockets
