"""``python -m tools.layout_report`` prints issue 41's counts; each counter can count."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys

from repo_paths import REPO

from tools import layout_report  # tests/conftest.py puts the repository on sys.path

HEADINGS = (
    "format registries",
    "modules outside frameworks/ naming a framework (not moved yet)",
    "duck-typed framework members",
    "Any in frameworks/interface.py",
    "mypy ignore_errors modules",
    "modules missing from docs/architecture.md",
    "flat test files",
)


def test_the_report_prints_every_count():
    done = subprocess.run(
        [sys.executable, "-m", "tools.layout_report"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    counts = dict(re.findall(r"^(\S.*?): (\d+)", done.stdout, re.M))
    assert tuple(counts) == HEADINGS
    # What the branches brought to 0 (or 1): the interface is typed and every optional member
    # is a capability callers test with isinstance; one format registry (report/formats.py).
    assert counts["format registries"] == "1"
    assert counts["duck-typed framework members"] == "0"
    assert counts["Any in frameworks/interface.py"] == "0"
    # Tests mirror the package (issue 41): a test file in no package's folder fails here.
    assert counts["flat test files"] == "0", done.stdout
    # Every module the layering test lets name a framework for now is listed under its count.
    waiting = int(counts["modules outside frameworks/ naming a framework (not moved yet)"])
    assert waiting == len({m for m, _ in layout_report._layering().FRAMEWORK_NOT_MOVED})


def test_each_counter_counts_a_planted_case(tmp_path):
    package = tmp_path / "gbdoctor"
    shutil.copytree(REPO / "gbdoctor", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "scan" / "duck.py").write_text(
        "def f(framework, spec):\n    return getattr(framework, 'meta_model', None)\n"
    )
    interface = package / "frameworks" / "interface.py"
    lines = interface.read_text().splitlines()
    interface.write_text("\n".join([*lines, "", "from typing import Any", "", "X: Any = 1", ""]))
    (package / "report" / "extra.py").write_text("EXTRA_FORMATS = ('csv',)\n")
    (package / "run" / "acme.py").write_text("FLAG = '--deepspeed-config'\n")
    (tmp_path / "pyproject.toml").write_text(
        '[[tool.mypy.overrides]]\nmodule = ["gbdoctor.a", "gbdoctor.b"]\nignore_errors = true\n'
    )
    before = {c.what: c for c in layout_report.report(REPO)}
    naming_before = before["modules outside frameworks/ naming a framework (not moved yet)"]
    duck = layout_report.duck_typed_members(package)
    assert duck.items == ("gbdoctor.scan.duck:2 getattr(..., 'meta_model')",)
    assert layout_report.any_in_interface(package).items == (f"interface.py:{len(lines) + 4}",)
    formats = layout_report.format_registries(package)
    assert formats.value == before["format registries"].value + 1
    assert "gbdoctor.report.extra.EXTRA_FORMATS" in formats.items
    naming = layout_report.framework_naming_modules(package)
    assert "gbdoctor.run.acme" not in naming.items  # not listed as waiting: the test fails it
    total = int(naming_before.detail.split(" in all")[0])
    assert naming.detail.startswith(f"{total + 1} in all")
    assert layout_report.mypy_ignore_errors(tmp_path / "pyproject.toml").value == 2
    missing = layout_report.modules_missing_from_architecture(
        package, REPO / "docs" / "architecture.md"
    )
    assert {"gbdoctor.scan.duck", "gbdoctor.run.acme"} <= set(missing.items)


def test_the_flat_test_count_finds_a_test_outside_the_mirror(tmp_path):
    """A test at ``tests/`` that is not a whole-repository one, and one in a folder no package
    has, are flat; one in a package's folder, a top-level module's or a framework's is not."""
    package = tmp_path / "gbdoctor"
    (package / "scan").mkdir(parents=True)
    (package / "frameworks" / "deepspeed").mkdir(parents=True)
    (package / "spec.py").write_text("")
    tests = tmp_path / "tests"
    placed = (
        "test_docs.py",
        "test_spec.py",
        "scan/test_scan.py",
        "spec/test_spec_load.py",
        "frameworks/deepspeed/test_ds.py",
        "corpus/test_planted.py",
        "scan/extra/test_deeper.py",
    )
    for rel in placed:
        (tests / rel).parent.mkdir(parents=True, exist_ok=True)
        (tests / rel).write_text("")
    (tests / "scan" / "scan_support.py").write_text("")  # a support module: not a test file
    assert layout_report.flat_test_files(tests, package).items == (
        "tests/corpus/test_planted.py",
        "tests/scan/extra/test_deeper.py",
        "tests/test_spec.py",
    )


# A second registry in each shape the counter knows, none named ``...FORMATS``: a table spelled
# with OutputFormat members, one spelled with the names' strings, a second enum of the names,
# and an if-chain choosing by name (what report/run_formats.py was).
SECOND_REGISTRIES = {
    "members": (
        "from gbdoctor.records.enums import OutputFormat\n"
        "RUN_RENDERERS = {OutputFormat.TABLE: 'a', OutputFormat.JSON: 'b'}\n",
        "gbdoctor.report.planted.RUN_RENDERERS",
    ),
    "strings": (
        "CHOICES = ('table', 'markdown')\n",
        "gbdoctor.report.planted.CHOICES",
    ),
    "enum": (
        "from enum import StrEnum\n"
        "class Layout(StrEnum):\n    TABLE = 'table'\n    HTML = 'html'\n",
        "gbdoctor.report.planted.Layout",
    ),
    "if-chain": (
        "def render(report, fmt):\n"
        "    if fmt == 'json':\n        return '{}'\n"
        "    if fmt == 'table':\n        return ''\n",
        "gbdoctor.report.planted.render (if-chain over json, table)",
    ),
}


def test_the_format_registry_count_finds_a_second_registry(tmp_path):
    package = tmp_path / "gbdoctor"
    shutil.copytree(REPO / "gbdoctor", package, ignore=shutil.ignore_patterns("__pycache__"))
    real = layout_report.format_registries(package)
    assert real.items == ("gbdoctor.report.formats.RENDERERS",)
    for code, found in SECOND_REGISTRIES.values():
        (package / "report" / "planted.py").write_text(code)
        planted = layout_report.format_registries(package)
        assert set(planted.items) == {*real.items, found}, code
    # The vocabulary is not a registry; a single name compared (``format != "table"``) and a
    # table holding one format name (``--emit-config json|python``) are not either.
    (package / "report" / "planted.py").write_text(
        "EMITTERS = {'json': 1, 'python': 2}\ndef notice(fmt):\n    return fmt != 'table'\n"
    )
    assert layout_report.format_registries(package).items == real.items


def test_no_test_module_imports_another():
    """A test module imported by another runs its tests' module code twice and ties two folders'
    files together; what tests share lives in a support module (docs/architecture.md)."""
    importing = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            bad = [n for n in names if n.split(".")[-1].startswith(("test_", "conftest"))]
            importing += [f"{path.relative_to(REPO)}: {n}" for n in bad]
    assert importing == []
