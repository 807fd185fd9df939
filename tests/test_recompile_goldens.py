"""The recompile probe's findings on every bundled spec are the recorded ones (issue 46).

``tests/test_golden.py`` pins whole scans, but only the README's command with the probe on: the
others scan with ``GBDOCTOR_RECOMPILE_PROBE=0``. Making the probe cheaper (fewer eager steps,
shared input collection) must not change which guards fail where, so this scans every bundled
spec the probe applies to with ``--recompile-probe`` and compares each block's recompiles (step,
measured, guard, frame, location, hint) and the probe's notes with
``fixtures/golden/recompiles/<name>.json``, recorded before that work. DeepSpeed specs capture
whole engine steps and record their recompiles there (their scan goldens pin them); the
installed torchtitan's runs are not probed (docs/recompiles.md).

Twelve real scans, about 15 minutes on a loaded 2-core machine: only with
``GBDOCTOR_GOLDEN=all`` (as test_golden's full set). Regenerate after an intended change::

    GBDOCTOR_REGENERATE_GOLDEN=1 python -m pytest -q tests/test_recompile_goldens.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from golden_runs import (
    ALL,
    REGENERATE,
    first_difference,
    golden_environment,
    installed_version,
    recorded_versions,
)
from repo_paths import FIXTURES, REPO

GOLDEN = FIXTURES / "golden" / "recompiles"
README = ("--strategy", "titan-v0.2.0", "--set", "activation_checkpoint.mode=none")
CASES = {
    name: (f"fixtures/{name}.toml",)
    for name in (
        "custom_tiny",
        "deepseek_v3_debug",
        "deepseek_v3_debug_ep2",
        "llama3_debug",
        "llama3_debug_cp2",
        "llama3_debug_dp2",
        "llama3_debug_dp2tp2",
        "llama3_debug_pp2",
        "llama3_debug_tp2",
        "llama4_debug",
        "llama4_debug_ep2",
        "llama4_debug_tp2",
    )
} | {"llama4_debug_ep2_readme": ("fixtures/llama4_debug_ep2.toml", *README)}


def probe_findings(report: dict) -> dict:
    """What the probe found in a scan's JSON: every block's recompiles, and its notes."""
    return {
        "probed_recompiles": report["setup"]["probed_recompiles"],
        "blocks": [
            {"fqn": b["fqn"], "same_as": b["same_as"], "recompiles": b["recompiles"]}
            for b in report["blocks"]
        ],
        "probe_notes": [n for n in report["notes"] if "recompile probe" in n],
    }


def test_every_probed_spec_is_listed():
    """A new bundled spec joins the cases (or is named here as not probed)."""
    not_probed = {"deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3"}
    bundled = {p.stem for p in FIXTURES.glob("*.toml")}
    assert bundled - not_probed == {n for n in CASES if n != "llama4_debug_ep2_readme"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_probe_findings_match_their_golden(name, tmp_path):
    if not ALL:
        pytest.skip("in the full golden set only: GBDOCTOR_GOLDEN=all")
    if not REGENERATE and recorded_versions().get("torch") != installed_version("torch"):
        pytest.skip("goldens recorded with another torch: Dynamo's guard messages differ")
    out = tmp_path / f"{name}.json"
    env = golden_environment()
    # As recorded: guard values under EP are routing counts, which float summation order (the
    # thread count) could move.
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "gbdoctor.cli", "scan", *CASES[name], "--recompile-probe"]
        + ["--format", "json", "--output", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    produced = json.dumps(probe_findings(json.loads(out.read_text())), indent=2, sort_keys=True)
    golden = GOLDEN / f"{name}.json"
    if REGENERATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(produced + "\n")
        return
    expected = golden.read_text().rstrip("\n")
    assert produced == expected, f"{name}: recompiles differ from {golden.relative_to(REPO)}:\n" + (
        first_difference(expected, produced)
    )
