"""A framework is a plug-in: a distribution installed beside gbdoctor registers one through the
``gbdoctor.frameworks`` entry-point group, and ``gbdoctor scan`` finds it and scans a spec naming it.

``tests/plugins/gbdoctor_toy/`` is such a distribution (the example of ``docs/plugins.md``): its
``Toy`` compiles every block whole, without fullgraph, set up by ``setup/``'s building blocks.
The tests install it with pip into a temporary directory and put that on the path, as a user's
``pip install`` would; without it, no ``toy`` framework exists.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from repo_paths import FIXTURES, REPO

from gbdoctor.errors import PluginError, SpecError
from gbdoctor.frameworks import framework_names, registry
from gbdoctor.frameworks.interface import (
    PLUGIN_API_VERSION,
    Framework,
    HasEmitters,
    HasRunModes,
    Planner,
)
from gbdoctor.frameworks.registry import PluginSource, load_plugin, plugin_sources
from gbdoctor.scan import scan
from gbdoctor.spec import load_spec

TOY_SOURCE = REPO / "tests" / "plugins" / "gbdoctor_toy"


@pytest.fixture(scope="session")
def toy_site(tmp_path_factory) -> Path:
    """The Toy distribution installed (``pip install --target``) into a directory of its own."""
    build = tmp_path_factory.mktemp("toy-src")
    source = build / "gbdoctor_toy"
    # pip builds in the source tree: build a copy, so the repository stays clean.
    shutil.copytree(TOY_SOURCE, source, ignore=shutil.ignore_patterns("__pycache__", "build"))
    target = tmp_path_factory.mktemp("toy-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "--target", str(target), str(source)],
        check=True,
        timeout=600,
    )
    return target


@pytest.fixture
def fresh_registry(monkeypatch):
    """The registry reloaded from the entry points on next use, restored afterwards."""
    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(registry, "_loaded", False)


@pytest.fixture
def toy(toy_site, fresh_registry, monkeypatch):
    """The installed Toy distribution on ``sys.path``: its framework, as the registry loads it."""
    monkeypatch.syspath_prepend(str(toy_site))
    importlib.invalidate_caches()
    return registry.framework_named("toy")


def _toy_spec(tmp_path, extra: str = "", flavor: str = "tiny", factory: str = "tiny_custom.py"):
    path = tmp_path / "toy.toml"
    path.write_text(
        f'[model]\nname = "custom"\nflavor = "{flavor}"\n'
        f'factory = "{FIXTURES / "models" / factory}:build"\n'
        f"[training]\nlocal_batch_size = 2\nseq_len = 16\n"
        f'[gbdoctor]\nframework = "toy"\n{extra}'
    )
    return path


def test_a_registered_framework_is_known_to_specs_and_scans(toy, tmp_path):
    assert framework_names()[-1] == "toy"
    spec = load_spec(_toy_spec(tmp_path))
    assert spec.gbdoctor.strategy == "whole"  # the framework's default, set by its check_spec
    report = scan(spec, recompiles=False)
    assert report.setup.framework == "toy" and report.setup.strategy == "whole"
    assert report.blocks and all(b.error is None for b in report.blocks)
    # Compiled whole without fullgraph: regions, but none claimed fullgraph.
    assert all(b.regions and not b.fullgraph_regions for b in report.blocks)


def test_its_spec_checks_and_strategy_names_apply(toy, tmp_path):
    with pytest.raises(SpecError, match="is not a known strategy \\(framework 'toy'\\)"):
        load_spec(_toy_spec(tmp_path, 'strategy = "block"\n'))
    with pytest.raises(SpecError, match="the toy framework runs on one rank"):
        load_spec(_toy_spec(tmp_path), ["parallelism.data_parallel_shard_degree=2"])


def test_an_unregistered_framework_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(SpecError, match="'toy' is not one of torchtitan, deepspeed"):
        load_spec(_toy_spec(tmp_path))


def test_the_toy_has_the_core_only_and_plan_refuses_it(toy, tmp_path):
    assert isinstance(toy, Framework) and toy.api_version == PLUGIN_API_VERSION
    assert not isinstance(toy, (Planner, HasRunModes, HasEmitters))
    from gbdoctor.plan import propose_plan

    with pytest.raises(SpecError, match="framework 'toy' has no planner"):
        propose_plan(load_spec(_toy_spec(tmp_path)))


@pytest.mark.slow  # a CLI process: a real scan, then every layer compiled again alone
def test_gbdoctor_scan_finds_the_installed_toy_and_agrees_with_plain_torch_compile(
    toy_site, tmp_path
):
    """The real CLI, in a process whose path holds the Toy distribution: the framework comes
    from its entry point; ``--oracle`` compiles every layer alone with plain ``torch.compile``
    and Dynamo's graph-break log, and must agree with the scan (else exit 1)."""
    spec = _toy_spec(tmp_path, flavor="print", factory="planted.py")
    out = tmp_path / "scan.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(toy_site), str(REPO)]))
    done = subprocess.run(
        [sys.executable, "-m", "gbdoctor", "scan", str(spec), "--no-recompile-probe"]
        + ["--oracle", "-f", "json", "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["setup"]["framework"] == "toy" and report["setup"]["strategy"] == "whole"
    breaks = [b for block in report["blocks"] for b in block["breaks"]]
    assert len(report["blocks"]) == 2 and len(breaks) == 2  # one planted print per block kind
    assert {b["cause"] for b in breaks} == {"python-side-effect"}  # planted.EXPECTED_CAUSE
    assert "2/2 layers agree with the scan" in done.stdout + done.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "gbdoctor", "plan", str(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith("Error: framework 'toy' has no planner"), refused.stderr


# ------------------------------------------------------------------ loading and its errors


def test_the_builtins_register_through_the_entry_points_pyproject_declares():
    """pyproject.toml's entry points are the registry's built-ins, in its order; a source tree
    whose installed metadata lacks them (stale ``pip install -e .``) still has every one."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"][registry.ENTRY_POINT_GROUP]
    assert tuple(declared.items()) == registry.BUILTIN_ENTRY_POINTS
    stale = plugin_sources(discovered=[])
    assert [(s.name, s.value) for s in stale] == list(registry.BUILTIN_ENTRY_POINTS)
    assert [load_plugin(s).name for s in stale] == list(declared)


def _plugin(tmp_path, monkeypatch, body: str, name: str = "broken") -> PluginSource:
    """A plug-in module written into ``tmp_path`` (a module name of its own: imports are
    cached) and its entry point."""
    module = "gbdoctor_" + re.sub(r"\W", "_", tmp_path.name)
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return PluginSource(name, f"{module}:Plugin", f"gbdoctor-{name}")


TOY_SUBCLASS = "from gbdoctor_toy import Toy\n\nclass Plugin(Toy):\n    name = 'broken'\n"


def test_a_plugin_for_another_api_version_is_refused_naming_both(toy, tmp_path, monkeypatch):
    source = _plugin(tmp_path, monkeypatch, TOY_SUBCLASS + "    api_version = 99\n")
    with pytest.raises(PluginError) as info:
        load_plugin(source)
    assert str(info.value) == (
        f"framework plug-in 'broken' ({source.value}, from gbdoctor-broken) is for API 99; "
        f"this gbdoctor supports plug-in API {PLUGIN_API_VERSION}"
    )
    assert "gbdoctor-broken" in (info.value.hint or "")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("import no_such_module\n", "cannot be loaded: ModuleNotFoundError: No module named"),
        (
            "class Plugin:\n    api_version = 1\n    name = 'broken'\n",
            "does not implement gbdoctor.frameworks.interface.Framework: it lacks title, ",
        ),
        ("class Plugin:\n    name = 'broken'\n", "declares no api_version"),
        (TOY_SUBCLASS.replace("'broken'", "'other'"), "is named 'other', not its entry point's"),
    ],
)
def test_a_broken_plugin_is_refused_in_one_line(toy, tmp_path, monkeypatch, body, expected):
    with pytest.raises(PluginError, match=expected) as info:
        load_plugin(_plugin(tmp_path, monkeypatch, body))
    assert "\n" not in str(info.value)


def test_two_plugins_of_one_name_are_refused():
    twice = [PluginSource("toy", "a:Toy", "dist-a"), PluginSource("toy", "b:Toy", "dist-b")]
    with pytest.raises(PluginError, match="'toy' is registered twice \\(by dist-a and dist-b\\)"):
        plugin_sources(discovered=twice)
    builtin = [PluginSource("deepspeed", "mine:DeepSpeed", "my-dist")]
    with pytest.raises(PluginError, match="'deepspeed' is registered twice"):
        plugin_sources(discovered=builtin)


@pytest.mark.slow  # a CLI process
def test_the_cli_reports_a_broken_plugin_in_one_line_exit_2(tmp_path):
    """An installed distribution whose plug-in is for another API version: every command that
    reads frameworks stops with one line naming it, exit 2, no traceback."""
    site = tmp_path / "site"
    (site / "gbdoctor_future-1.0.dist-info").mkdir(parents=True)
    (site / "gbdoctor_future-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: gbdoctor-future\nVersion: 1.0\n"
    )
    (site / "gbdoctor_future-1.0.dist-info" / "entry_points.txt").write_text(
        "[gbdoctor.frameworks]\nfuture = gbdoctor_future:Future\n"
    )
    (site / "gbdoctor_future.py").write_text("class Future:\n    api_version = 2\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    done = subprocess.run(
        [sys.executable, "-m", "gbdoctor", "scan", str(_toy_spec(tmp_path))],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == (
        "Error: framework plug-in 'future' (gbdoctor_future:Future, from gbdoctor-future) is for "
        f"API 2; this gbdoctor supports plug-in API {PLUGIN_API_VERSION}"
    )
    assert lines[1].startswith("Hint: install a release of gbdoctor-future")
    assert "Traceback" not in done.stderr


def test_docs_plugins_quotes_the_toy_distribution_verbatim():
    """docs/plugins.md's example is the distribution these tests install and scan."""
    page = (REPO / "docs" / "plugins.md").read_text(encoding="utf-8")
    quoted = re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", page, re.S)
    assert {path for path, _ in quoted} == {
        "tests/plugins/gbdoctor_toy/pyproject.toml",
        "tests/plugins/gbdoctor_toy/gbdoctor_toy/__init__.py",
    }
    for path, text in quoted:
        assert text == (REPO / path).read_text(encoding="utf-8"), path


def test_a_frameworks_hook_library_is_its_own_cause_signal():
    """The zero-hook location signal comes from the framework (``OwnHookLibrary``): the cause
    rules know no library path of their own."""
    from gbdoctor.causes import classify
    from gbdoctor.frameworks.interface import OwnHookLibrary
    from gbdoctor.records import Location, RawBreak

    owners = [f.name for f in registry.all_frameworks() if isinstance(f, OwnHookLibrary)]
    assert owners == ["deepspeed"]
    hooks = registry.hooks_of(registry.framework_named("deepspeed"))
    frames = (
        Location(file="/x/model.py", line=3, function="forward"),
        Location(file="/sp/deepspeed/runtime/zero/parameter_offload.py", line=4, function="h"),
    )
    raw = RawBreak(gb_type="Unexpected type in sourceless builder", message="", frames=frames)
    assert classify(raw, hooks) == "zero-hook"
    assert classify(raw) != "zero-hook"  # another framework's scan: not its hook
    component = RawBreak(
        gb_type="Unexpected type in sourceless builder", message="", component="zero"
    )
    assert classify(component, hooks) == "zero-hook" and classify(component) != "zero-hook"
