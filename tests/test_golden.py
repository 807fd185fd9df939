"""Golden behaviour: the JSON ``scan``, ``plan``, ``inspect``, ``gate`` and ``diff`` write for the
bundled specs is byte-identical to the committed copies under ``fixtures/golden/``.

This is the safety net for refactors that must not change behaviour (issue 25): any change to
a command's JSON output, or to its exit code, fails here. Each case runs the real CLI in its own
process (``gbdoctor.cli.main``, the console script's entry point), from the repository root, so
the paths in the reports are the ones users see and no Dynamo state carries over between cases.
The process is forked from a server that imported the CLI and Dynamo once and compiled nothing
(``tests/cli_runs.py``): a fresh interpreter would pay that import again for every case. ``diff``
compiles nothing and runs in the test's own process.

Two absolute directories are masked, because they differ between a CI clone and a developer's
checkout: this Python's site-packages (written ``<site-packages>``; Dynamo's own messages quote
it, e.g. ``skip reason: file matches MOD_SKIPLIST (<site-packages>/torch/_dynamo)`` under EP and
ZeRO-3) and the repository root (``<repo>``; a ZeRO-3 frame-skip event's detail quotes the model
file's path). Both are leaks of machine paths into reports, recorded as they are so that this
test proves behaviour unchanged rather than changing it. Nothing else varies: gbdoctor's output is
deterministic by design (sorted keys, repository-relative paths, no timestamps or timings in
these commands). What the goldens do depend on is the
environment: the Dynamo messages of one torch release, and the versions of the optional
DeepSpeed and torchtitan packages. A case is skipped, with the reason, when the installed
version is not the one the goldens were recorded with (``fixtures/golden/versions.json``): a
different torch changes break messages, which is not a gbdoctor regression.

``GBDOCTOR_AVAILABLE_MEMORY_GIB`` is pinned to 16 so the real-or-simulated rule
(``scan.estimate.decide``) decides the same on every machine.

Regenerate after an intended change (then review ``git diff fixtures/golden``)::

    GBDOCTOR_REGENERATE_GOLDEN=1 python -m pytest -q tests/test_golden.py

Two tiers. By default a quick set runs (about 2 minutes on an idle 2-core CPU machine): one
scan per setup path (in-process, spawned ranks, simulated, DeepSpeed, the installed torchtitan),
a plan, an inspect, the gate and diff. Every other bundled spec (``full=True`` below: the
remaining multi-rank scans and the plans that re-scan MoE models, about 7 more minutes) runs
with ``GBDOCTOR_GOLDEN=all``; run that before landing a refactor. Cases over 15 s are marked
``slow`` as well.
"""

from __future__ import annotations

import json
import re
import sysconfig
from dataclasses import dataclass

import pytest
from cli_runs import Child, in_process
from golden_runs import (
    ALL,
    REGENERATE,
    VERSIONS,
    first_difference,
    golden_environment,
    installed_version,
    recorded_versions,
)
from repo_paths import EXTRA_INSTALL, FIXTURES, REPO

GOLDEN = FIXTURES / "golden"
OUT = "{out}"
"""Placeholder in a case's arguments for the file the command writes (the golden's twin)."""


@dataclass(frozen=True)
class Case:
    command: str
    name: str
    args: tuple[str, ...]
    exit_code: int = 0
    needs: tuple[str, ...] = ("torch",)
    """Distributions whose installed version must match the recorded one."""
    slow: bool = False
    full: bool = False
    """Only with ``GBDOCTOR_GOLDEN=all`` (see the module docstring)."""

    @property
    def golden(self):
        return GOLDEN / self.command / f"{self.name}.json"

    @property
    def id(self) -> str:
        return f"{self.command}-{self.name}"


def _scan(name: str, spec: str, *extra: str, exit_code=0, slow=False, full=False, needs=()) -> Case:
    return Case(
        "scan",
        name,
        ("scan", spec, *extra, "--format", "json", "--output", OUT),
        exit_code=exit_code,
        needs=("torch", *needs),
        slow=slow or full,
        full=full,
    )


