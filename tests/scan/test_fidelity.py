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

from gbdoctor.records import BlockReport, Break, DedupeProof, Location, Readiness
from gbdoctor.records.oracle import OracleStatement
from gbdoctor.report.oracle import render_oracle
from gbdoctor.scan import scan
from gbdoctor.scan.oracle import compare, oracle_check
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
    via = brk.via
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


# ------------------------------------------------------------------ proven dedupe


@pytest.mark.parametrize("flavor", sorted(SHAPES.BY_LAYER))
def test_layers_that_only_look_alike_are_captured_not_copied(flavor, scanned):
    """Identical modules whose forward branches on a plain attribute (the layer index, a
    per-layer flag): a layer shares a capture only when the representative's compiled code runs
    on it unchanged; the others are captured and say which guard failed."""
    report = scanned(flavor)
    assert tuple(_breaks(b) for b in report.blocks) == SHAPES.BY_LAYER[flavor]
    for block in report.blocks[1:]:
        if block.same_as is None:
            assert block.dedupe == DedupeProof.GUARDS_FAIL
            assert "guards fail here" in block.dedupe_detail
            assert "breaks differently" in block.dedupe_detail
        else:
            assert block.dedupe in (DedupeProof.GUARDS_PASS, DedupeProof.RETRACED_SAME)
            shared = next(b for b in report.blocks if b.fqn == block.same_as)
            assert _breaks(shared) == _breaks(block)


def test_index_branch_names_the_failed_guard(scanned):
    """Layer 1 fails layer 0's guard on its index but re-traced meets the same (no) breaks, so
    it shares; layer 2 breaks differently and is captured; layer 3 shares layer 2's capture."""
    blocks = scanned("by_index").blocks
    assert [b.same_as for b in blocks] == [None, "layers.0", None, "layers.2"]
    assert blocks[1].dedupe == DedupeProof.RETRACED_SAME
    assert "self.layer_index == 0" in blocks[1].dedupe_detail
    assert blocks[2].dedupe == DedupeProof.GUARDS_FAIL
    assert "breaks differently" in blocks[2].dedupe_detail


def test_per_layer_flag_shares_only_between_layers_with_the_same_flag(scanned):
    blocks = scanned("by_flag").blocks
    assert [b.same_as for b in blocks] == [None, None, "layers.0", "layers.1"]
    assert blocks[2].dedupe == DedupeProof.GUARDS_PASS


@pytest.mark.parametrize("flavor", ["clean", "autograd_function"])
def test_alike_layers_are_proven_identical(flavor, scanned):
    """Layers that trace alike share the first capture, with the proof: every guard passes, or
    only guards on a value computed at run time (the host read's result) fail and the re-trace
    meets no other break."""
    blocks = scanned(flavor).blocks
    assert [b.same_as for b in blocks] == [None, "layers.0", "layers.0", "layers.0"]
    assert blocks[0].dedupe is None
    assert {b.dedupe for b in blocks[1:]} <= {DedupeProof.GUARDS_PASS, DedupeProof.RETRACED_SAME}
    assert all(b.dedupe_detail for b in blocks[1:])


def test_frame_skip_makes_the_proof_impossible_so_layers_are_captured(scanned):
    blocks = scanned("loop").blocks
    assert [b.dedupe for b in blocks[1:]] == [DedupeProof.UNPROVABLE] * 3
    assert all(_breaks(b) == 1 for b in blocks)


# ------------------------------------------------------------------ CUDA-graph readiness


def test_region_sent_to_eager_by_a_break_names_the_break_to_fix_first(tmp_path):
    """Full AC around a block with a print: the checkpointed region runs eagerly, so there is
    nothing to graph; readiness says so and names the break, instead of 'unknown'."""
    spec = write_spec(tmp_path, "resume")
    spec.write_text(spec.read_text().replace('mode = "none"', 'mode = "full"'))
    block = scan(load_spec(spec)).blocks[0]
    assert ("region_eager", "layers.0") in {(e.kind, e.module) for e in block.events}
    ready = block.cudagraphs
    assert ready is not None and ready.status == Readiness.EAGER, ready
    first = min(b.location.line for b in block.breaks)
    assert "layers.0 runs eagerly" in ready.summary and "activation-checkpoint" in ready.summary
    assert 'fix "Failed to trace builtin operator" at ' in ready.summary
    assert f"frame_shapes.py:{first} first" in ready.summary


