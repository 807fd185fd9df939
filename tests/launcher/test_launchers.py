"""gbdoctor under a launcher (docs/launchers.md): reading torchrun's, the DeepSpeed launcher's and
srun's environment, and real launched jobs (torchrun, two torchrun agents as two nodes, an
env-only Slurm step and DeepSpeed-launcher job started by the test) whose gathered report must
equal the self-spawned one apart from the launcher fields, written once; a failing rank ends
every rank with the cause named, and a spec whose world size is not the launcher's is exit 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from corpus.harness import FACTORIES
from launch_jobs import (
    JOB_S,
    deepspeed_env,
    free_port,
    gbdoctor_cmd,
    launch_env,
    run_all,
    run_two_ranks,
)
from repo_paths import FIXTURES, REPO

from gbdoctor.errors import SpecError
from gbdoctor.launcher import SLURM_DEFAULT_PORT_BASE, detect, first_host
from gbdoctor.records import Launcher

LAUNCH_FIELDS = ("launcher", "nodes", "ranks_per_node")
"""Deadline of one launched job on a loaded 2-core machine (two ranks import torch and scan)."""
FAULT_S = 60 + 30
"""How long a job with a failing rank may take to end: 30 s of it two torch imports on a
loaded 2-core machine."""

# --------------------------------------------------------------------------- reading the environment

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "none",
}


def test_torchrun_environment() -> None:
    got = detect(TORCHRUN)
    assert got is not None
    assert (got.launcher, got.rank, got.world_size, got.local_rank) == (Launcher.TORCHRUN, 3, 4, 1)
    assert (got.local_world_size, got.nodes) == (2, 2)
    assert (got.master_addr, got.master_port) == ("node0", 29500)


def test_deepspeed_launcher_environment() -> None:
    env = {
        k: v for k, v in TORCHRUN.items() if not k.startswith(("TORCHELASTIC", "GROUP", "LOCAL_W"))
    }
    env |= {"LOCAL_SIZE": "2", "CROSS_RANK": "1", "CROSS_SIZE": "2"}
    got = detect(env)
    assert got is not None
    assert (got.launcher, got.rank, got.local_world_size, got.nodes) == (
        Launcher.DEEPSPEED,
        3,
        2,
        2,
    )


def test_other_env_launcher() -> None:
    env = {k: TORCHRUN[k] for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    got = detect(env)
    assert got is not None
    assert (got.launcher, got.local_world_size, got.nodes) == (Launcher.ENV, 4, 1)


SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NNODES": "2",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu[007-008]",
}


def test_slurm_step_environment() -> None:
    got = detect(SLURM)
    assert got is not None
    assert (got.launcher, got.rank, got.world_size, got.local_rank) == (Launcher.SLURM, 5, 8, 1)
    assert (got.local_world_size, got.nodes, got.master_addr) == (4, 2, "gpu007")
    assert got.master_port == SLURM_DEFAULT_PORT_BASE + 123456 % 10000
    explicit = detect(SLURM | {"MASTER_ADDR": "head", "MASTER_PORT": "1234"})
    assert explicit is not None and (explicit.master_addr, explicit.master_port) == ("head", 1234)


def test_a_batch_script_or_a_plain_shell_is_no_launcher() -> None:
    """sbatch's own shell has SLURM_PROCID and SLURM_NTASKS but is no job step (no
    SLURM_STEP_ID): gbdoctor started there spawns its own ranks, as by hand."""
    assert detect({k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}) is None
    assert detect({"PATH": "/usr/bin", "LOCAL_RANK": "0"}) is None


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("gpu[007-008]", "gpu007"),
        ("node12", "node12"),
        ("a[3,5-9],b1", "a3"),
        ("head,worker[1-4]", "head"),
        ("rack1-n[01-04]-ib", "rack1-n01-ib"),
    ],
)
def test_first_host_of_a_slurm_node_list(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        (TORCHRUN | {"RANK": "three"}, "RANK='three' is not an integer"),
        (TORCHRUN | {"RANK": "4"}, "rank 4 of world size 4"),
        (TORCHRUN | {"WORLD_SIZE": "-2"}, "out of range"),
    ],
)
def test_a_malformed_launcher_environment_is_bad_input(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        detect(env)


# --------------------------------------------------------------------------- launched jobs


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _torchrun_gbdoctor() -> list[str]:
    """torchrun starting 2 local ranks of ``python -m gbdoctor`` (the command's arguments follow)."""
    return _torchrun("--standalone", "--nproc-per-node", "2", "-m", "gbdoctor")


def _error_lines(done: subprocess.CompletedProcess) -> list[str]:
    """The ``Error:`` lines a process wrote to stderr (gbdoctor's one-line errors)."""
    return [line for line in done.stderr.splitlines() if line.startswith("Error:")]


def _without_launch_fields(text: str) -> dict:
    data = json.loads(text)
    for key in LAUNCH_FIELDS:
        del data["setup"][key]
    return data


def _launch_fields(text: str) -> tuple:
    setup = json.loads(text)["setup"]
    return tuple(setup[k] for k in LAUNCH_FIELDS)


@pytest.fixture(scope="module")
def tiny_dp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A 2-rank spec of the tiny custom model, and its self-spawned JSON report."""
    spec = tmp_path_factory.mktemp("launch") / "tiny_dp2.toml"
    spec.write_text(
        '[model]\nname = "custom"\nflavor = "tiny"\n'
        f'factory = "{(FIXTURES / "models" / "tiny_custom.py").as_posix()}:build"\n'
        "[training]\nlocal_batch_size = 2\nseq_len = 16\n"
        "[parallelism]\ndata_parallel_shard_degree = 2\n"
        '[gbdoctor]\nstrategy = "titan-v0.2.0"\n'
    )
    (done,) = run_all([(gbdoctor_cmd("scan", str(spec), "-f", "json"), launch_env())])
    assert done.returncode == 0, done.stderr
    assert _launch_fields(done.stdout) == ("self", 1, 2)
    return spec, done.stdout


def _check_launched(done: subprocess.CompletedProcess, expected: str, fields: tuple) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count('"schema_version"') == 1, "the report is written once"
    assert _launch_fields(done.stdout) == fields
    assert _without_launch_fields(done.stdout) == _without_launch_fields(expected)


@pytest.mark.slow
def test_torchrun_scan_equals_the_self_spawned_scan() -> None:
    """The issue's done-when: ``torchrun --nproc-per-node 2 -m gbdoctor scan
    fixtures/llama4_debug_ep2.toml -f json`` is the self-spawned report, written once."""
    spec = "fixtures/llama4_debug_ep2.toml"
    own, launched = run_all(
        [
            (gbdoctor_cmd("scan", spec, "-f", "json"), launch_env()),
            (
                _torchrun_gbdoctor() + ["scan", spec, "-f", "json"],
                launch_env(),
            ),
        ]
    )
    assert own.returncode == 0, own.stderr
    _check_launched(launched, own.stdout, ("torchrun", 1, 2))


@pytest.mark.slow
def test_two_torchrun_agents_as_two_nodes(tiny_dp2: tuple[Path, str]) -> None:
    """Two agents (--nnodes 2, one rank each) meeting at a c10d rendezvous on loopback: the
    gathered report is the 2-rank self-spawned one, written once (by node 0's rank 0)."""
    spec, expected = tiny_dp2
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        (
            _torchrun(
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                endpoint,
                "--rdzv-id",
                "gbdoctor-test",
                "-m",
                "gbdoctor",
            )
            + ["scan", str(spec), "-f", "json"],
            launch_env(GLOO_SOCKET_IFNAME="lo"),
        )
        for node in (0, 1)
    ]
    results = run_all(agents)
    writer = [r for r in results if r.stdout.strip()]
    assert len(writer) == 1, [r.stderr[-2000:] for r in results]
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    _check_launched(writer[0], expected, ("torchrun", 2, 1))


@pytest.mark.slow
def test_slurm_step_contract(tiny_dp2: tuple[Path, str]) -> None:
    """Two processes with the environment ``srun --ntasks 2`` gives, the master found from the
    node list (no MASTER_ADDR): rank 0 writes the report, both exit 0."""
    spec, expected = tiny_dp2
    port = str(free_port())

    def env(rank: int) -> dict[str, str]:
        return launch_env(
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NTASKS="2",
            SLURM_NNODES="1",
            SLURM_NODEID="0",
            SLURM_TASKS_PER_NODE="2",
            SLURM_STEP_ID="0",
            SLURM_JOB_ID="42",
            SLURM_JOB_NODELIST="localhost",
            MASTER_PORT=port,
        )

    rank0, rank1 = run_two_ranks(spec, env, "-f", "json")
    assert rank1.returncode == 0 and rank1.stdout == "", rank1.stderr[-2000:]
    _check_launched(rank0, expected, ("slurm", 1, 2))


@pytest.mark.slow
def test_deepspeed_launcher_contract(tiny_dp2: tuple[Path, str]) -> None:
    """The environment the DeepSpeed launcher gives each rank (launcher/launch.py)."""
    spec, expected = tiny_dp2
    rank0, rank1 = run_two_ranks(spec, deepspeed_env(str(free_port())), "-f", "json")
    assert rank1.returncode == 0 and rank1.stdout == "", rank1.stderr[-2000:]
    _check_launched(rank0, expected, ("deepspeed", 1, 2))


def test_a_world_size_the_launcher_did_not_start_is_exit_2() -> None:
    """A 1-rank spec under a 2-rank launcher: one line naming both sizes, exit 2 on every rank.
    (Its shard degree is fixed at 1: a -1 takes the launcher's world size, below.)"""
    spec = FIXTURES / "llama3_debug.toml"
    fixed = ("--set", "parallelism.data_parallel_shard_degree=1")
    results = run_two_ranks(spec, deepspeed_env(str(free_port())), *fixed)
    assert [r.returncode for r in results] == [2, 2], [r.stderr[-2000:] for r in results]
    errors = _error_lines(results[0])
    assert errors == ["Error: the spec's world size is 1 but deepspeed started 2 ranks"]
    assert "Error:" not in results[1].stderr


def _fault_spec(tmp_path: Path, flavor: str, timeout_s: float = 120) -> Path:
    spec = tmp_path / "fault.toml"
    spec.write_text(
        f'[model]\nname = "custom"\nflavor = "{flavor}"\nfactory = "{FACTORIES.as_posix()}:build"\n'
        "[training]\nlocal_batch_size = 2\nseq_len = 16\n[parallelism]\ndata_parallel_shard_degree = 2\n"
        f'[gbdoctor]\nstrategy = "titan-v0.2.0"\ntimeout_s = {timeout_s}\n'
    )
    return spec


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flavor", "code", "needle"),
    [
        ("raise-rank1", 2, "rank 1: model factory"),
        ("osexit1-rank1", 3, "rank 1: user code called os._exit(1)"),
        ("forward-osexit0-rank1", 3, "rank 1: user code called os._exit(0)"),
    ],
)
def test_a_failing_rank_ends_every_rank_with_the_cause(
    tmp_path: Path, flavor: str, code: int, needle: str
) -> None:
    """Rank 1's factory raises (bad input: 2), or rank 1 calls os._exit while building or in its
    first block (3), while rank 0 goes on into the collectives: every rank exits with the same
    code well before the job timeout, and rank 0 names the cause in one line."""
    spec = _fault_spec(tmp_path, flavor)
    start = time.monotonic()
    results = run_two_ranks(spec, deepspeed_env(str(free_port())))
    took = time.monotonic() - start
    assert [r.returncode for r in results] == [code, code], [r.stderr[-2000:] for r in results]
    errors = _error_lines(results[0])
    assert len(errors) == 1 and needle in errors[0], results[0].stderr[-2000:]
    assert "Error:" not in results[1].stderr
    assert took < FAULT_S, took


