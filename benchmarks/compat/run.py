"""Measure gbdoctor on every supported torch release: one venv per release, versions in turn.

    python benchmarks/compat/run.py [VERSION ...] [--venv-root DIR] [--write-docs] [--tests-only]

For each version (default: the releases of ``gbdoctor.torch_compat.TESTED``):

1. a venv ``DIR/torch-X.Y`` (reused when it exists), ``pip install torch==VERSION`` unless that
   torch is already there;
2. ``pip install -e ".[test]"`` of this checkout, and a check that torch is the same version
   before and after (installing gbdoctor must never replace a user's torch: it fails if it did);
3. the documented test subset (:data:`SUITE`, ``-m "not extra"``), counted from pytest's JUnit XML;
4. a scan of each bundled spec of :data:`SPECS` (``--no-recompile-probe``, JSON), its breaks
   reduced to (block kind, cause, gb_type, location) signatures;
5. ``benchmarks/results/compat/torch-VERSION.json`` with all of it (times, venv size).

``--write-docs`` then rewrites the generated table of docs/versions.md from every results file,
comparing each release's scan signatures with the reference release's (2.13.0, CI's): a
difference is explained by ``gbdoctor/causes/renames.py`` (a rename) or by :data:`EXPLAINED`
(with the upstream link), or flagged "unexplained".

Versions run one after another (the machine this was written on has 2 shared cores); a release
pip cannot install is reported, not skipped. pip's own configuration applies (an index, a local
constraints file via ``PIP_CONSTRAINT``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gbdoctor.causes.renames import GB_RENAMES  # noqa: E402
from gbdoctor.torch_compat import TESTED, release_name  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "compat"
DOCS = REPO / "docs" / "versions.md"
REFERENCE = "2.13.0"

SUITE = (
    "tests/torch_compat/test_torch_compat.py",
    "tests/causes/test_causes.py",
    "tests/gate/test_gate.py",
    "tests/causes/test_known_issues.py",
    "tests/capture/test_cudagraphs.py",
    "tests/summary/test_summary.py",
    "tests/test_layering.py",
)
"""The documented subset: the cause rules with every planted break captured by the running torch
(``test_causes.py``), the gate's identity and rename rules, known torch issues, CUDA-graph
readiness, the torch-range checks. The whole suite is 10-15 min per release on 2 idle cores."""

SPECS = (
    "fixtures/llama3_debug.toml",
    "fixtures/llama4_debug.toml",
    "fixtures/deepseek_v3_debug.toml",
    "fixtures/llama4_debug_ep2.toml",
)
"""The gate's three bundled debug specs and the 2-rank EP spec (FSDP2 + EP on gloo)."""

EXPLAINED: tuple[tuple[str, str], ...] = (
    # (regex searched in "cause gb_type location" of a break row one side lacks, why)
    (
        r"^error RuntimeError: profiler\._record_function_enter_new",
        "torch 2.13+ raises the known per-op SAC + FSDP2 record_function recompute mismatch in "
        "the MoE block (gbdoctor/causes/known_issues.py: pytorch/torchtitan#3427, fixed by "
        "pytorch/pytorch#196862); 2.11 and 2.12 do not raise it on this spec (not bisected), "
        "so they capture the block",
    ),
)
"""Differences that are not a rename of causes/renames.py, each with its upstream link."""


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _torch_of(python: Path) -> str:
    out = _run([str(python), "-c", "import torch; print(torch.__version__)"])
    return out.stdout.strip() if out.returncode == 0 else ""


def _du_mb(path: Path) -> int:
    out = _run(["du", "-sm", str(path)])
    return int(out.stdout.split()[0]) if out.returncode == 0 else -1


def _tests(python: Path, junit: Path) -> dict:
    start = time.monotonic()
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not extra"]
    proc = _run([*cmd, f"--junitxml={junit}", *SUITE], cwd=REPO)
    took = time.monotonic() - start
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failed: list[str] = []
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                counts["failed"] += 1
                failed.append(name)
            elif case.find("skipped") is not None:
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    else:
        counts["errors"] = 1
        failed.append(proc.stdout.strip()[-300:])
    return {"files": list(SUITE), **counts, "failed_tests": failed, "seconds": round(took)}