# ------------------------------------------------------------------ the oracle check


def _scan_and_oracle(spec_path: Path):
    spec = load_spec(spec_path)
    report = scan(spec)
    return report, oracle_check(spec, report)


@pytest.mark.parametrize("flavor", ["stdlib", "by_index", "autograd_function", "loop"])
def test_oracle_agrees_on_each_construct_class(flavor, tmp_path):
    spec = load_spec(write_spec(tmp_path, flavor))
    report = scan(spec)
    checked = oracle_check(spec, report)
    assert checked.agreeing == len(report.blocks) == len(checked.blocks), render_oracle(checked)
    expected = SHAPES.BY_LAYER.get(flavor) or (SHAPES.EXPECTED[flavor][0],) * len(report.blocks)
    assert tuple(len(b.oracle) for b in checked.blocks) == expected


@pytest.mark.parametrize("spec", ["fixtures/custom_tiny.toml", "fixtures/llama3_debug.toml"])
def test_oracle_agrees_on_bundled_specs(spec, monkeypatch):
    monkeypatch.chdir(REPO)
    report, checked = _scan_and_oracle(REPO / spec)
    assert checked.blocks and checked.agreeing == len(checked.blocks), render_oracle(checked)


def test_oracle_flags_a_break_the_scan_missed_and_explains_setup_breaks():
    """The check can fail: a statement only plain compile logs is unexpected; a break only the
    scan has is expected when the training setup put it there."""
    stmt = OracleStatement(file="m.py", line=7, gb_type="Failed to trace builtin operator")
    missed = compare((stmt,), BlockReport(fqn="layers.0", kind="dense"))
    assert [(d.side, d.expected) for d in missed] == [("oracle", False)]
    fsdp = Break(
        cause="fsdp-hook",
        gb_type="Attempted to call function marked as skipped",
        gb_id=None,
        location=Location(file="torch/distributed/fsdp/x.py", line=3),
        module="layers.0",
        in_checkpoint=False,
        component="fsdp",
    )
    block = BlockReport(fqn="layers.0", kind="dense", breaks=(fsdp,))
    (extra,) = compare((), block)
    assert extra.side == "gbdoctor" and extra.expected and "training setup" in extra.explanation


def test_scan_oracle_cli_prints_the_agreement(tmp_path):
    spec = write_spec(tmp_path, "by_flag")
    env = dict(os.environ, PYTHONPATH=str(REPO), GBDOCTOR_RECOMPILE_PROBE="0")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gbdoctor.cli",
            "scan",
            str(spec),
            "--oracle",
            "--format",
            "json",
            "-o",
            str(tmp_path / "out.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "4/4 layers agree with the scan" in done.stderr


class _Scale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * self.weight


def test_a_region_that_reuses_a_siblings_compiled_code_is_not_a_skipped_frame():
    """Two children of one class compiled as separate regions with the one recording backend:
    Dynamo's cache serves the second with the first's graph (every guard passes), so only the
    first produces a graph, yet both ran compiled code. A region with no graph of its own is a
    skipped frame only when nothing compiled ran in it (llama4's MoE ffn_norm under
    titan-v0.2.2's children mode was reported as frame_skipped)."""
    from gbdoctor.capture.session import CaptureSession

    session = CaptureSession()
    first = session.compile_fn(_Scale(), "block.attention_norm", False)
    second = session.compile_fn(_Scale(), "block.ffn_norm", False)
    with session.capture() as raw:
        h = torch.randn(2, 8, requires_grad=True)
        second(first(h) + 1).sum().backward()
    assert raw.error is None
    assert list(raw.graphs) == ["block.attention_norm"]
    assert raw.ran_compiled == {"block.attention_norm", "block.ffn_norm"}
