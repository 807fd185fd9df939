"""Files gbdoctor writes: atomic replacement, locked baseline updates, keys that do not depend on
the working directory."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys

import pytest
from cli_runs import Child, in_child
from corpus.harness import check_one_error_line
from repo_paths import FIXTURES, REPO
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.records import atomic_write
from gbdoctor.records.atomic_write import WriteError, write_atomic

SCAN = FIXTURES / "scans" / "llama4_before.json"
runner = CliRunner()


# --------------------------------------------------------------------------- atomic writes


def test_a_write_that_fails_part_way_keeps_the_old_file(tmp_path, monkeypatch) -> None:
    target = tmp_path / "baseline.json"
    target.write_text("old contents\n")
    real_write = os.write
    calls = []

    def half_then_full_disk(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_write.os, "write", half_then_full_disk)
    with pytest.raises(WriteError, match="No space left on device.*previous file is unchanged"):
        write_atomic(target, "new contents " * 1000)
    assert len(calls) == 2, "the write did fail part-way"
    assert target.read_text() == "old contents\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baseline.json"], (
        "temporary file left behind"
    )


def test_temporaries_of_a_killed_write_are_removed_by_the_next_one(tmp_path) -> None:
    """A write killed between creating its temporary file and renaming it leaves the file; the
    next write to the same target removes it, but never one whose writer is still running."""
    target = tmp_path / "scan.json"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    orphan = tmp_path / f".scan.json.{dead.stdout.strip()}.abc123.tmp"
    orphan.write_text("partial")
    in_progress = tmp_path / f".scan.json.{os.getpid()}.def456.tmp"
    in_progress.write_text("being written")
    write_atomic(target, "{}\n")
    assert not orphan.exists() and in_progress.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, in_progress.name])


def test_a_new_file_gets_the_usual_permissions(tmp_path) -> None:
    target = tmp_path / "sub" / "out.json"
    write_atomic(target, "{}\n")
    umask = os.umask(0)
    os.umask(umask)
    assert target.read_text() == "{}\n" and (target.stat().st_mode & 0o777) == 0o666 & ~umask


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="needs RLIMIT_FSIZE")
def test_update_baseline_over_the_file_size_limit_keeps_the_committed_baseline(tmp_path) -> None:
    """The issue's case: a failed --update-baseline left the baseline truncated. Here the
    kernel's file-size limit stops the write after 300 bytes (no torch: gate --scan)."""
    baseline = tmp_path / "baseline.json"
    # Each command in a process of its own (``tests/cli_runs.py``), forked from a server that
    # imported the CLI once: the file-size limit is the process's.
    gate_scan = ("gate", "--scan")
    first = in_child(*gate_scan, str(SCAN), "--baseline", str(baseline), "--update-baseline",
                     cwd=tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr
    committed = baseline.read_text()
    other = tmp_path / "other.json"
    data = json.loads(SCAN.read_text())
    data["spec"] = "configs/" + "a-long-spec-name-" * 20 + ".toml"
    other.write_text(json.dumps(data))

    # The kernel's limit: the write fails with EFBIG (SIGXFSZ ignored, as the child sets it).
    failed = in_child(*gate_scan, str(other), "--baseline", str(baseline), "--update-baseline",
                      cwd=tmp_path, file_size_limit=300)  # fmt: skip
    assert failed.returncode == 3, failed.stderr
    check_one_error_line(
        failed.stderr, failed.stdout, ("writing baseline", "the previous file is unchanged")
    )
    # The hint is about the file-size limit, not disk space (issue 32).
    assert "ulimit -f" in failed.stderr and "free disk space" not in failed.stderr, failed.stderr
    assert baseline.read_text() == committed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baseline.json", "other.json"]
    gate = in_child(*gate_scan, str(SCAN), "--baseline", str(baseline), cwd=tmp_path)
    assert gate.returncode == 0, gate.stderr


def test_concurrent_baseline_updates_keep_every_entry(tmp_path) -> None:
    """Six jobs add six specs to one baseline at the same moment, twice over: the lock around
    read-merge-write keeps all of them (without it, entries were lost in 3 of 45 trials of two).
    Each job is a process of its own, forked from a server that imported the CLI once
    (``tests/cli_runs.py``), so the six reach the lock closer together than six fresh
    interpreters, whose imports alone take seconds."""
    baseline = tmp_path / "baseline.json"
    names = []
    for round_ in range(2):
        procs = []
        for i in range(6):
            data = json.loads(SCAN.read_text())
            data["spec"] = f"configs/round{round_}-spec{i}.toml"
            names.append(data["spec"])
            scan = tmp_path / f"scan-{round_}-{i}.json"
            scan.write_text(json.dumps(data))
            procs.append(
                Child(
                    "gate",
                    "--scan",
                    str(scan),
                    "--baseline",
                    str(baseline),
                    "--update-baseline",
                    cwd=tmp_path,
                )  # fmt: skip
            )
        for proc in procs:
            done = proc.wait(timeout=300)
            assert done.returncode == 0, done.stderr
    assert sorted(json.loads(baseline.read_text())["specs"]) == sorted(names)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], (
        "temporary files left behind"
    )


# --------------------------------------------------------------------------- keys and the working directory


def test_the_same_scan_from_two_directories_is_byte_identical_and_gates(
    tmp_path, monkeypatch
) -> None:
    outputs = []
    for cwd, spec in (
        (REPO, "fixtures/custom_tiny.toml"),
        (REPO / "fixtures" / "models", "../custom_tiny.toml"),
    ):
        monkeypatch.chdir(cwd)
        out = tmp_path / f"scan{len(outputs)}.json"
        result = runner.invoke(app, ["scan", spec, "-f", "json", "-o", str(out)])
        assert result.exit_code == 0, result.stderr
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0])["spec"] == "fixtures/custom_tiny.toml"
    monkeypatch.chdir(tmp_path)
    baseline = tmp_path / "base.json"
    assert (
        runner.invoke(
            app,
            [
                "gate",
                "--scan",
                str(tmp_path / "scan0.json"),
                "--baseline",
                str(baseline),
                "--update-baseline",
            ],
        ).exit_code
        == 0
    )
    monkeypatch.chdir(REPO / "gbdoctor")
    assert (
        runner.invoke(
            app, ["gate", "--scan", str(tmp_path / "scan1.json"), "--baseline", str(baseline)]
        ).exit_code
        == 0
    )


def test_stable_root_is_the_repository_or_the_spec_directory(tmp_path) -> None:
    from gbdoctor.spec import stable_root

    assert stable_root(str(REPO / "fixtures" / "llama3_debug.toml")) == str(REPO)
    (tmp_path / "configs").mkdir()
    assert stable_root(str(tmp_path / "configs" / "a.toml")) == str(tmp_path / "configs")
    (tmp_path / ".git").mkdir()
    assert stable_root(str(tmp_path / "configs" / "a.toml")) == str(tmp_path)
