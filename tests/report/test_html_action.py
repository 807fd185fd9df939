"""The composite action (action.yml) and the pre-commit hook (.pre-commit-hooks.yaml), run
locally: each ``run:`` step of the action goes through bash with its ``${{ }}`` expressions
replaced as Actions would, and the hook's entry runs with its arguments."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from repo_paths import FIXTURES, REPO

ACTION = yaml.safe_load((REPO / "action.yml").read_text())
HOOKS = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
SCAN = FIXTURES / "golden" / "scan" / "llama4_debug.json"
BASELINE = FIXTURES / "baselines" / "debug-specs.json"


def _gbdoctor_on_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``gbdoctor`` is this checkout's (as the action's install gives)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "gbdoctor"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m gbdoctor "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _expand(text: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        expr = match.group(1).strip()
        if expr.startswith("inputs."):
            return inputs[expr.removeprefix("inputs.")]
        if expr.startswith("steps.gate.outputs."):
            return outputs.get(expr.removeprefix("steps.gate.outputs."), "")
        raise AssertionError(f"the local runner does not know {expr!r}")

    return re.sub(r"\$\{\{(.*?)\}\}", value, text)


def run_action(tmp_path: Path, **given: str) -> tuple[int, dict[str, str], list[dict]]:
    """The action's steps in order: (exit status of the job, step outputs, uploads)."""
    inputs = {name: str(spec.get("default", "")) for name, spec in ACTION["inputs"].items()}
    inputs.update(given)
    env = _gbdoctor_on_path(tmp_path)
    output_file, summary = tmp_path / "github_output", tmp_path / "summary.md"
    env.update(
        GITHUB_OUTPUT=str(output_file),
        GITHUB_STEP_SUMMARY=str(summary),
        GITHUB_ACTION_PATH=str(REPO),
        GITHUB_ACTIONS="true",
    )
    outputs: dict[str, str] = {}
    uploads: list[dict] = []
    for step in ACTION["runs"]["steps"]:
        condition = step.get("if", "")
        if condition == "inputs.install == 'true'" and inputs["install"] != "true":
            continue
        if "uses" in step:
            assert step["uses"].startswith("actions/upload-artifact@")
            path = tmp_path / _expand(step["with"]["path"], inputs, outputs)
            if path.is_file():  # hashFiles(...) != ''
                uploads.append({k: _expand(v, inputs, outputs) for k, v in step["with"].items()})
            continue
        step_env = env | {
            k: _expand(str(v), inputs, outputs) for k, v in step.get("env", {}).items()
        }
        done = subprocess.run(
            ["bash", "-e", "-c", _expand(step["run"], inputs, outputs)],
            cwd=tmp_path,
            env=step_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if output_file.exists():
            for line in output_file.read_text().splitlines():
                key, _, val = line.partition("=")
                outputs[key] = val
        if done.returncode != 0:
            return done.returncode, outputs, uploads
    return 0, outputs, uploads


def _baseline_without_the_spec(tmp_path: Path) -> Path:
    data = json.loads(BASELINE.read_text())
    del data["specs"]["fixtures/llama4_debug.toml"]
    data["simulated"] = [key for key in data["simulated"] or [] if key in data["specs"]]
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("passed", [True, False])
def test_action_gates_writes_the_summary_and_uploads_the_report(
    tmp_path: Path, passed: bool
) -> None:
    baseline = BASELINE if passed else _baseline_without_the_spec(tmp_path)
    status, outputs, uploads = run_action(
        tmp_path, install="false", baseline=str(baseline), args=f"--scan {SCAN}"
    )
    expected = 0 if passed else 1
    assert status == expected and outputs["exit-code"] == str(expected)
    summary = (tmp_path / "summary.md").read_text()
    assert ("## gbdoctor gate: passed" if passed else "## gbdoctor gate: FAILED") in summary
    assert "the artifact `gbdoctor-report`" in summary
    # The report is uploaded whether the gate passed or not.
    assert uploads == [{"name": "gbdoctor-report", "path": "gbdoctor-report.html"}]
    page = (tmp_path / "gbdoctor-report.html").read_text()
    assert "Gate:" in page and "Scan: fixtures/llama4_debug.toml" in page
    assert ("PASSED" if passed else "spec not in baseline") in page


def test_pre_commit_hook_runs_the_gate(tmp_path: Path) -> None:
    (hook,) = HOOKS
    assert hook["id"] == "gbdoctor-gate" and hook["language"] == "python"
    assert hook["pass_filenames"] is False  # the gate scans specs, not the changed files
    args = [*shlex.split(hook["entry"]), "--scan", str(SCAN), "--baseline", str(BASELINE)]
    done = subprocess.run(
        args, cwd=tmp_path, env=_gbdoctor_on_path(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "gbdoctor gate: PASSED" in done.stdout
