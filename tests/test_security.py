"""The promises of docs/security.md, each tested as stated (issue 32's red-team corpus).

- A spec runs no code but the user's own: a factory naming an installed package's callable
  (``torch.utils.collect_env:run`` runs its argument as a shell command, ``sympy:sympify``
  evaluates it) is refused before anything is imported from it.
- An output never destroys what it was not asked to write: a symlink is written through, a
  device or FIFO is written in place (``-o /dev/null`` as root keeps the device node), a FIFO
  nobody reads is an error instead of a hang, and an output that is one of the command's
  inputs (``scan s.toml -o s.toml``) is refused.
- Inputs are bounded: a device, a FIFO, a huge file, a 5000-digit integer or a boolean
  ``schema_version`` is one line and exit 2, never a hang, a MemoryError or an internal error.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cli_runs import Done, in_process
from repo_paths import FIXTURES, REPO

from gbdoctor.errors import BaselineError
from gbdoctor.records.atomic_write import OutputError, write_atomic
from gbdoctor.records.io import check_schema_version, parse_json_object
from gbdoctor.usercode import TRUSTED_FACTORY_ENV, installed_distribution

SCAN = FIXTURES / "scans" / "llama4_before.json"


def gbdoctor(*args: str, cwd: Path = REPO, **env: str) -> Done:
    """In this process (``tests/cli_runs.py``): each of these commands is refused before any
    model or rank, or reads only files."""
    return in_process(*args, cwd=cwd, **env)


def gbdoctor_process(*args: str, cwd: Path = REPO, timeout: float = 120, **env: str):
    """A fresh interpreter, for an input that must not hang: a regression then fails at the
    timeout instead of hanging the test process."""
    return subprocess.run(
        [sys.executable, "-m", "gbdoctor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )


# --------------------------------------------------------------------------- factories


@pytest.mark.parametrize(
    "factory, flavor",
    [
        ("torch.utils.collect_env:run", "touch {marker}"),
        ("sympy:sympify", "__import__('pathlib').Path('{marker}').touch()"),
        ("sympy.parsing.sympy_parser:parse_expr", "__import__('pathlib').Path('{marker}').touch()"),
        ("click:launch", "{marker}"),
    ],
    ids=["collect_env-run", "sympify", "parse_expr", "click-launch"],
)
def test_a_spec_cannot_run_an_installed_package_callable(tmp_path, factory, flavor) -> None:
    marker = tmp_path / "pwned"
    spec = tmp_path / "s.toml"
    spec.write_text(
        f'[model]\nname = "custom"\nflavor = "{flavor.format(marker=marker)}"\n'
        f'factory = "{factory}"\n[training]\nlocal_batch_size = 1\nseq_len = 8\n'
    )
    done = gbdoctor("scan", str(spec), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "belongs to the installed package" in done.stderr, done.stderr
    assert TRUSTED_FACTORY_ENV in done.stderr  # the hint names the explicit opt-in
    assert "Traceback" not in done.stderr
    assert not marker.exists(), "the factory ran"


def test_installed_packages_are_recognised_without_importing_them(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "sympy", raising=False)
    assert installed_distribution("sympy.parsing.sympy_parser") == "sympy"
    assert "sympy" not in sys.modules, "deciding imported the package"
    assert installed_distribution("torch.utils.collect_env") == "torch"
    assert installed_distribution("my_own_models_xyz.llama") is None  # not installed: the user's
    monkeypatch.setenv(TRUSTED_FACTORY_ENV, "sympy, other")
    assert installed_distribution("sympy") is None  # trusted explicitly


# --------------------------------------------------------------------------- outputs


def test_an_output_symlink_is_written_through(tmp_path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"


def test_an_output_fifo_is_written_in_place_or_refused_without_a_reader(tmp_path) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="no process is reading this FIFO"):
        write_atomic(fifo, "x\n")  # fails at once: no hang
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    # The reader's open blocks until a writer opens too; retry until it is waiting.
    for _ in range(200):
        try:
            write_atomic(fifo, "report\n")
            break
        except OutputError:
            threading.Event().wait(0.05)
    reader.join(10)
    assert got == [b"report\n"] and fifo.exists() and not fifo.is_file()


def test_an_output_socket_is_refused(tmp_path) -> None:
    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        with pytest.raises(OutputError, match="is a socket"):
            write_atomic(path, "x\n")
    finally:
        server.close()


def _private_dev_available() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /dev"], capture_output=True
    )
    return probe.returncode == 0


@pytest.mark.skipif(
    not _private_dev_available(),
    reason="needs root and unshare -m: the devices are made in a private /dev, so no run of "
    "this test can damage the machine's own",
)
def test_device_outputs_are_written_in_place_in_a_private_dev(tmp_path) -> None:
    """As root, renaming over ``/dev/null`` would replace the machine's device node. The test
    builds a private ``/dev`` (a tmpfs in a private mount namespace) holding null, full and the
    stdout link, so a regression damages nothing outside it."""
    cli = f"{shlex.quote(sys.executable)} -m gbdoctor diff {SCAN} {SCAN}"
    script = "\n".join(
        [
            "mount -t tmpfs tmpfs /dev && mknod -m 666 /dev/null c 1 3",
            "mknod -m 666 /dev/full c 1 7 && ln -s /proc/self/fd/1 /dev/stdout",
            f"{cli} -o /dev/null; echo null-rc=$?",
            "stat -c null-type=%F /dev/null",
            f"{cli} -o /dev/full 2>&1; echo full-rc=$?",
            f"{cli} -o /dev/stdout | grep -c 'gbdoctor' | sed 's/^/stdout-lines=/'",
            "stat -c stdout-type=%F /dev/stdout",
        ]
    )
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    out = done.stdout
    assert "null-rc=0" in out and "null-type=character special file" in out, out + done.stderr
    assert "full-rc=3" in out and "No space left on device" in out, out + done.stderr
    assert "stdout-type=symbolic link" in out, out
    assert "stdout-lines=0" not in out and "stdout-lines=" in out, out


@pytest.mark.parametrize(
    "command",
    [
        ["scan", "{spec}", "-o", "{spec}"],
        ["inspect", "{spec}", "--output", "{link}"],
        ["diff", "{scan}", "{scan2}", "-o", "{scan}"],
        ["gate", "--scan", "{scan}", "--baseline", "{baseline}", "-o", "{baseline}"],
    ],
    ids=["scan-spec", "inspect-spec-through-link", "diff-old", "gate-baseline"],
)
def test_an_output_that_is_an_input_is_refused(tmp_path, command) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text((FIXTURES / "llama3_debug.toml").read_text())
    link = tmp_path / "link.toml"
    link.symlink_to(spec)
    scan, scan2, baseline = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "base.json"
    for path in (scan, scan2, baseline):
        path.write_text(SCAN.read_text())
    before = {p: p.read_bytes() for p in (spec, scan, baseline)}
    paths = {"spec": spec, "link": link, "scan": scan, "scan2": scan2, "baseline": baseline}
    done = gbdoctor(*(part.format(**paths) for part in command), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "is also an input of this command" in done.stderr, done.stderr
    assert {p: p.read_bytes() for p in before} == before, "an input was overwritten"


def _custom_project(tmp_path: Path) -> dict[str, Path]:
    """A spec whose factory is a file of a package (``pkg/net.py``) with a sibling module."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "layers.py").write_text("WIDTH = 64\n")
    (pkg / "net.py").write_text((FIXTURES / "models" / "tiny_custom.py").read_text())
    (pkg / "helper.py").write_text("HELP = 1\n")
    spec = tmp_path / "s.toml"
    text = (FIXTURES / "custom_tiny.toml").read_text()
    spec.write_text(text.replace("models/tiny_custom.py:build", "pkg/net.py:build"))
    (tmp_path / "report.json").write_text("{}")
    return {
        "spec": spec,
        "factory": pkg / "net.py",
        "sibling": pkg / "helper.py",
        "package": pkg / "sub" / "layers.py",
        "a": tmp_path / "a.json",
    }


