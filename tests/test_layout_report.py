"""``python -m tools.layout_report`` prints issue 41's counts; each counter can count."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

from repo_paths import REPO

if str(REPO) not in sys.path:  # tools/ is a package of the repository, not of the install
    sys.path.insert(0, str(REPO))

from tools import layout_report  # noqa: E402

HEADINGS = (
    "format registries",
    "modules outside frameworks/ naming a framework (not moved yet)",
    "duck-typed framework members",
    "Any in frameworks/interface.py",
    "mypy ignore_errors modules",
    "modules missing from docs/architecture.md",
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
    # What this branch brought to 0: the interface is typed and every optional member is a
    # capability callers test with isinstance.
    assert counts["duck-typed framework members"] == "0"
    assert counts["Any in frameworks/interface.py"] == "0"
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