@pytest.mark.slow
@pytest.mark.extra("torchtitan")
def test_torchrun_scan_of_an_installed_torchtitan_run_equals_the_self_spawned_scan() -> None:
    """``--torchtitan MODULE:CONFIG`` under torchrun: the installed torchtitan builds and shards
    the model on the launcher's ranks (its overrides pass through every rank), and the report is
    the self-spawned one apart from the launcher fields."""
    args = ["scan", "--torchtitan", "llama3:llama3_debugmodel", "--compile.enable"]
    args += ["--parallelism.data_parallel_shard_degree", "2"]
    args += ["--parallelism.spmd_backend", "partial_dtensor", "-f", "json"]
    own, launched = run_all(
        [
            (gbdoctor_cmd(*args), launch_env()),
            (
                _torchrun("--standalone", "--nproc-per-node", "2", "-m", "gbdoctor") + args,
                launch_env(),
            ),
        ]
    )
    assert own.returncode == 0, own.stderr[-3000:]
    _check_launched(launched, own.stdout, ("torchrun", 1, 2))
    assert json.loads(own.stdout)["setup"]["fsdp"] is True


@pytest.mark.slow
def test_a_rank_that_dies_under_torchrun_ends_the_job(tmp_path: Path) -> None:
    """Rank 1 is killed outright (SIGKILL: nothing in Python sees it) while rank 0 goes on
    into the collectives: the job ends within a minute with rank 1's death in torchrun's summary.
    Rank 0 either ends on torchrun's SIGTERM, or (when it sees the broken connection first) says
    a peer went away, never that the model fails. torchrun's "root cause" is the failure with the
    earliest whole-second timestamp, ties going to rank 0, so it is not asserted on."""
    spec = _fault_spec(tmp_path, "sigkill-rank1")
    start = time.monotonic()
    (done,) = run_all(
        [
            (
                _torchrun_gbdoctor() + ["scan", str(spec)],
                launch_env(),
            )
        ]
    )
    took = time.monotonic() - start
    assert done.returncode != 0
    summary = done.stderr.split("gbdoctor FAILED", 1)[-1]
    assert re.search(r"rank +: 1 \(local_rank: 1\)\n +exitcode +: -9 .*SIGKILL", summary), (
        done.stderr[-3000:]
    )
    errors = _error_lines(done)
    assert all("a peer rank went away" in e and "[1]" in e for e in errors), errors
    assert took < FAULT_S, took


