"""The scan's recompile probe and ``gate --recompiles`` on real captures (world size 1, aot_eager).

The planted model (``fixtures/models/recompiler.py``) changes a Python string attribute of its
blocks on every forward, so a compiled block recompiles on every step; the clean planted model
only recompiles once, when the probe's new sequence length makes that dimension dynamic.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_paths import FIXTURES
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.report import render
from gbdoctor.scan import scan
from gbdoctor.scan.probe import probe_seq_len
from gbdoctor.spec import load_spec

MODELS = FIXTURES / "models"


def _write_spec(path: Path, factory: str, flavor: str, extra: str = "") -> Path:
    path.write_text(
        f'[model]\nname = "custom"\nflavor = "{flavor}"\nfactory = "{MODELS / factory}:build"\n'
        "[training]\nlocal_batch_size = 2\nseq_len = 32\n[gbdoctor]\nbatch_size = 2\nseq_len = 32\n"
        + extra
    )
    return path


@pytest.fixture(scope="module")
def scans(tmp_path_factory):
    """(clean scan, recompiler scan), both of the same spec path, as a model edit would make them."""
    folder = tmp_path_factory.mktemp("probe")
    spec_path = folder / "model.toml"
    clean = scan(
        load_spec(_write_spec(spec_path, "planted.py", "clean")), strategy="block", recompiles=True
    )
    recompiling = scan(
        load_spec(_write_spec(spec_path, "recompiler.py", "tiny")),
        strategy="block",
        recompiles=True,
    )
    return folder, spec_path, clean, recompiling


def test_probe_lengths():
    assert [probe_seq_len(64, s) for s in (1, 2)] == [32, 48]
    assert [probe_seq_len(32, s) for s in (1, 2)] == [16, 24]
    assert [probe_seq_len(8, s) for s in (1, 2)] == [8, 8]  # too short to change: new data only


def test_a_clean_block_recompiles_once_for_the_new_length(scans):
    _, _, clean, _ = scans
    for block in clean.blocks:
        if block.same_as is not None:
            continue
        assert block.recompiles, block.fqn
        assert all(r.step == 1 and not r.measured for r in block.recompiles)
        # Dynamo's automatic dynamic shapes: the size guard of the changed dimension.
        assert any("size mismatch" in r.reason for r in block.recompiles)


def test_a_block_that_recompiles_every_step_is_caught_with_its_guard(scans):
    _, _, _, recompiling = scans
    for block in recompiling.blocks:
        if block.same_as is not None:
            continue
        steady = [r for r in block.recompiles if r.measured]
        assert steady and all(r.step == 2 for r in steady), block.fqn
        assert all("owner_tag ==" in r.reason for r in steady)
        # The guard's user frame, with a machine-independent path (the fixture lives outside the cwd
        # only when the tests run from elsewhere; inside the repo it is relative).
        assert all(r.location and r.location.endswith("recompiler.py:94") for r in steady)
    # Breaks, events and graphs come from the capture step alone: the probe adds none.
    assert all(not b.breaks and not b.events and b.graph_count == 1 for b in recompiling.blocks)
    text = render(recompiling, "table")
    assert "Recompiles when a block runs again" in text and "every step" in text


def test_without_ac_regions_the_probe_recompiles_without_aot_autograd(tmp_path, monkeypatch):
    """With no AC region (no higher-order op in its graphs) the probe's re-compiles skip
    AOTAutograd (``capture/recording_backend.py``): the every-step guard is still caught in
    step 2, and only the probe's compiles took the short path."""
    from gbdoctor.capture import recording_backend

    spec = _write_spec(
        tmp_path / "model.toml", "recompiler.py", "tiny", '[activation_checkpoint]\nmode = "none"\n'
    )
    short: list[bool] = []
    real = recording_backend._higher_order_ops

    def watched(gm):
        found = real(gm)
        short.append(not found)
        return found

    monkeypatch.setattr(recording_backend, "_higher_order_ops", watched)
    report = scan(load_spec(spec), strategy="block", recompiles=True)
    assert short and all(short)  # asked only while probing, and no graph had a HOP
    for block in report.blocks:
        if block.same_as is None:
            steady = [r for r in block.recompiles if r.measured]
            assert steady and all("owner_tag ==" in r.reason for r in steady), block.fqn


def test_graphs_with_higher_order_ops_keep_aot_autograd_in_the_probe():
    """A checkpoint region replayed as traced re-applies its in-place updates and its backward
    fails: such graphs go through AOTAutograd in the probe too."""
    import torch
    import torch.utils.checkpoint

    from gbdoctor.capture.recording_backend import make_recording_backend

    class Probing:
        graph_checks: list = []

        def recording(self):
            return None

        def probing(self):
            return True

    backend = make_recording_backend(Probing(), lambda: "layers.0")
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def plain(x):
        return x.sin() * 2

    def checkpointed(x):
        return torch.utils.checkpoint.checkpoint(plain, x, use_reentrant=False)

    x = torch.randn(4, requires_grad=True)
    for fn in (plain, checkpointed):
        torch.compile(fn, backend=keep, fullgraph=True)(x)
    torch.compiler.reset()
    inputs = [torch.randn(4, requires_grad=True)]
    assert backend(graphs[0], inputs) == graphs[0].forward  # Dynamo's graph, run as traced
    compiled = backend(graphs[1], inputs)  # AOTAutograd's
    assert compiled != graphs[1].forward
    out = compiled(*inputs)
    (out[0] if isinstance(out, (tuple, list)) else out).sum().backward()
    assert inputs[0].grad is not None


def test_gate_recompiles_fails_on_the_recompiling_model(scans, monkeypatch):
    folder, _, clean, recompiling = scans
    monkeypatch.chdir(folder)
    runner = CliRunner()
    (folder / "clean.json").write_text(render(clean, "json"))
    (folder / "recompiling.json").write_text(render(recompiling, "json"))
    baseline = folder / "baseline.json"
    made = runner.invoke(
        app, ["gate", "--scan", "clean.json", "--baseline", str(baseline), "--update-baseline"]
    )
    assert made.exit_code == 0, made.output
    same = runner.invoke(
        app, ["gate", "--scan", "clean.json", "--baseline", str(baseline), "--recompiles"]
    )
    assert same.exit_code == 0, same.output
    failed = runner.invoke(
        app,
        [
            "gate",
            "--scan",
            "recompiling.json",
            "--baseline",
            str(baseline),
            "--recompiles",
            "--format",
            "json",
        ],
    )
    assert failed.exit_code == 1, failed.output
    assert "recompiles on every step" in failed.output and "owner_tag" in failed.output
    # Without --recompiles the recompiles are reported, not gated on.
    plain = runner.invoke(app, ["gate", "--scan", "recompiling.json", "--baseline", str(baseline)])
    assert plain.exit_code == 0, plain.output


@pytest.mark.extra("torchtitan")
def test_torchtitan_scans_run_the_probe(tmp_path):
    """The installed torchtitan scans through the one per-block pipeline, so ``--recompile-probe``
    measures its blocks too (it used to be refused): the JSON says the probe ran."""
    import json

    out = tmp_path / "scan.json"
    result = CliRunner().invoke(
        app,
        [
            "scan",
            "--torchtitan",
            "llama3:llama3_debugmodel",
            "--compile.enable",
            "--recompile-probe",
            "-f",
            "json",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["setup"]["probed_recompiles"] is True
    assert all(isinstance(block["recompiles"], list) for block in data["blocks"])
