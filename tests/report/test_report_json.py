"""``--format json`` and ``load_scan_json``: byte-stable, round-trips, one-line errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from scan_factory import SCAN_FIXTURES, SCANS, UPDATE

from gbdoctor.errors import BaselineError, ExitCode
from gbdoctor.records import SCHEMA_VERSION
from gbdoctor.report.json import load_scan_json, render_json


def test_recorded_fixtures_are_the_serialized_factory_records(fixture_name: str) -> None:
    text = render_json(SCAN_FIXTURES[fixture_name]())
    path = SCANS / f"{fixture_name}.json"
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == text


def test_json_is_byte_identical_for_equal_inputs(fixture_name: str) -> None:
    first = render_json(SCAN_FIXTURES[fixture_name]())
    assert render_json(SCAN_FIXTURES[fixture_name]()) == first
    assert first.endswith("}\n") and '\n  "blocks": [' in first
    data = json.loads(first)
    assert list(data) == sorted(data)


def test_json_round_trips_through_load_scan_json(fixture_name: str) -> None:
    report = SCAN_FIXTURES[fixture_name]()
    path = SCANS / f"{fixture_name}.json"
    assert load_scan_json(path) == report
    assert load_scan_json(str(path)) == report
    assert load_scan_json(path.read_text(encoding="utf-8")) == report
    assert render_json(load_scan_json(path)) == path.read_text(encoding="utf-8")


def test_totals_come_from_the_summary() -> None:
    totals = json.loads(render_json(SCAN_FIXTURES["llama4_after_new_break"]()))["totals"]
    # 2 MoE layers x (2 fsdp-hook + 1 data-dependent); each layer counts its own copy.
    assert totals == {
        "breaks": 6,
        "by_cause": {"data-dependent": 2, "fsdp-hook": 4},
        "errors": 0,
        "events": {},
        "graphs": 2 * 1 + 2 * 4,
    }
    totals = json.loads(render_json(SCAN_FIXTURES["llama4_region_eager"]()))["totals"]
    assert totals["events"] == {"region_eager": 2}


def _fixture_data() -> dict:
    return json.loads((SCANS / "llama4_before.json").read_text(encoding="utf-8"))


MUTATIONS = (
    "truncated",
    "not an object",
    "schema version",
    "no schema version",
    "missing key",
    "unknown key",
    "wrong type",
    "wrong shape",
)


def _mutations() -> dict[str, tuple[str, str]]:
    """name -> (JSON text, expected fragment of the message)."""
    cases: dict[str, tuple[str, str]] = {}
    cases["truncated"] = (json.dumps(_fixture_data())[:200], "not valid JSON")
    cases["not an object"] = ("[1, 2]", "expected a JSON object")
    data = _fixture_data()
    data["schema_version"] = SCHEMA_VERSION + 1
    cases["schema version"] = (json.dumps(data), "schema_version")
    data = _fixture_data()
    del data["schema_version"]
    cases["no schema version"] = (json.dumps(data), "missing key 'schema_version'")
    data = _fixture_data()
    del data["blocks"][1]["fqn"]
    cases["missing key"] = (json.dumps(data), "missing key 'fqn'")
    data = _fixture_data()
    data["blocks"][0]["surprise"] = 1
    cases["unknown key"] = (json.dumps(data), "unknown key(s) ['surprise']")
    data = _fixture_data()
    data["blocks"][1]["breaks"][0]["location"]["line"] = "88"
    cases["wrong type"] = (json.dumps(data), "$.blocks[1].breaks[0].location.line: expected int")
    data = _fixture_data()
    data["blocks"] = {"layers.0": {}}
    cases["wrong shape"] = (json.dumps(data), "$.blocks: expected a list")
    assert sorted(cases) == sorted(MUTATIONS)
    return cases


@pytest.mark.parametrize("case", MUTATIONS)
def test_malformed_scan_json_is_a_one_line_baseline_error(case: str, tmp_path) -> None:
    text, fragment = _mutations()[case]
    path = tmp_path / "scan.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BaselineError) as err:
        load_scan_json(path)
    assert err.value.exit_code == ExitCode.BAD_INPUT
    assert fragment in err.value.message
    assert str(path) in err.value.message
    assert "\n" not in err.value.message


def test_missing_scan_file_is_a_baseline_error(tmp_path) -> None:
    with pytest.raises(BaselineError, match="no such scan file"):
        load_scan_json(tmp_path / "nope.json")


def test_totals_key_is_ignored_but_nothing_else_is(tmp_path) -> None:
    data = _fixture_data()
    data["totals"] = {"breaks": "whatever"}
    assert load_scan_json(json.dumps(data)) == SCAN_FIXTURES["llama4_before"]()


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6, 7, 8])
def test_older_schema_versions_are_still_read(fixture_name: str, version: int) -> None:
    """Version 2 added ``cudagraphs`` per block and ``tp_degree`` to the setup, version 3
    ``recompiles`` per block, ``probed_recompiles``, ``dp_replicate`` and DeepSpeed's
    ``framework``/``zero_stage``/``steps`` to the setup, version 4 the setup's ``launcher``,
    ``nodes`` and ``ranks_per_node``, version 5 the report's ``price``, version 6 ``via`` per
    break and ``dedupe``/``dedupe_detail`` per block, version 7 ``price.clock`` (null prices
    here: a version 6 document is otherwise the same), version 8 the report's ``divergence``,
    version 9 ``stage`` per block and the setup's ``pp_*`` fields, all with defaults: an older document (as
    stored baselines and scans have them) reads as the same report, with no recompiles recorded
    before 3 and the ranks per node not recorded before 4."""
    report = SCAN_FIXTURES[fixture_name]()
    data = json.loads(render_json(report))
    data["schema_version"] = version
    for block in data["blocks"]:
        del block["stage"]
    for key in ("pp_degree", "pp_schedule", "pp_stages", "pp_microbatches"):
        del data["setup"][key]
    if version == 8:
        assert load_scan_json(json.dumps(data)) == report
        return
    assert data.pop("divergence") == []  # the fixtures are 1-rank scans: none
    if version in (6, 7):
        assert load_scan_json(json.dumps(data)) == report
        return
    for block in data["blocks"]:
        del block["dedupe"], block["dedupe_detail"]
        for brk in block["breaks"]:
            del brk["via"]
    if version == 5:
        assert load_scan_json(json.dumps(data)) == report
        return
    del data["price"]  # null for scans
    if version == 4:
        assert load_scan_json(json.dumps(data)) == report
        return
    for key in ("launcher", "nodes", "ranks_per_node"):
        del data["setup"][key]
    expected = replace(report, setup=replace(report.setup, ranks_per_node=0))
    if version <= 2:
        del data["setup"]["probed_recompiles"]
        for key in ("dp_replicate", "framework", "zero_stage", "steps"):
            del data["setup"][key]
        for block in data["blocks"]:
            del block["recompiles"]
        expected = replace(
            expected,
            setup=replace(expected.setup, probed_recompiles=False),
            blocks=tuple(replace(b, recompiles=()) for b in report.blocks),
        )
    if version == 1:
        del data["setup"]["tp_degree"]
        for block in data["blocks"]:
            del block["cudagraphs"]
    assert SCHEMA_VERSION == 9
    assert load_scan_json(json.dumps(data)) == expected
    data["schema_version"] = 10
    with pytest.raises(BaselineError, match="reads 1, 2, 3, 4, 5, 6, 7, 8, 9"):
        load_scan_json(json.dumps(data))