def signature(report: dict) -> list[list]:
    """A scan's breaks as sorted [kind, cause, gb_type, location, count] rows (first block of
    each kind: repeated blocks are ``same_as`` it)."""
    rows = []
    for block in report["blocks"]:
        if block.get("same_as"):
            continue
        for brk in block["breaks"]:
            loc = brk.get("location")
            where = f"{loc['file']}:{loc['line']}" if loc else ""
            rows.append([block["kind"], brk["cause"], brk["gb_type"], where, brk["count"]])
        if block.get("error"):
            rows.append([block["kind"], "error", block["error"][:120], "", 1])
    return sorted(rows)


def _scans(python: Path, out_dir: Path) -> dict:
    out = {}
    for spec in SPECS:
        target = out_dir / (Path(spec).stem + ".json")
        start = time.monotonic()
        cmd = [str(python), "-m", "gbdoctor", "scan", spec, "--no-recompile-probe"]
        proc = _run([*cmd, "--format", "json", "-o", str(target)], cwd=REPO)
        took = round(time.monotonic() - start)
        if proc.returncode not in (0, 1) or not target.exists():
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            out[spec] = {"exit": proc.returncode, "error": tail, "seconds": took}
            continue
        report = json.loads(target.read_text())
        out[spec] = {
            "exit": proc.returncode,
            "breaks": report["totals"]["breaks"],
            "graphs": report["totals"]["graphs"],
            "errors": report["totals"]["errors"],
            "signature": signature(report),
            "seconds": took,
        }
    return out


def check(version: str, root: Path, *, tests_only: bool = False) -> dict:
    """Install, test and scan under one torch version; the results record (``tests_only``:
    test again and keep the scans of the previous record)."""
    venv = root / f"torch-{'.'.join(version.split('.')[:2])}"
    python = venv / "bin" / "python"
    result: dict = {"requested": version}
    start = time.monotonic()
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], check=True)
    if release_name(_torch_of(python)) != version:
        install = _run([str(python), "-m", "pip", "install", "-q", f"torch=={version}"])
        if install.returncode:
            tail = (install.stderr.strip().splitlines() or ["?"])[-1]
            return result | {"error": f"torch {version} not installable here: {tail}"}
    before = _torch_of(python)
    pip = _run([str(python), "-m", "pip", "install", "-q", "-e", f"{REPO}[test]"])
    after = _torch_of(python)
    result |= {
        "torch": after,
        "install": {
            "torch_before": before,
            "torch_after": after,
            "torch_kept": before == after,
            "pip_exit": pip.returncode,
            "seconds": round(time.monotonic() - start),
        },
    }
    if pip.returncode or before != after:
        return result | {"error": "installing gbdoctor changed torch or failed"}
    work = root / f"results-{version}"
    work.mkdir(parents=True, exist_ok=True)
    result["tests"] = _tests(python, work / "junit.xml")
    previous = RESULTS / f"torch-{version}.json"
    if tests_only and previous.exists():
        result["scans"] = json.loads(previous.read_text())["scans"]
    else:
        result["scans"] = _scans(python, work)
    result["venv_mb"] = _du_mb(venv)
    return result


# ----------------------------------------------------------------------------- docs table

_BEGIN, _END = "<!-- compat-table:begin -->", "<!-- compat-table:end -->"


def _rename_for(a: list, b: list) -> str | None:
    """The renames.py entry that explains row ``a`` (one release) against ``b`` (another)."""
    if a[0] != b[0] or a[1] != b[1] or a[3] != b[3]:
        return None
    for r in GB_RENAMES:
        if {a[2], b[2]} == {r.old_type, r.new_type}:
            return f"renamed by torch {r.since[0]}.{r.since[1]}: {r.old_id} -> {r.new_id} ({r.why})"
    return None


def _explained(row: list) -> str:
    text = f"{row[1]} {row[2]} {row[3]}"
    return next((why for pattern, why in EXPLAINED if re.search(pattern, text)), "**unexplained**")


def differences(rows: list[list], ref: list[list]) -> list[str]:
    """Each break row only one side has, explained or flagged."""
    only_here = [r for r in rows if r not in ref]
    only_ref = [r for r in ref if r not in rows]
    out = []
    for a in only_here:
        match = next(((b, w) for b in only_ref if (w := _rename_for(a, b))), None)
        if match:
            only_ref.remove(match[0])
            out.append(f"{a[2]!r} at `{a[3]}` ({a[0]}): {match[1]}")
            continue
        why = _explained(a)
        out.append(f"extra `{a[1]}` {a[2]!r} x{a[4]} at `{a[3] or '?'}` ({a[0]}): {why}")
    for b in only_ref:
        why = _explained(b)
        out.append(f"missing `{b[1]}` {b[2]!r} x{b[4]} at `{b[3] or '?'}` ({b[0]}): {why}")
    return out


