"""``tests/cli_runs.py``, which many CLI tests run through instead of a fresh interpreter: its
two ways give what the console script gives, and the in-process one leaves nothing behind."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import in_child, in_process
from repo_paths import REPO

CASES = {
    # exit 1, the report on stdout
    "diff": (
        "diff",
        "fixtures/scans/llama4_before.json",
        "fixtures/scans/llama4_after_new_break.json",
    ),  # fmt: skip
    # exit 2 from an option's bound, before anything is built
    "price-bound": ("price", "fixtures/custom_tiny.toml", "--rounds", "0"),
    # exit 2 from click (the usage lines name the program: the console script's name)
    "usage": ("scan", "--no-such-option"),
}


def _console_script() -> Path:
    script = Path(sys.executable).with_name("gbdoctor")
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}: gbdoctor is not installed")
    return script


@pytest.mark.slow  # a fresh interpreter per case, and the fork server's start
@pytest.mark.parametrize("args", list(CASES.values()), ids=list(CASES))
def test_both_ways_give_what_the_console_script_gives(args: tuple[str, ...]) -> None:
    """The oracle: the installed ``gbdoctor`` script, run on this checkout (PYTHONPATH)."""
    real = subprocess.run(
        [str(_console_script()), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    expected = (real.returncode, real.stdout, real.stderr)
    assert real.returncode != 0, real.stderr  # each case ends with an error's exit code
    here = in_process(*args, cwd=REPO)
    assert (here.returncode, here.stdout, here.stderr) == expected
    child = in_child(*args, cwd=REPO)
    assert (child.returncode, child.stdout, child.stderr) == expected


def _state() -> dict[str, object]:
    from gbdoctor.torch_compat import dynamo_config

    return {
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "sys.path": list(sys.path),
        "modules": {m for m in sys.modules if m.startswith("tiny_custom")},
        "dynamo": dynamo_config().get_config_copy(),
        "signals": {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)},
        "hooks": (sys.unraisablehook, sys.excepthook),
        "root handlers": list(logging.getLogger().handlers),
    }


def test_a_command_run_in_process_leaves_this_process_as_it_was(tmp_path: Path) -> None:
    """``--debug`` sets ``GBDOCTOR_DEBUG`` while the command runs, the custom factory puts its
    folder on ``sys.path`` and imports its file, the pinned Dynamo settings are patched, and the
    command runs from another directory with an added variable: all of it is undone."""
    before = _state()
    done = in_process(
        "--debug", "inspect", str(REPO / "fixtures" / "custom_tiny.toml"), "--format", "json",
        "-o", str(tmp_path / "inspect.json"), cwd=tmp_path, GBDOCTOR_CLI_RUNS_MARK="1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "inspect.json").read_text().startswith("{")
    after = _state()
    assert {k: v for k, v in after.items() if before[k] != v} == {}


def test_shared_scans_answer_only_the_same_scan(tmp_path: Path, monkeypatch) -> None:
    """``Child(shared_scans=...)`` (the docs' excerpts): a scan with the same spec, options,
    working directory and environment is answered from the first one's report, the very
    record; any of them different is scanned anew."""
    from cli_runs import _share_scans

    import gbdoctor.scan as scan_package
    from gbdoctor.spec import load_spec

    made = []

    def fake_scan(spec, *, progress=None, framework=None, **options):
        made.append((spec.training.seq_len, options))
        return {"scan": len(made)}

    monkeypatch.setattr(scan_package, "scan", fake_scan)
    monkeypatch.chdir(REPO)
    _share_scans(str(tmp_path))  # replaces scan_package.scan; monkeypatch restores the real one
    spec = load_spec(REPO / "fixtures" / "custom_tiny.toml")
    first = scan_package.scan(spec, strategy=None, progress=print, recompiles=None)
    again = load_spec(REPO / "fixtures" / "custom_tiny.toml")
    assert scan_package.scan(again, strategy=None, progress=None, recompiles=None) == first
    assert len(made) == 1 and len(list(tmp_path.glob("*.pickle"))) == 1
    longer = load_spec(REPO / "fixtures" / "custom_tiny.toml", ["training.seq_len=32"])
    assert scan_package.scan(longer, strategy=None, recompiles=None) == {"scan": 2}
    assert scan_package.scan(spec, strategy="eager", recompiles=None) == {"scan": 3}
    assert scan_package.scan(spec, strategy=None, recompiles=True) == {"scan": 4}
    monkeypatch.setenv("GBDOCTOR_RECOMPILE_PROBE", "1")
    assert scan_package.scan(spec, strategy=None, recompiles=None) == {"scan": 5}
    monkeypatch.chdir(tmp_path)
    assert scan_package.scan(spec, strategy=None, recompiles=None) == {"scan": 6}
    assert len(made) == 6
