"""Fidelity: gbdoctor's per-block answer against what Dynamo does to each construct class.

The model (fixtures/models/frame_shapes.py) plants one frame shape per flavor; its ``EXPECTED``
table was measured with plain ``torch.compile(block, backend="eager")`` and the graph-break log,
one break per statement per block (the oracle check, ``scan --oracle``, re-measures it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from repo_paths import FIXTURES

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


@pytest.mark.parametrize("flavor", ["autograd_function", "nested", "nested_after_break", "resume"])
def test_one_break_per_statement_whatever_frames_dynamo_meets_it_in(flavor, scanned):
    """A custom autograd.Function's forward is traced inside its HOP and again as a frame of its
    own; a helper after a break runs in Dynamo's continuation: each statement is one break."""
    expected, _ = SHAPES.EXPECTED[flavor]
    report = scanned(flavor)
    assert [_breaks(b) for b in report.blocks] == [expected] * len(report.blocks)
    lines = [b.location.line for b in report.blocks[0].breaks]
    assert len(set(lines)) == len(lines) == expected


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
