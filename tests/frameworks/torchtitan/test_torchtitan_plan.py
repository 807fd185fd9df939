"""``plan --torchtitan ... --emit-config torchtitan``: the emitted config-registry module is
applied by the installed torchtitan itself (its ``ConfigManager`` imports the module, its
``parallelize_fn`` runs under the emitted wrapper) and re-scanned strictly.

Slow (a plan is two deepseek_v3 scans, each check one more; about 2 min on 2 idle cores): this
is the issue's done-when, on one rank (EP 1, so FSDP2 does not shard and torchtitan's default
``spmd_types`` backend applies as shipped)."""

from __future__ import annotations

import py_compile

import pytest
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.frameworks.torchtitan.emit import emit_config_registry
from gbdoctor.plan import dump_plan
from gbdoctor.records import KindPlan, Plan
from gbdoctor.report.json import load_scan_json

pytestmark = [pytest.mark.extra("torchtitan"), pytest.mark.slow]

RUN = "deepseek_v3:deepseek_v3_debugmodel"
runner = CliRunner()


def _cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout + result.stderr


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory):
    """The plan's emitted module (written by the CLI) in a directory of its own."""
    folder = tmp_path_factory.mktemp("emitted")
    module = folder / "dsv3_gbdoctor_plan.py"
    code, text = _cli("plan", "--torchtitan", RUN, "--emit-config", "torchtitan", "-o", str(module))
    assert code == 0, text  # verified: exit 0
    return folder, module


def test_the_emitted_config_is_applied_by_torchtitan_and_rescans_clean(artefacts, monkeypatch):
    folder, module = artefacts
    py_compile.compile(str(module), doraise=True)
    source = module.read_text()
    assert "def deepseek_v3_debugmodel_gbdoctor():" in source
    assert "config.compile.enable = True" in source  # the debug config has compile off
    monkeypatch.syspath_prepend(str(folder))
    out = folder / "rescan.json"
    code, text = _cli(
        "scan",
        "--torchtitan",
        "dsv3_gbdoctor_plan:deepseek_v3_debugmodel_gbdoctor",
        "--strict",
        "-f",
        "json",
        "-o",
        str(out),
    )
    assert code == 0, text  # strict: any break, event or error would exit 1
    report = load_scan_json(out)
    assert [b.kind for b in report.blocks] == ["dense+sac"] + ["moe+sac"] * 5
    # torchtitan's own compile, switched on by the emitted function: whole blocks, fullgraph.
    assert all(b.regions == b.fullgraph_regions == (b.fqn,) for b in report.blocks)
    assert all(b.graph_count == 1 and not b.breaks and not b.events for b in report.blocks)


def test_per_layer_choices_and_flags_run_through_the_emitted_wrapper(
    artefacts, monkeypatch, tmp_path
):
    """A plan the config cannot express (MoE layers eager, the dense layer fullgraph=False, a
    Dynamo flag) goes through the emitted ``parallelize`` wrapper; the installed torchtitan's
    setup with it, and ``scan --plan`` with the same plan, lay the model out the same way."""
    moe_layers = tuple(f"layers.{i}" for i in range(1, 6))
    plan = Plan(
        spec=f"torchtitan:{RUN}",
        model="deepseek_v3/deepseek_v3_debugmodel",
        torch_version="",
        baseline_strategy="torchtitan",
        flags=(("capture_dynamic_output_shape_ops", True),),
        flag_costs=(),
        kinds=(
            KindPlan(
                kind="dense+sac", layers=("layers.0",), mode="block", fullgraph=False, verified=True
            ),
            KindPlan(
                kind="moe+sac", layers=moe_layers, mode="eager", fullgraph=False, verified=True
            ),
        ),
        verified=True,
        rounds=0,
        framework="torchtitan-installed",
    )
    (tmp_path / "dsv3_layer_plan.py").write_text(emit_config_registry(plan))
    monkeypatch.syspath_prepend(str(tmp_path))
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(dump_plan(plan))
    reports = []
    for run, extra in (
        ("dsv3_layer_plan:deepseek_v3_debugmodel_gbdoctor", ()),
        (RUN, ("--compile.enable", "--plan", str(plan_file))),
    ):
        out = tmp_path / f"{len(reports)}.json"
        code, text = _cli("scan", "--torchtitan", run, *extra, "-f", "json", "-o", str(out))
        assert code == 0, text
        reports.append(load_scan_json(out))
    for report in reports:
        dense, *moe = report.blocks
        assert dense.regions == ("layers.0",) and dense.fullgraph_regions == ()
        assert dense.graph_count >= 1
        assert all(b.regions == () and b.graph_count == 0 for b in moe)
        assert ("capture_dynamic_output_shape_ops", "True") in report.setup.dynamo_config
    assert reports[1].setup.plan is not None  # the plan file's identity