def _plan(name: str, spec: str, *, exit_code=0, slow=False, full=False, needs=()) -> Case:
    return Case(
        "plan",
        name,
        ("plan", spec, "--emit-config", "json", "--output", OUT),
        exit_code=exit_code,
        needs=("torch", *needs),
        slow=slow or full,
        full=full,
    )


DS = ("deepspeed",)
TITAN = ("torchtitan",)
DEBUG_SCANS = tuple(
    f"fixtures/golden/scan/{name}.json"
    for name in ("llama3_debug", "llama4_debug", "deepseek_v3_debug")
)

CASES = (
    # Every bundled spec scanned: single-rank in-process, multi-rank on spawned ranks.
    _scan("llama3_debug", "fixtures/llama3_debug.toml"),
    _scan("custom_tiny", "fixtures/custom_tiny.toml"),
    _scan("llama4_debug", "fixtures/llama4_debug.toml", full=True),
    _scan("deepseek_v3_debug", "fixtures/deepseek_v3_debug.toml", full=True),
    _scan("llama3_debug_dp2", "fixtures/llama3_debug_dp2.toml", slow=True),
    _scan("llama3_debug_tp2", "fixtures/llama3_debug_tp2.toml", full=True),
    _scan("llama3_debug_dp2tp2", "fixtures/llama3_debug_dp2tp2.toml", full=True),
    _scan("llama4_debug_ep2", "fixtures/llama4_debug_ep2.toml", full=True),
    _scan("llama4_debug_tp2", "fixtures/llama4_debug_tp2.toml", full=True),
    # The README's command, recompile probe on: tests/report/test_terminal_layout.py renders it.
    _scan(
        "llama4_debug_ep2_readme",
        "fixtures/llama4_debug_ep2.toml",
        "--strategy",
        "titan-v0.2.0",
        "--set",
        "activation_checkpoint.mode=none",
        "--recompile-probe",
        full=True,
    ),
    _scan("deepseek_v3_debug_ep2", "fixtures/deepseek_v3_debug_ep2.toml", full=True),
    _scan("deepspeed_zero1", "fixtures/deepspeed_zero1.toml", full=True, needs=DS),
    _scan("deepspeed_zero2", "fixtures/deepspeed_zero2.toml", slow=True, needs=DS),
    _scan("deepspeed_zero3", "fixtures/deepspeed_zero3.toml", full=True, needs=DS),
    # A full-size production config, simulated (fake process group, fake tensors).
    _scan("llama3_8b_simulated", "fixtures/torchtitan_v0.2.2/llama3_8b.toml", "--simulate"),
    # The installed torchtitan (>= 0.3) set up by its own code.
    Case(
        "scan",
        "torchtitan_llama3_debugmodel",
        ("scan", "--torchtitan", "llama3:llama3_debugmodel", "--format", "json", "-o", OUT),
        needs=("torch", *TITAN),
        slow=True,
    ),
    _plan("llama3_debug", "fixtures/llama3_debug.toml"),
    _plan("custom_tiny", "fixtures/custom_tiny.toml", full=True),
    _plan("llama4_debug", "fixtures/llama4_debug.toml", full=True),
    _plan("deepseek_v3_debug", "fixtures/deepseek_v3_debug.toml", full=True),
    _plan("llama3_8b", "fixtures/torchtitan_v0.2.2/llama3_8b.toml", full=True),
    _plan("deepspeed_zero2", "fixtures/deepspeed_zero2.toml", full=True, needs=DS),
    Case(
        "inspect",
        "llama4_debug",
        ("inspect", "fixtures/llama4_debug.toml", "--format", "json", "--output", OUT),
    ),
    Case(
        "inspect",
        "deepspeed_zero3",
        ("inspect", "fixtures/deepspeed_zero3.toml", "--format", "json", "--output", OUT),
        needs=("torch", *DS),
        full=True,
        slow=True,
    ),
    # The gate over the golden scans of the README's three specs plus one the baseline lacks
    # (a regression: exit 1), and the baseline those scans write.
    Case(
        "gate",
        "debug_specs_and_custom",
        (
            "gate",
            *(
                arg
                for path in (*DEBUG_SCANS, "fixtures/golden/scan/custom_tiny.json")
                for arg in ("--scan", path)
            ),
            "--baseline",
            "fixtures/baselines/debug-specs.json",
            "--format",
            "json",
            "--output",
            OUT,
        ),
        exit_code=1,
    ),
    Case(
        "gate",
        "baseline_written",
        (
            "gate",
            *(arg for path in DEBUG_SCANS for arg in ("--scan", path)),
            "--baseline",
            OUT,
            "--update-baseline",
        ),
    ),
    # A spec the gate scans itself, under the baseline's pinned Dynamo settings.
    Case(
        "gate",
        "llama3_debug_scanned",
        (
            "gate",
            "fixtures/llama3_debug.toml",
            "--baseline",
            "fixtures/baselines/debug-specs.json",
            "--format",
            "json",
            "--output",
            OUT,
        ),
        slow=True,
    ),
    Case(
        "diff",
        "llama4_new_break",
        (
            "diff",
            "fixtures/scans/llama4_before.json",
            "fixtures/scans/llama4_after_new_break.json",
            "--format",
            "json",
            "--output",
            OUT,
        ),
        exit_code=1,
    ),
)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            c,
            id=c.id,
            # A case of an optional extra skips without it (naming the install command) and
            # runs in .ci/run's extras stage (-m extra).
            marks=[pytest.mark.slow] * c.slow
            + [pytest.mark.extra(dist) for dist in c.needs if dist in EXTRA_INSTALL],
        )
        for c in CASES
    ],
)
def test_command_json_matches_its_golden(case: Case, tmp_path):
    if case.full and not ALL:
        pytest.skip("in the full golden set only: GBDOCTOR_GOLDEN=all")
    recorded = recorded_versions()
    for dist in case.needs:
        installed = installed_version(dist)
        if installed is None:
            pytest.skip(f"{dist} is not installed")
        if not REGENERATE and recorded.get(dist) != installed:
            pytest.skip(
                f"goldens recorded with {dist} {recorded.get(dist)}, this is {installed}: "
                "regenerate them under the version gbdoctor is measured against"
            )
    out = tmp_path / case.golden.name
    args = [str(out) if a == OUT else a for a in case.args]
    if case.command == "diff":
        # Two JSON files read, nothing compiled or spawned: in this process, which spares the
        # inner loop (where this is the only case) the fork server's start.
        done = in_process(*args, cwd=REPO, **golden_environment())
    else:
        done = Child(*args, cwd=REPO, env=golden_environment()).wait(timeout=900)
    assert done.returncode == case.exit_code, done.stderr[-4000:]
    if args[0] in ("scan", "plan"):
        # stderr is a pipe here, as in CI: progress is plain lines (cli.output.ProgressBar).
        assert re.search(r"^\[ *\d+\.\d s\] \S", done.stderr, re.MULTILINE), done.stderr[-2000:]
    produced = _masked(out.read_bytes())
    if REGENERATE:
        case.golden.parent.mkdir(parents=True, exist_ok=True)
        case.golden.write_bytes(produced)
        versions = recorded_versions()
        versions.update({dist: installed_version(dist) for dist in case.needs})
        VERSIONS.write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
        return
    assert case.golden.exists(), f"no golden {case.golden}: regenerate (see the module docstring)"
    expected = case.golden.read_bytes()
    if produced != expected:
        pytest.fail(
            f"{case.id}: JSON differs from {case.golden.relative_to(REPO)}:\n"
            + first_difference(expected.decode(), produced.decode())
        )


def _masked(output: bytes) -> bytes:
    site_packages = sysconfig.get_paths()["purelib"].encode()
    output = output.replace(site_packages, b"<site-packages>")
    return output.replace(str(REPO).encode(), b"<repo>")
