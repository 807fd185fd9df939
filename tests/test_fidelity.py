"""Fidelity: gbdoctor's per-block answer against what Dynamo does to each construct class.

The model (fixtures/models/frame_shapes.py) plants one frame shape per flavor; its ``EXPECTED``
table was measured with plain ``torch.compile(block, backend="eager")`` and the graph-break log,
one break per statement per block (the oracle check, ``scan --oracle``, re-measures it)."""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from repo_paths import FIXTURES, REPO

from gbdoctor.scan import scan
from gbdoctor.spec import load_spec

MODEL = FIXTURES / "models" / "frame_shapes.py"


def _load_model_module():
    spec = importlib.util.spec_from_file_location("frame_shapes", MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SHAPES = _load_model_module()


def write_spec(directory: Path, flavor: str, factory: Path = MODEL, extra: str = "") -> Path:
    path = directory / f"{flavor}.toml"
    path.write_text(
        f'[model]\nname = "custom"\nflavor = "{flavor}"\nfactory = "{factory}:build"\n'
        "[training]\nlocal_batch_size = 2\nseq_len = 16\n"
        '[activation_checkpoint]\nmode = "none"\n'
        f'[gbdoctor]\nstrategy = "titan-v0.2.0"\n{extra}'
    )
    return path


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    """flavor -> its scan report, each flavor scanned once for the module."""
    directory = tmp_path_factory.mktemp("specs")
    cache: dict[str, object] = {}

    def get(flavor: str, **kwargs):
        if flavor not in cache:
            cache[flavor] = scan(load_spec(write_spec(directory, flavor)), **kwargs)
        return cache[flavor]

    return get


def _breaks(block) -> int:
    return sum(b.count for b in block.breaks)


# ------------------------------------------------------------------ one break per statement


@pytest.mark.parametrize("flavor", sorted(SHAPES.EXPECTED))
def test_each_construct_class_matches_plain_compile(flavor, scanned):
    """Breaks per block as plain ``torch.compile(block)`` logs them, one per statement, whatever
    frames Dynamo meets a statement in (a custom autograd.Function's forward: inside its HOP,
    then as a frame of its own; a helper after a break: in Dynamo's continuation); and a
    ``frame_skipped`` event exactly where Dynamo abandons a frame (failing import, generator,
    unsupported context manager, a break in a loop)."""
    expected, skipped = SHAPES.EXPECTED[flavor]
    report = scanned(flavor)
    assert [_breaks(b) for b in report.blocks] == [expected] * len(report.blocks)
    lines = [b.location.line for b in report.blocks[0].breaks]
    assert len(set(lines)) == len(lines) == expected
    skips = [e for e in report.blocks[0].events if e.kind == "frame_skipped"]
    assert len(skips) == (1 if skipped else 0), [(e.module, e.detail) for e in skips]
    for event in skips:
        assert event.module == "layers.0" and "abandoned frame forward" in event.detail
        assert event.location.line in lines  # the statement that made Dynamo give up


def test_autograd_function_break_belongs_to_the_submodule_that_called_it(scanned):
    (brk,) = scanned("autograd_function").blocks[0].breaks
    assert brk.module == "layers.0.gate"
    assert brk.location.function == "forward" and brk.location.file.endswith("frame_shapes.py")


# ------------------------------------------------------------------ generated frame names


@pytest.mark.parametrize("flavor", ["resume", "nested_after_break"])
def test_resume_functions_are_named_after_the_users_function(flavor, scanned):
    report = scanned(flavor)
    functions = {b.location.function for b in report.blocks[0].breaks}
    assert not any("torch_dynamo_resume" in f for f in functions), functions
    events = {e.location.function for e in report.blocks[0].events if e.location}
    assert not any("torch_dynamo_resume" in f for f in events), events


# ------------------------------------------------------------------ portable locations


def test_break_raised_in_the_standard_library_is_located_at_the_users_line(scanned):
    (brk,) = scanned("stdlib").blocks[0].breaks
    source = MODEL.read_text().splitlines()
    assert "copy.deepcopy" in source[brk.location.line - 1]
    assert brk.location.function == "forward"
    via = brk.location.via
    assert via is not None and via.file == "copy.py" and via.function == "deepcopy"


def test_paths_name_the_module_when_outside_the_spec_root(tmp_path):
    from gbdoctor.capture.locate import portable_path, portable_text

    package = tmp_path / "pkg" / "sub"
    package.mkdir(parents=True)
    for init in (tmp_path / "pkg" / "__init__.py", package / "__init__.py"):
        init.write_text("")
    (package / "m.py").write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert portable_path(str(package / "m.py"), str(elsewhere)) == "pkg/sub/m.py"
    assert portable_path(copy.__file__, str(elsewhere)) == "copy.py"
    text = portable_text(f"see {package / 'm.py'} line 3, and {torch.__file__}", str(elsewhere))
    assert text == "see pkg/sub/m.py line 3, and torch/__init__.py"
    assert portable_text("no paths here (line 3)") == "no paths here (line 3)"


def _copy_model_dir(target: Path) -> Path:
    (target / "models").mkdir(parents=True)
    shutil.copy(MODEL, target / "models" / "frame_shapes.py")
    return write_spec(target, "stdlib", factory=Path("models/frame_shapes.py"))


def _cli_scan(python: str, spec: Path, out: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO), GBDOCTOR_RECOMPILE_PROBE="0")
    subprocess.run(
        [python, "-m", "gbdoctor.cli", "scan", str(spec), "--format", "json", "-o", str(out)],
        check=True,
        env=env,
        cwd=spec.parent,
        capture_output=True,
    )
    return out.read_text()


def test_same_scan_from_two_venv_paths_and_two_model_copies_is_byte_identical(tmp_path):
    """A venv reached at another path (its site-packages and torch's own files move) and a
    second copy of the model's directory: the JSON does not change by a byte."""
    first = _copy_model_dir(tmp_path / "a")
    second = _copy_model_dir(tmp_path / "b" / "deeper")
    other_venv = tmp_path / "venv-elsewhere"
    other_venv.symlink_to(sys.prefix, target_is_directory=True)
    other_python = other_venv / os.path.relpath(sys.executable, sys.prefix)
    one = _cli_scan(sys.executable, first, tmp_path / "one.json")
    two = _cli_scan(str(other_python), second, tmp_path / "two.json")
    assert one == two
    assert str(tmp_path) not in one and sys.prefix not in one and "/site-packages/" not in one
    assert '"via"' in one and '"file": "copy.py"' in one
