"""A launched rank's start (issue 45): the world size a -1 shard degree takes from the launcher,
and the rendezvous wait, which SIGTERM and SIGINT end within a second, on a store that listens
on loopback only when the job is on one node. The launcher contracts: test_launchers.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_runs import interruptible
from launch_jobs import deepspeed_env, free_port, gbdoctor_cmd, launch_env, run_two_ranks
from repo_paths import FIXTURES


@pytest.mark.parametrize(
    "env",
    [
        {"TORCHELASTIC_RUN_ID": "1", "LOCAL_WORLD_SIZE": "4"},
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0", "SLURM_NNODES": "1",
         "SLURM_JOB_NODELIST": "localhost", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "4",
         "SLURM_NODEID": "0", "MASTER_PORT": "29500"},
    ],
    ids=["torchrun", "slurm"],
)  # fmt: skip
def test_a_shard_degree_of_minus_1_takes_the_launchers_world_size(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    """Issue 45: under torchrun, data_parallel_shard_degree = -1 resolved to 1 and the scan was
    refused ("the spec's world size is 1 but torchrun started 2 ranks"); torchtitan takes every
    rank the launcher started."""
    from gbdoctor.spec import load_spec

    for key in [k for k in os.environ if k.startswith(("RANK", "WORLD_SIZE", "SLURM_", "MASTER_"))]:
        monkeypatch.delenv(key)
    if "TORCHELASTIC_RUN_ID" in env:
        env = {**env, "RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": "29500"}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = load_spec(FIXTURES / "llama3_debug.toml")
    assert spec.parallelism.data_parallel_shard_degree == -1
    assert (spec.parallelism.dp_shard, spec.parallelism.world_size) == (4, 4)
    # A stated launch size still wins, and fixed degrees stay as written.
    stated = load_spec(FIXTURES / "llama3_debug.toml", ["gbdoctor.world_size=2"])
    assert stated.parallelism.world_size == 2
    fixed = load_spec(FIXTURES / "llama3_debug.toml", ["parallelism.data_parallel_shard_degree=1"])
    assert fixed.parallelism.world_size == 1


@pytest.mark.slow
def test_a_minus_1_spec_scans_under_a_two_rank_launcher(tmp_path: Path) -> None:
    spec = tmp_path / "tiny_any.toml"
    spec.write_text(
        '[model]\nname = "custom"\nflavor = "tiny"\n'
        f'factory = "{(FIXTURES / "models" / "tiny_custom.py").as_posix()}:build"\n'
        "[training]\nlocal_batch_size = 2\nseq_len = 16\n"
        "[parallelism]\ndata_parallel_shard_degree = -1\n"
        '[gbdoctor]\nstrategy = "titan-v0.2.0"\n'
    )
    rank0, rank1 = run_two_ranks(spec, deepspeed_env(str(free_port())), "-f", "json")
    assert rank0.returncode == 0 and rank1.returncode == 0, rank0.stderr[-2000:]
    setup = json.loads(rank0.stdout)["setup"]
    assert (setup["world_size"], setup["dp_shard"], setup["launcher"]) == (2, 2, "deepspeed")


def _listeners_on(port: int) -> list[str]:
    """``address:port`` of every socket listening on ``port`` (IPv4 and IPv6, from /proc)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(local)
    return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_rank_waiting_at_rendezvous_ends_on_a_signal(tmp_path: Path, signum: int) -> None:
    """Issue 45: rank 0 of a Slurm step whose peer never comes waited inside torch's store (up to
    1800 s), deaf to SIGTERM and SIGINT, and its store listened on every interface although the
    master is this machine. Now: a loopback listener only, and the signal's exit code within
    2 s with no process of the rank left."""
    port = free_port()
    env = launch_env(
        SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="2", SLURM_NNODES="1",
        SLURM_NODEID="0", SLURM_TASKS_PER_NODE="2", SLURM_STEP_ID="0", SLURM_JOB_ID="45",
        SLURM_JOB_NODELIST="localhost", MASTER_PORT=str(port),
    )  # fmt: skip
    proc = subprocess.Popen(
        gbdoctor_cmd("scan", str(FIXTURES / "custom_tiny.toml")),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=interruptible,  # a rank started as a shell starts it, SIGINT not ignored
    )
    try:
        deadline = time.monotonic() + 240
        while not _listeners_on(port):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "rank 0 never listened"
            time.sleep(0.2)
        time.sleep(1.0)  # well inside the wait for its peer
        listeners = _listeners_on(port)
        # 0100007F is 127.0.0.1 as /proc writes it; a wildcard would be 00000000.
        assert listeners and all(a.startswith("0100007F:") for a in listeners), listeners
        sent = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signum, err[-2000:]
    assert took < 2.0, f"{took:.1f} s"
    assert "Traceback" not in err, err[-2000:]
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of the rank's session is left
    assert not _listeners_on(port)
