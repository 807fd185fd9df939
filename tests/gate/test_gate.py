"""The pre-merge gate: baseline files and the failing rules (recorded scans, no torch)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from repo_paths import FIXTURES

from gbdoctor.errors import BaselineError, ExitCode
from gbdoctor.frameworks.registry import cause_taxonomy
from gbdoctor.gate import (
    Baseline,
    baseline_from_reports,
    check_gate,
    diff_reports,
    dump_baseline,
    load_baseline,
    merge_baselines,
    parse_baseline,
    spec_key,
)
from gbdoctor.records import Event, Location, Recompile, ScanReport
from gbdoctor.report.json import load_scan_json

SCANS = FIXTURES / "scans"
NEW_BREAK_AT = Location(file="gbdoctor/models/moe.py", line=142, function="forward")


def scan(name: str) -> ScanReport:
    return load_scan_json(SCANS / f"{name}.json")


def edit_kind(report: ScanReport, kind: str, **changes) -> ScanReport:
    """Every block of ``kind`` with ``changes`` applied (a callable gets the block)."""
    blocks = []
    for block in report.blocks:
        if block.kind == kind:
            block = replace(
                block, **{k: v(block) if callable(v) else v for k, v in changes.items()}
            )
        blocks.append(block)
    return replace(report, blocks=tuple(blocks))


def as_old_schema(data: dict, version: int) -> dict:
    """A baseline's JSON as schema 1 or 2 wrote it: breaks keyed ``"<cause>|<gb_type>"``
    (no location), and in schema 1 no recompile counts."""
    data["schema_version"] = version
    for kinds in data["specs"].values():
        for counts in kinds.values():
            keyed: dict[str, int] = {}
            for entry in counts["breaks"]:
                key = f"{entry['cause']}|{entry['gb_type']}"
                keyed[key] = keyed.get(key, 0) + entry["count"]
            counts["breaks"] = keyed
            if version == 1:
                counts.pop("recompiles", None), counts.pop("steady_recompiles", None)
    return data


def regressions(result):
    return [f for f in result.findings if f.severity == "regression"]


@pytest.fixture
def before() -> ScanReport:
    return scan("llama4_before")


@pytest.fixture
def after() -> ScanReport:
    return scan("llama4_after_new_break")


# --------------------------------------------------------------------------- rules


def test_a_new_break_fails_and_names_kind_cause_and_location(before, after) -> None:
    result = check_gate([after], baseline_from_reports([before]))
    assert not result.passed and result.exit_code == 1 == ExitCode.FINDINGS
    [finding] = regressions(result)
    assert finding.spec == "fixtures/llama4_debug_ep2.toml"
    assert finding.kind == "moe"
    assert finding.cause == "data-dependent"
    assert finding.gb_type == "Dynamic shape operator"
    assert finding.what == "new cause data-dependent (breaks 0 -> 1)"
    assert finding.locations == (NEW_BREAK_AT,) and finding.location == NEW_BREAK_AT
    assert finding.hint == cause_taxonomy().causes["data-dependent"].fixes[0]


def test_removing_a_break_passes_and_reports_an_improvement(before, after) -> None:
    result = check_gate([before], baseline_from_reports([after]))
    assert result.passed and result.exit_code == 0
    [improvement] = [f for f in result.findings if f.severity == "improvement"]
    assert (improvement.kind, improvement.cause) == ("moe", "data-dependent")
    assert improvement.what == "cause data-dependent gone (breaks 1 -> 0)"


def test_strict_improvements_make_an_improvement_fail(before, after) -> None:
    result = check_gate([before], baseline_from_reports([after]), strict_improvements=True)
    assert not result.passed and result.exit_code == 1
    assert [f.severity for f in result.failures] == ["improvement"]


def test_unchanged_scan_passes_without_findings(before) -> None:
    result = check_gate([before], baseline_from_reports([before]))
    assert result.passed and result.findings == ()
    assert result.specs == ("fixtures/llama4_debug_ep2.toml",)
    assert result.kinds == (
        ("fixtures/llama4_debug_ep2.toml", "dense"),
        ("fixtures/llama4_debug_ep2.toml", "moe"),
    )


def test_a_new_cause_fails_even_with_an_unchanged_total(before, after) -> None:
    dd = next(b for b in after.blocks[1].breaks if b.cause == "data-dependent")
    swapped = edit_kind(before, "moe", breaks=lambda b: (b.breaks[0], dd))
    result = check_gate([swapped], baseline_from_reports([before]))
    assert not result.passed
    assert [f.what for f in regressions(result)] == ["new cause data-dependent (breaks 0 -> 1)"]
    assert [f.what for f in result.findings if f.severity == "improvement"] == [
        "break count 2 -> 1"
    ]


def test_a_new_gb_type_of_a_known_cause_fails(before) -> None:
    other = "Skip inlining `torch.compiler.disable()`d function"
    changed = edit_kind(
        before, "moe", breaks=lambda b: (b.breaks[0], replace(b.breaks[1], gb_type=other))
    )
    [finding] = regressions(check_gate([changed], baseline_from_reports([before])))
    assert finding.what == f"new gb_type {other!r} (breaks 0 -> 1)"
    assert finding.cause == "fsdp-hook" and finding.locations[0].line == 91


def test_more_breaks_of_a_known_key_fail(before) -> None:
    changed = edit_kind(
        before, "moe", breaks=lambda b: (replace(b.breaks[0], count=2), b.breaks[1])
    )
    [finding] = regressions(check_gate([changed], baseline_from_reports([before])))
    assert finding.what == "break count 2 -> 3" and finding.cause == "fsdp-hook"


@pytest.mark.parametrize("event_kind", ["region_eager", "frame_skipped"])
def test_a_new_eager_region_or_skipped_frame_fails(before, event_kind: str) -> None:
    event = Event(
        kind=event_kind,
        module="layers.1",
        location=Location(file="gbdoctor/models/moe.py", line=88),
    )
    changed = edit_kind(before, "moe", events=(event,))
    [finding] = regressions(check_gate([changed], baseline_from_reports([before])))
    assert finding.what == f"new event {event_kind}" and finding.kind == "moe"
    assert finding.locations == (event.location,)


def test_a_new_rank_divergence_only_warns(before) -> None:
    changed = edit_kind(before, "dense", events=(Event(kind="rank_divergence", module="layers.0"),))
    result = check_gate([changed], baseline_from_reports([before]))
    assert result.passed and [f.severity for f in result.findings] == ["warning"]


def test_a_block_that_now_errors_fails(before) -> None:
    changed = edit_kind(before, "dense", error="RuntimeError: boom", graph_count=0)
    [finding] = regressions(check_gate([changed], baseline_from_reports([before])))
    assert (
        finding.what == "block now errors" and finding.kind == "dense" and finding.cause == "error"
    )
    back = check_gate([before], baseline_from_reports([changed]))
    assert back.passed and [f.what for f in back.findings] == ["block traces again"]


def test_more_layers_of_a_known_kind_are_not_a_regression(before) -> None:
    extra = tuple(
        replace(b, fqn=f"layers.{i + 4}", same_as="layers.1" if b.kind == "moe" else "layers.0")
        for i, b in enumerate(before.blocks)
    )
    bigger = replace(before, blocks=before.blocks + extra)
    result = check_gate([bigger], baseline_from_reports([before]))
    assert result.passed
    assert sorted(f.what for f in result.findings) == ["layers 2 -> 4", "layers 2 -> 4"]
    assert {f.severity for f in result.findings} == {"info"}


def test_another_torch_version_warns_but_passes(before) -> None:
    baseline = baseline_from_reports([replace(before, torch_version="2.12.0")])
    result = check_gate([before], baseline)
    assert result.passed
    [warning] = result.findings
    assert warning.severity == "warning" and warning.what == "torch version 2.12.0 -> 2.13.0"


def test_a_spec_missing_from_the_baseline_fails(before) -> None:
    result = check_gate(
        [replace(before, spec="fixtures/other.toml")], baseline_from_reports([before])
    )
    [finding] = result.findings
    assert (
        finding.severity == "regression"
        and finding.what == "spec not in baseline (run --update-baseline)"
    )
    assert result.exit_code == 1


def test_new_and_removed_kinds(before) -> None:
    result = check_gate([scan("llama4_region_eager")], baseline_from_reports([before]))
    assert not result.passed
    whats = {(f.severity, f.kind, f.what) for f in result.findings}
    assert ("info", "moe+ac", "new kind (2 layer(s))") in whats
    assert ("regression", "moe+ac", "new cause fsdp-hook (breaks 0 -> 2)") in whats
    assert ("regression", "moe+ac", "new event region_eager") in whats
    assert ("warning", "moe", "kind removed (baseline: 2 layer(s), 2 break(s))") in whats
    severities = [f.severity for f in result.findings]
    assert severities == sorted(
        severities, key=["regression", "warning", "improvement", "info"].index
    )


def _recompile(step: int, reason: str, location: str | None = None) -> Recompile:
    return Recompile(
        step=step,
        measured=step == 2,
        function="forward at gbdoctor/models/decoder.py:40",
        reason=reason,
        location=location,
    )


ONE_TIME = _recompile(1, "tensor 'x' size mismatch at index 1. expected 64, actual 32")
EVERY_STEP = _recompile(2, "self.owner_tag == 'step-2'", "fixtures/models/recompiler.py:94")


def test_graph_count_is_information_only(before, after) -> None:
    baseline = baseline_from_reports([before])
    for flag in (False, True):
        result = check_gate([after], baseline, recompiles=flag)
        assert ("info", "graph count 3 -> 4") in {(f.severity, f.what) for f in result.findings}


def test_recompiles_gate_on_every_step_and_on_new_ones(before) -> None:
    accepted = edit_kind(before, "dense", recompiles=(ONE_TIME,))
    baseline = baseline_from_reports([accepted])
    assert dict(baseline.kinds("fixtures/llama4_debug_ep2.toml"))["dense"].recompiles == 1
    # The same one-time recompile (a new sequence length made dynamic) passes.
    assert check_gate([accepted], baseline, recompiles=True).passed
    # A block that recompiles on every step fails, naming the guard and where it comes from.
    every = edit_kind(before, "dense", recompiles=(ONE_TIME, EVERY_STEP))
    result = check_gate([every], baseline, recompiles=True)
    [finding] = regressions(result)
    assert finding.what.startswith("recompiles on every step (0 -> 1 in the last probe step)")
    assert "self.owner_tag == 'step-2'" in finding.what
    assert finding.locations == (Location(file="fixtures/models/recompiler.py", line=94),)
    # Without --recompiles the same change is information only.
    plain = check_gate([every], baseline)
    assert plain.passed and any(
        f.what.startswith("recompiles on every step") for f in plain.findings
    )
    # A new one-time recompile is a regression under --recompiles too.
    more = edit_kind(
        before, "dense", recompiles=(ONE_TIME, replace(ONE_TIME, reason="x.dtype == torch.float32"))
    )
    [finding] = regressions(check_gate([more], baseline, recompiles=True))
    assert finding.what.startswith("recompiles with changed inputs 1 -> 2")
    # Fewer is an improvement.
    assert check_gate([before], baseline, recompiles=True).count("improvement") == 1


def test_schema_1_baselines_are_read_with_unknown_recompiles(before) -> None:
    data = as_old_schema(json.loads(dump_baseline(baseline_from_reports([before]))), 1)
    old = parse_baseline(json.dumps(data))
    assert dict(old.kinds("fixtures/llama4_debug_ep2.toml"))["dense"].recompiles is None
    # Unknown totals are information; recompiling on every step still fails (nothing accepted it).
    once = check_gate([edit_kind(before, "dense", recompiles=(ONE_TIME,))], old, recompiles=True)
    assert once.passed and any("no recompile counts" in f.what for f in once.findings)
    every = check_gate(
        [edit_kind(before, "dense", recompiles=(ONE_TIME, EVERY_STEP))], old, recompiles=True
    )
    assert not every.passed


def test_a_scan_without_the_probe_has_unknown_recompiles(before) -> None:
    """No probe: the baseline omits the counts, and --recompiles refuses the scan (exit 2)."""
    unprobed = replace(before, setup=replace(before.setup, probed_recompiles=False))
    data = json.loads(dump_baseline(baseline_from_reports([unprobed])))
    for kinds in data["specs"].values():
        assert all("recompiles" not in counts for counts in kinds.values())
    assert (
        dict(parse_baseline(json.dumps(data)).kinds("fixtures/llama4_debug_ep2.toml"))[
            "dense"
        ].recompiles
        is None
    )
    baseline = baseline_from_reports([before])
    assert check_gate([unprobed], baseline).passed
    with pytest.raises(BaselineError, match="without the recompile probe") as err:
        check_gate([unprobed], baseline, recompiles=True)
    assert err.value.exit_code == ExitCode.BAD_INPUT


def test_diff_reports_uses_the_old_scan_as_baseline(before, after) -> None:
    result = diff_reports(before, after)
    assert result.exit_code == 1
    [finding] = regressions(result)
    assert finding.locations == (NEW_BREAK_AT,)
    back = diff_reports(after, before)
    assert back.passed
    [improvement] = [f for f in back.findings if f.severity == "improvement"]
    assert improvement.locations == (NEW_BREAK_AT,)  # where the break was, from the old scan
    assert diff_reports(before, before).findings == ()


# --------------------------------------------------------------------------- baseline files


def test_baseline_layout_and_byte_stability(before, after) -> None:
    text = dump_baseline(baseline_from_reports([after]))
    assert text == dump_baseline(baseline_from_reports([scan("llama4_after_new_break")]))
    assert text.endswith("}\n") and "Explanation" not in text and "Hints" not in text
    fsdp = "Skip calling `torch.compiler.disable()`d function"

    def entry(cause: str, gb_type: str, gb_id: str, line: int) -> dict:
        return {
            "cause": cause,
            "count": 1,
            "gb_id": gb_id,
            "gb_type": gb_type,
            "in_checkpoint": False,
            "location": f"gbdoctor/models/moe.py:{line}",
        }

    assert json.loads(text) == {
        "schema_version": 3,
        "simulated": [],
        "torch_version": "2.13.0",
        "dynamo_config": {"nested_graph_breaks": False},
        "specs": {
            "fixtures/llama4_debug_ep2.toml": {
                "dense": {
                    "breaks": [],
                    "error": False,
                    "events": {},
                    "graph_count": 1,
                    "layers": 2,
                    "recompiles": 0,
                    "steady_recompiles": 0,
                },
                "moe": {
                    "breaks": [
                        entry("data-dependent", "Dynamic shape operator", "GB0036", 142),
                        entry("fsdp-hook", fsdp, "GB0098", 88),
                        entry("fsdp-hook", fsdp, "GB0098", 91),
                    ],
                    "error": False,
                    "events": {},
                    "graph_count": 4,
                    "layers": 2,
                    "recompiles": 0,
                    "steady_recompiles": 0,
                },
            }
        },
    }
    assert dump_baseline(parse_baseline(text)) == text
    assert "gbdoctor_version" not in text


def test_load_baseline_round_trip(tmp_path, before) -> None:
    path = tmp_path / "baseline.json"
    baseline = baseline_from_reports([before])
    path.write_text(dump_baseline(baseline), encoding="utf-8")
    assert load_baseline(path) == baseline
    assert load_baseline(str(path)) == baseline


def test_merge_keeps_other_specs(before) -> None:
    other = baseline_from_reports([replace(before, spec="fixtures/other.toml")])
    merged = merge_baselines(other, baseline_from_reports([before]))
    assert [key for key, _ in merged.specs] == [
        "fixtures/llama4_debug_ep2.toml",
        "fixtures/other.toml",
    ]
    assert merge_baselines(None, other) == other


def test_two_scans_of_one_spec_cannot_make_a_baseline(before) -> None:
    with pytest.raises(BaselineError, match="two scans"):
        baseline_from_reports([before, replace(before, spec="./fixtures/llama4_debug_ep2.toml")])


def _valid() -> dict:
    return json.loads(dump_baseline(baseline_from_reports([scan("llama4_before")])))


def _moe(data: dict) -> dict:
    return data["specs"]["fixtures/llama4_debug_ep2.toml"]["moe"]


def _bad_baselines() -> dict[str, tuple[str, str]]:
    out = {
        "bad json": ('{"schema_version": 1,', "not valid JSON"),
        "not an object": ("[]", "expected a JSON object"),
    }
    data = _valid()
    data["schema_version"] = 4
    out["schema"] = (json.dumps(data), "baseline schema_version 4")
    data = _valid()
    del data["specs"]
    out["no specs"] = (json.dumps(data), "missing key 'specs'")
    data = _valid()
    data["gbdoctor_version"] = "0.1.0"
    out["unknown top-level key"] = (json.dumps(data), "unknown key(s) ['gbdoctor_version']")
    data = _valid()
    del _moe(data)["layers"]
    out["kind misses a key"] = (json.dumps(data), "missing key(s) ['layers']")
    data = as_old_schema(_valid(), 2)
    _moe(data)["breaks"] = {"fsdp-hook": 2}
    out["break key without gb_type"] = (json.dumps(data), "'<cause>|<gb_type>' key")
    data = _valid()
    _moe(data)["breaks"] = {"fsdp-hook|x": 2}
    out["schema 3 breaks as an object"] = (json.dumps(data), "expected a list of break entries")
    data = _valid()
    del _moe(data)["breaks"][0]["location"]
    out["break entry misses a key"] = (json.dumps(data), "missing key(s) ['location']")
    data = _valid()
    _moe(data)["events"] = {"region_eager": -1}
    out["negative count"] = (json.dumps(data), "expected a non-negative integer")
    data = _valid()
    _moe(data)["error"] = "no"
    out["error not bool"] = (json.dumps(data), "expected true or false")
    data = _valid()
    data["specs"] = []
    out["specs not an object"] = (json.dumps(data), "expected an object of specs")
    out["a scan report"] = (
        (SCANS / "llama4_before.json").read_text(encoding="utf-8"),
        "scan report, not a baseline",
    )
    return out


BAD = (
    "bad json",
    "not an object",
    "schema",
    "no specs",
    "unknown top-level key",
    "kind misses a key",
    "break key without gb_type",
    "schema 3 breaks as an object",
    "break entry misses a key",
    "negative count",
    "error not bool",
    "specs not an object",
    "a scan report",
)


@pytest.mark.parametrize("case", BAD)
def test_malformed_baseline_is_a_one_line_error(case: str, tmp_path) -> None:
    cases = _bad_baselines()
    assert sorted(cases) == sorted(BAD)
    text, fragment = cases[case]
    path = tmp_path / "baseline.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BaselineError) as err:
        load_baseline(path)
    assert err.value.exit_code == ExitCode.BAD_INPUT == 2
    assert fragment in err.value.message and str(path) in err.value.message
    assert "\n" not in err.value.message


def test_missing_baseline_is_a_baseline_error(tmp_path) -> None:
    with pytest.raises(BaselineError, match="no such baseline file") as err:
        load_baseline(tmp_path / "missing.json")
    assert "--update-baseline" in (err.value.hint or "")


# --------------------------------------------------------------------------- spec keys


@pytest.mark.parametrize(
    ("given", "key"),
    [
        ("fixtures/llama4_debug.toml", "fixtures/llama4_debug.toml"),
        ("./fixtures/llama4_debug.toml", "fixtures/llama4_debug.toml"),
        ("fixtures//sub/../llama4_debug.toml", "fixtures/llama4_debug.toml"),
        ("fixtures\\llama4_debug.toml", "fixtures/llama4_debug.toml"),
    ],
)
def test_spec_key_is_posix_relative(given: str, key: str) -> None:
    assert spec_key(given) == key


def test_spec_key_of_an_absolute_path_under_the_root(tmp_path) -> None:
    assert spec_key(str(tmp_path / "specs" / "a.toml"), root=tmp_path) == "specs/a.toml"
    assert spec_key("/elsewhere/a.toml", root=tmp_path) == "/elsewhere/a.toml"


def test_empty_baseline_record() -> None:
    assert Baseline(torch_version="").kinds("x") is None


# --------------------------------------------------------------------------- pinned Dynamo settings


def test_baseline_pins_dynamo_settings_and_gate_scans_under_them(before) -> None:
    import os

    import torch._dynamo

    from gbdoctor.gate import PINS_ENV, current_pins, pinned_dynamo

    base = baseline_from_reports([before])
    assert dict(base.dynamo_config) == {
        "nested_graph_breaks": torch._dynamo.config.nested_graph_breaks
    }
    text = dump_baseline(base)
    assert json.loads(text)["dynamo_config"] == {"nested_graph_breaks": False}
    assert parse_baseline(text) == base  # round trip
    # An older baseline without pins still reads (pins then default to this torch's values).
    legacy = json.loads(text)
    del legacy["dynamo_config"]
    assert parse_baseline(json.dumps(legacy)).dynamo_config == ()
    with pytest.raises(BaselineError, match="dynamo_config"):
        parse_baseline(json.dumps({**legacy, "dynamo_config": {"nested_graph_breaks": [1]}}))

    flipped = (("nested_graph_breaks", True), ("no_such_setting_in_this_torch", 1))
    with pinned_dynamo(flipped) as unknown:
        assert torch._dynamo.config.nested_graph_breaks is True
        assert json.loads(os.environ[PINS_ENV]) == {"nested_graph_breaks": True}  # spawned ranks
        assert unknown == ("no_such_setting_in_this_torch",)
    assert current_pins() == (("nested_graph_breaks", False),) and PINS_ENV not in os.environ


# --------------------------------------------------------------------------- torch renames

RENAMED_AT = "gbdoctor/models/moe.py:257"


@pytest.fixture
def torch213() -> ScanReport:
    """llama4 EP2 (titan-v0.2.0, AC off, no recompile probe) recorded on torch 2.13.0+cpu."""
    return scan("llama4_ep2_torch2.13")


@pytest.fixture
def torch215() -> ScanReport:
    """The same scan, same code and spec, recorded on torch 2.15.0+cu132 (CPU run): torch
    renamed the FSDP-hook break GB0007 -> GB0376 (fixtures/scans/README.md)."""
    return scan("llama4_ep2_torch2.15")


def test_recorded_scans_differ_only_by_the_renamed_gb_type(torch213, torch215) -> None:
    """The fixture pair holds what the gate tests below rely on (not constructed by hand)."""
    assert torch213.torch_version.startswith("2.13.0")
    assert torch215.torch_version.startswith("2.15.0")
    old = {(str(b.location), b.cause, b.gb_id) for blk in torch213.blocks for b in blk.breaks}
    new = {(str(b.location), b.cause, b.gb_id) for blk in torch215.blocks for b in blk.breaks}
    assert old - new == {(RENAMED_AT, "fsdp-hook", "GB0007")}
    assert new - old == {(RENAMED_AT, "fsdp-hook", "GB0376")}


RENAME_WHAT = (
    "renamed by torch 2.15.0: GB0007 'Attempted to call function marked as skipped' -> "
    "GB0376 'Call to `torch._dynamo.disable()`'"
)


def test_a_torch_upgrade_that_renames_a_break_passes_with_a_warning(torch213, torch215) -> None:
    result = check_gate([torch215], baseline_from_reports([torch213]))
    assert result.passed and result.exit_code == 0
    assert [(f.severity, f.kind, f.what) for f in result.findings] == [
        ("warning", "", "torch version 2.13.0+cpu -> 2.15.0+cu132"),
        ("warning", "moe", RENAME_WHAT),
    ]
    rename = result.findings[1]
    assert rename.cause == "fsdp-hook" and str(rename.location) == RENAMED_AT
    # The same rule in `gbdoctor diff`, and back from 2.15 to 2.13 (a baseline may be newer).
    assert [f.what for f in diff_reports(torch213, torch215).findings][1] == RENAME_WHAT
    back = check_gate([torch213], baseline_from_reports([torch215]))
    assert back.passed and "renamed by torch 2.13.0: GB0376" in back.findings[1].what


def test_the_rename_on_the_command_line(torch213, tmp_path) -> None:
    """`gbdoctor gate --scan`: the recorded 2.15 scan against a 2.13 baseline exits 0."""
    from typer.testing import CliRunner

    from gbdoctor.cli import app

    baseline = tmp_path / "baseline.json"
    baseline.write_text(dump_baseline(baseline_from_reports([torch213])), encoding="utf-8")
    run = CliRunner().invoke(
        app,
        ["gate", "--baseline", str(baseline), "--scan", str(SCANS / "llama4_ep2_torch2.15.json")],
    )
    assert run.exit_code == 0, run.output
    assert "GB0007" in run.output and "GB0376" in run.output and "renamed" in run.output


def test_the_same_gb_type_change_on_one_torch_is_not_a_rename(torch213, torch215) -> None:
    """Only a torch upgrade renames: on one torch a new gb_type at the same line is new code."""
    same_torch = replace(torch215, torch_version=torch213.torch_version)
    result = check_gate([same_torch], baseline_from_reports([torch213]))
    assert not result.passed
    assert [f.what for f in regressions(result)] == [
        "new gb_type 'Call to `torch._dynamo.disable()`' (breaks 0 -> 1)"
    ]


def test_a_new_break_at_a_new_location_is_still_a_regression(torch213, torch215, after) -> None:
    new_break = next(b for b in after.blocks[1].breaks if b.cause == "data-dependent")
    grown = edit_kind(torch215, "moe", breaks=lambda b: (*b.breaks, new_break))
    result = check_gate([grown], baseline_from_reports([torch213]))
    assert not result.passed
    [finding] = regressions(result)
    assert finding.what == "new cause data-dependent (breaks 0 -> 1)"
    assert finding.locations == (NEW_BREAK_AT,)
    assert RENAME_WHAT in [f.what for f in result.findings]


def _moved(report: ScanReport, which: str, line: int, **changes) -> ScanReport:
    """``report`` with the moe breaks of gb id ``which`` moved to ``line`` (and ``changes``)."""

    def move(block):
        return tuple(
            replace(b, location=replace(b.location, line=line), **changes)
            if b.gb_id == which
            else b
            for b in block.breaks
        )

    return edit_kind(report, "moe", breaks=move)


def test_a_rename_in_the_alias_table_matches_where_the_location_moved(torch213, torch215) -> None:
    moved = _moved(torch215, "GB0376", 250)
    result = check_gate([moved], baseline_from_reports([torch213]))
    assert result.passed and RENAME_WHAT in [f.what for f in result.findings]
    # A gb_type the table does not pair with GB0007, at a moved line: a new break, not a rename.
    other = _moved(torch215, "GB0376", 250, gb_type="Unsupported method call", gb_id="GB0156")
    assert [
        f.what for f in regressions(check_gate([other], baseline_from_reports([torch213])))
    ] == ["new gb_type 'Unsupported method call' (breaks 0 -> 1)"]


def test_a_schema_2_baseline_keyed_by_gb_type_matches_the_rename(torch213, torch215) -> None:
    """Baselines written before locations were recorded: the alias table pairs the names."""
    data = as_old_schema(json.loads(dump_baseline(baseline_from_reports([torch213]))), 2)
    old = parse_baseline(json.dumps(data))
    result = check_gate([torch215], old)
    assert result.passed and RENAME_WHAT in [f.what for f in result.findings]
    assert check_gate([torch213], old).findings == ()
    new_break = replace(torch215.blocks[1].breaks[1], location=NEW_BREAK_AT)
    grown = edit_kind(torch215, "moe", breaks=lambda b: (*b.breaks, new_break))
    assert [f.what for f in regressions(check_gate([grown], old))] == ["break count 2 -> 3"]
