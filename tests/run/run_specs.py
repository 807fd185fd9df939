"""The small custom-model spec the ``run`` tests train or build reports for (``fixtures/models``),
shared by ``test_run.py`` and ``test_run_report.py``."""

from __future__ import annotations

from pathlib import Path

from repo_paths import FIXTURES

from gbdoctor.spec import load_spec

MODELS = FIXTURES / "models"


def custom_run_spec(tmp_path: Path, factory: str, flavor: str, extra: str = ""):
    path = tmp_path / f"{Path(factory).stem}_{flavor}.toml"
    path.write_text(
        "[model]\n"
        'name = "custom"\n'
        f'flavor = "{flavor}"\n'
        f'factory = "{MODELS / factory}:build"\n'
        "[training]\nlocal_batch_size = 2\nseq_len = 16\n"
        f"[gbdoctor]\nbatch_size = 2\nseq_len = 16\n{extra}"
    )
    return load_spec(path)
