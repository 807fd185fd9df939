"""The GPU kit's offline path on CPU (benchmarks/gpu/, docs/gpu.md): gbdoctor installs from the
tree with no index, the preinstalled torch untouched, and validate.sh walks every step up to the
first CUDA call, then stops with one line "no CUDA device" (exit 2). The GPU steps themselves run
only on a GPU machine.

Slow (venv + two pip installs, ~20-40 s on 2 busy cores): it is the only test of the install a
GPU image gets, and it runs the real script, not a copy of its commands."""

from __future__ import annotations

import importlib.util
import os
import site
import subprocess
import sys

import pytest
import torch
from repo_paths import REPO


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU validate.sh runs the GPU steps")
def test_offline_install_keeps_torch_and_stops_before_cuda(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    # What prepare.sh puts there for an image that has everything else: setuptools (gbdoctor's
    # build backend). Downloaded by this (online) machine's pip, as prepare.sh does.
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheelhouse)]
        + ["setuptools>=68"],
        capture_output=True,
        text=True,
    )
    assert got.returncode == 0, got.stderr
    # The "image": a venv whose preinstalled packages (torch, typer, ...) are this test
    # environment's, seen through a .pth file, as --system-site-packages shows an image's.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    (purelib,) = {p for p in venv.glob("lib/python*/site-packages")}
    (purelib / "image.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = os.environ | {
        "PYTHON": str(venv / "bin" / "python"),
        "GBDOCTOR_GPU_VENV": str(venv),
        "GBDOCTOR_WHEELHOUSE": str(wheelhouse),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",  # an index use would fail
    }
    proc = subprocess.run(
        ["bash", "benchmarks/gpu/validate.sh", "--out", str(tmp_path / "results")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "no CUDA device"
    assert f"torch {torch.__version__} kept, no index used" in proc.stdout
    # The Accelerate spec joins the four debug specs where the accelerate extra is importable
    # (the venv sees the test environment's packages); else the kit says it is left out.
    accelerate = importlib.util.find_spec("accelerate") is not None
    specs = f"[specs] {4 + accelerate} loaded"
    for step in ("[env]", specs, "[plan] run: gbdoctor run fixtures/llama4_debug_ep2"):
        assert step in proc.stdout, proc.stdout
    assert accelerate or "accelerate is not installed" in proc.stdout
    assert "[plan] timeline fixtures/shapes/packed_flex.toml --shapes packed:" in proc.stdout
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import gbdoctor, torch; print(gbdoctor.__file__)"],
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip() == str(REPO / "gbdoctor" / "__init__.py"), where.stderr
    assert not (tmp_path / "results").exists()  # nothing written before the GPU steps
