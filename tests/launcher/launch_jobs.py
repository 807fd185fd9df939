"""Launched jobs as the launcher tests start them (``test_launchers.py``,
``test_launch_rendezvous.py``): a free port, an environment with no launcher's variables, the
gbdoctor command, and two ranks started at once with the environment a launcher gives each."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from repo_paths import REPO

JOB_S = 300
"""How long one launched job may take (two ranks of a tiny scan on a loaded 2-core machine)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, plus ``extra``."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_", "GROUP_", "MASTER_", "TORCHELASTIC", "SLURM_", "CROSS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return env | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"} | extra


def gbdoctor_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gbdoctor", *args]


def run_all(commands: list[tuple[list[str], dict[str, str]]]) -> list[subprocess.CompletedProcess]:
    """Start every command at once (the ranks or agents of one job); wait for all."""
    procs = [
        subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for cmd, env in commands
    ]
    done = []
    try:
        for proc, (cmd, _) in zip(procs, commands, strict=True):
            out, err = proc.communicate(timeout=JOB_S)
            done.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return done


def run_two_ranks(spec: Path, env_of_rank, *args: str) -> list[subprocess.CompletedProcess]:
    return run_all([(gbdoctor_cmd("scan", str(spec), *args), env_of_rank(r)) for r in (0, 1)])


def deepspeed_env(port: str):
    def env(rank: int) -> dict[str, str]:
        return launch_env(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_SIZE="2",
            CROSS_RANK="0",
            CROSS_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )

    return env