def render(results: list[dict]) -> str:
    results = sorted(results, key=lambda r: [int(x) for x in r["requested"].split(".")])
    ref = next((r for r in results if r["requested"] == REFERENCE), None)
    specs = [Path(s).stem for s in SPECS]
    lines = [
        "| torch | install keeps torch | tests passed | failed | "
        + " | ".join(f"`{s}` breaks/graphs" for s in specs)
        + " | venv MB | minutes |",
        "|---" * (6 + len(specs)) + "|",
    ]
    notes = []
    for r in results:
        if "error" in r and "tests" not in r:
            lines.append(f"| {r['requested']} | {r['error']} |" + " |" * (3 + len(specs)))
            continue
        t = r["tests"]
        cells = []
        for spec in SPECS:
            s = r["scans"][spec]
            cells.append(f"{s['breaks']}/{s['graphs']}" if "breaks" in s else f"exit {s['exit']}")
        took = (
            r["install"]["seconds"] + t["seconds"] + sum(s["seconds"] for s in r["scans"].values())
        )
        kept = "yes" if r["install"]["torch_kept"] else "**no**"
        lines.append(
            f"| {r['torch']} | {kept} | {t['passed']}/{t['passed'] + t['failed']} | "
            f"{t['failed']} | " + " | ".join(cells) + f" | {r['venv_mb']} | {took / 60:.0f} |"
        )
        for name in t["failed_tests"]:
            notes.append(f"- {r['requested']}: test `{name}` failed")
        if ref is not None and r is not ref:
            for spec in SPECS:
                here, there = r["scans"][spec], ref["scans"][spec]
                if "signature" in here and "signature" in there:
                    for d in differences(here["signature"], there["signature"]):
                        notes.append(f"- {r['requested']}, `{Path(spec).stem}`: {d}")
    body = "\n".join(lines)
    diff = "\n".join(notes) or f"- none: every release gives {REFERENCE}'s breaks"
    return f"{_BEGIN}\n{body}\n\nDifferences from {REFERENCE} (CI's release):\n\n{diff}\n{_END}"


def write_docs() -> None:
    results = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("torch-*.json"))]
    text = DOCS.read_text()
    table = render(results)
    if _BEGIN in text:
        text = re.sub(
            re.escape(_BEGIN) + ".*?" + re.escape(_END), lambda _: table, text, flags=re.S
        )
    else:
        text += "\n" + table + "\n"
    DOCS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "versions", nargs="*", help="default: gbdoctor.torch_compat.TESTED (none with --write-docs)"
    )
    parser.add_argument(
        "--venv-root",
        type=Path,
        default=Path(os.environ.get("GBDOCTOR_COMPAT_VENVS", "/tmp/gbdoctor-compat")),
        help="where the per-version venvs live (outside the repository)",
    )
    parser.add_argument(
        "--write-docs", action="store_true", help="rewrite docs/versions.md's table"
    )
    parser.add_argument(
        "--tests-only", action="store_true", help="run the tests again, keep the recorded scans"
    )
    args = parser.parse_args()
    if REPO in args.venv_root.resolve().parents or args.venv_root.resolve() == REPO:
        parser.error("--venv-root must be outside the repository")
    args.venv_root.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.versions and not args.write_docs:
        args.versions = list(TESTED)
    for version in args.versions:
        result = check(version, args.venv_root, tests_only=args.tests_only)
        (RESULTS / f"torch-{version}.json").write_text(json.dumps(result, indent=1) + "\n")
        t = result.get("tests", {})
        print(
            f"torch {result.get('torch', version)}: {result.get('error', '')}"
            f"{t.get('passed', 0)} passed, {t.get('failed', 0)} failed; scans "
            + ", ".join(
                f"{Path(k).stem} {v.get('breaks', 'exit ' + str(v.get('exit')))}"
                for k, v in result.get("scans", {}).items()
            ),
            flush=True,
        )
    if args.write_docs:
        write_docs()


if __name__ == "__main__":
    main()