@pytest.mark.slow
def test_a_rank_killed_with_no_launcher_to_see_it_is_named_by_its_peer(tmp_path: Path) -> None:
    """The same SIGKILL with no torchrun to stop the job (ranks started from the environment):
    rank 0's collective fails on the closed connection, and it says a peer went away, naming the
    rank that did not finish, instead of calling the model broken (exit 3)."""
    spec = _fault_spec(tmp_path, "sigkill-rank1")
    start = time.monotonic()
    rank0, rank1 = run_two_ranks(spec, deepspeed_env(str(free_port())))
    took = time.monotonic() - start
    assert (rank0.returncode, rank1.returncode) == (3, -9), rank0.stderr[-2000:]
    errors = _error_lines(rank0)
    assert len(errors) == 1, rank0.stderr[-2000:]
    assert "a peer rank went away" in errors[0] and "ranks not finished: [1]" in errors[0]
    assert "does not run eagerly" not in errors[0]
    assert took < FAULT_S, took


@pytest.mark.slow
def test_a_frozen_rank_is_found_by_its_missing_heartbeat(tmp_path: Path) -> None:
    """Rank 1 stops itself (SIGSTOP: its connections stay open, as when a node vanishes, so no
    collective fails and no launcher notices): rank 0 finds rank 1's heartbeat missing after
    GBDOCTOR_PEER_SILENCE_S and ends the job in one line (exit 3), long before the job timeout."""
    spec = _fault_spec(tmp_path, "sigstop-rank1", timeout_s=600)
    env_of = deepspeed_env(str(free_port()))
    procs = [
        subprocess.Popen(
            gbdoctor_cmd("scan", str(spec)),
            cwd=REPO,
            env=env_of(r) | {"GBDOCTOR_PEER_SILENCE_S": "5"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    start = time.monotonic()
    try:
        _, err = procs[0].communicate(timeout=JOB_S)
        took = time.monotonic() - start
    finally:
        procs[1].kill()  # stopped: only SIGKILL ends it
        procs[1].communicate()
    assert procs[0].returncode == 3, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, err[-2000:]
    assert "rank(s) [1] sent no heartbeat for 5 s" in errors[0]
    assert took < 60 + 30, took  # not the 600 s job timeout


@pytest.mark.slow
@pytest.mark.extra("deepspeed")
def test_the_real_deepspeed_launcher(tiny_dp2: tuple[Path, str]) -> None:
    """``deepspeed --num_gpus 2 --module gbdoctor scan ...`` on CPU (DeepSpeed's CPU accelerator):
    its ``--local_rank=N`` argument is dropped, the report is the self-spawned one."""
    spec, expected = tiny_dp2
    runner = [sys.executable, "-m", "deepspeed.launcher.runner"]
    (done,) = run_all(
        [
            (
                runner
                + ["--num_gpus", "2", "--master_port", str(free_port()), "--module"]
                + ["gbdoctor", "scan", str(spec), "-f", "json"],
                launch_env(DS_BUILD_OPS="0"),
            )
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()  # the launcher logs to stdout too: the report is "{" ... "}"
    json_text = "\n".join(lines[lines.index("{") : len(lines) - lines[::-1].index("}")])
    _check_launched(
        subprocess.CompletedProcess(done.args, 0, json_text + "\n", done.stderr),
        expected,
        ("deepspeed", 1, 2),
    )


@pytest.mark.parametrize("value", ["abc", "0", "-5"])
def test_a_bad_peer_silence_is_bad_input_before_any_rank_waits(tmp_path: Path, value: str) -> None:
    """``GBDOCTOR_PEER_SILENCE_S`` must be a positive number of seconds: exit 2 in one line when
    the rank joins, not a watcher that silently ignores it."""
    spec = _fault_spec(tmp_path, "clean")
    (done,) = run_all(
        [
            (
                gbdoctor_cmd("scan", str(spec)),
                deepspeed_env(str(free_port()))(0)
                | {"WORLD_SIZE": "1", "LOCAL_SIZE": "1", "GBDOCTOR_PEER_SILENCE_S": value},
            )
        ]
    )
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        f"Error: GBDOCTOR_PEER_SILENCE_S={value!r} is not a positive number of seconds"
    ]