@pytest.mark.parametrize(
    "command, message",
    [
        (["scan", "{spec}", "-o", "{factory}"], "part of the model code"),
        (["inspect", "{spec}", "-o", "{sibling}"], "part of the model code"),
        (["plan", "{spec}", "-o", "{package}"], "part of the model code"),
        (["price", "{spec}", "-o", "{factory}"], "part of the model code"),
        (["timeline", "{spec}", "-o", "{factory}"], "part of the model code"),
        (["timeline", "{spec}", "-o", "{a}", "--plot", "{a}"], "also another output"),
        (["run", "{spec}", "-o", "{a}", "--csv", "{a}"], "also another output"),
        (
            ["gate", "{spec}", "--baseline", "{a}", "--update-baseline", "--html", "{factory}"],
            "part of the model code",
        ),  # fmt: skip
    ],
    ids=[
        "scan-factory",
        "inspect-sibling",
        "plan-package",
        "price-factory",
        "timeline-factory",
        "timeline-o-plot",
        "run-o-csv",
        "gate-html-factory",
    ],  # fmt: skip
)
def test_an_output_onto_the_model_code_or_another_output_is_refused(
    tmp_path, command, message
) -> None:
    """Issue 45: ``scan custom.toml -o models/model.py`` replaced the model's source."""
    paths = _custom_project(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    done = gbdoctor(*(part.format(**paths) for part in command), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) <= 2, done.stderr
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before, "a file was written"


def test_a_report_kept_in_the_model_package_may_be_rewritten(tmp_path) -> None:
    """Only code is protected: a JSON beside the model is an ordinary output."""
    paths = _custom_project(tmp_path)
    out = paths["factory"].parent / "inspect.json"
    out.write_text("{}")
    done = gbdoctor("inspect", str(paths["spec"]), "--format", "json", "-o", str(out),
                    cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("{\n") or len(out.read_text()) > 2


# --------------------------------------------------------------------------- inputs


def test_a_device_or_fifo_as_input_is_one_line_at_once(tmp_path) -> None:
    fifo = tmp_path / "scan.fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        done = gbdoctor_process("diff", path, str(SCAN), timeout=60)
        assert done.returncode == 2, done.stderr
        assert "not a regular file" in done.stderr and "Traceback" not in done.stderr


def test_a_spec_that_is_a_device_a_fifo_or_nested_too_deep_is_one_line(tmp_path) -> None:
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    for path, needle in (
        ("/dev/zero", "not a regular file"),
        (str(fifo), "not a regular file"),
        (str(deep), "nested too deeply"),
    ):
        done = gbdoctor_process("scan", path, timeout=60)
        assert done.returncode == 2, done.stderr
        assert needle in done.stderr and path in done.stderr and "Traceback" not in done.stderr


def test_a_spec_with_a_utf8_byte_order_mark_loads(tmp_path) -> None:
    from gbdoctor.spec import load_spec

    spec = tmp_path / "bom.toml"
    spec.write_bytes(b"\xef\xbb\xbf" + (FIXTURES / "llama3_debug.toml").read_bytes())
    assert load_spec(spec).model.name == "llama3"


def test_an_integer_too_long_for_python_is_bad_input_not_an_internal_error() -> None:
    with pytest.raises(BaselineError, match="not valid JSON"):
        parse_json_object('{"breaks": ' + "9" * 5000 + "}", "scan.json")


def test_a_boolean_schema_version_is_not_version_1() -> None:
    with pytest.raises(BaselineError, match="schema_version True"):
        check_schema_version({"schema_version": True}, 1, "scan.json", "scan", "hint")


def test_empty_inductor_cache_dirs_a_command_made_are_removed(tmp_path, monkeypatch) -> None:
    """Issue 32: every command left an empty ``torchinductor_<user>/`` in TMPDIR. Only the
    empty trees the command created go; one holding a file, or there before, stays."""
    import tempfile

    from gbdoctor.cli.exits import no_empty_cache_dirs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "torchinductor_before").mkdir()
    with no_empty_cache_dirs():
        (tmp_path / "torchinductor_me" / "fxgraph" / "ab").mkdir(parents=True)
        (tmp_path / "torchinductor_kept" / "triton").mkdir(parents=True)
        (tmp_path / "torchinductor_kept" / "triton" / "kernel.py").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "torchinductor_before",
        "torchinductor_kept",
    ]
    assert (tmp_path / "torchinductor_kept" / "triton" / "kernel.py").exists()
