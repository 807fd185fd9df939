"""The supported torch range is one fact (pyproject.toml = gbdoctor/torch_compat.py), and the
gb_types torch renamed inside it (causes/renames.py) agree with the installed torch's registry."""

from __future__ import annotations

import tomllib

import pytest
from repo_paths import REPO

from gbdoctor.causes import GB_RENAMES, gb_id_for, gb_type_in, registry
from gbdoctor.torch_compat import (
    SUPPORTED,
    TESTED,
    is_supported,
    release_name,
    supported_range,
    torch_release,
    torch_version,
)


def test_pyproject_admits_exactly_the_supported_releases():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch{supported_range()}" in deps
    assert supported_range() == ">=2.11,<2.16"
    assert all(is_supported(v) for v in TESTED)


def test_the_running_torch_is_supported():
    assert is_supported(), torch_version()
    assert torch_release() == torch_release(torch_version())


@pytest.mark.parametrize(
    ("version", "release", "supported"),
    [
        ("2.11.0+cu130", (2, 11), True),
        ("2.15.0", (2, 15), True),
        ("2.10.1", (2, 10), False),
        ("2.16.0.dev20260101", (2, 16), False),
        ("", None, False),
        ("nightly", None, False),
    ],
)
def test_release_of_a_version_string(version, release, supported):
    assert torch_release(version) == release
    assert is_supported(version) is supported
    assert SUPPORTED[0] <= (2, 13) <= SUPPORTED[1]


def test_release_name_drops_the_build_tag():
    assert release_name("2.11.0+cu130") == "2.11.0"
    assert release_name("") == ""


@pytest.mark.parametrize("rename", GB_RENAMES, ids=lambda r: f"{r.old_id}-{r.new_id}")
def test_a_rename_maps_newer_names_to_older_releases(rename):
    before = f"{rename.since[0]}.{rename.since[1] - 1}.0"
    since = f"{rename.since[0]}.{rename.since[1]}.0"
    assert gb_type_in(rename.new_type, before) == rename.old_type
    assert gb_type_in(rename.new_type, since) == rename.new_type
    # The old name stays in use for other cases: it alone does not say a case was renamed.
    assert gb_type_in(rename.old_type, since) == rename.old_type
    assert gb_type_in(rename.old_type, before) == rename.old_type
    assert gb_type_in(rename.new_type, "") == rename.new_type  # unknown version: unchanged


@pytest.mark.parametrize("rename", GB_RENAMES, ids=lambda r: f"{r.old_id}-{r.new_id}")
def test_a_rename_agrees_with_the_installed_registry(rename):
    """The old id exists in every supported release; the new one exactly from ``since`` on."""
    reg = registry()
    assert reg[rename.old_type].gb_id == rename.old_id
    has_new = rename.new_type in reg
    assert has_new == (torch_release() >= rename.since), torch_version()
    if has_new:
        assert gb_id_for(rename.new_type) == rename.new_id


# --------------------------------------------------------------------------- recorded on 2.11


def _recorded(version: str):
    from gbdoctor.report.json import load_scan_json

    return load_scan_json(REPO / "fixtures" / "scans" / f"llama4_ep2_torch{version}.json")


def test_the_ep2_scan_on_torch_2_11_is_attributed_to_ep_at_user_lines():
    """Recorded on torch 2.11.0 (fixtures/scans/README.md): the mesh lookup torch 2.11 breaks on
    is EP's, at the hook's line; no break is tensor-parallel or located in torch's files."""
    report = _recorded("2.11")
    assert report.torch_version.startswith("2.11.0")
    breaks = [b for blk in report.blocks for b in blk.breaks]
    assert breaks and all(b.cause != "tensor-parallel" for b in breaks)
    assert all(b.location is not None and b.location.file.startswith("gbdoctor/") for b in breaks)
    (lookup,) = {(b.cause, b.location.file, b.location.line) for b in breaks if b.gb_id == "GB0156"}
    assert lookup == ("ep-dispatch", "gbdoctor/setup/ep.py", 35)


def test_a_2_13_baseline_gates_the_2_11_scan_by_what_is_comparable():
    """Across torch releases the gate warns about the versions and matches every break that is
    the same (the FSDP hook, the first split-size sync); what torch 2.11 breaks on besides
    (the mesh lookup and the process group it cannot reconstruct) is reported, not hidden."""
    from gbdoctor.gate.baseline import baseline_from_reports
    from gbdoctor.gate.compare import check_gate

    result = check_gate([_recorded("2.11")], baseline_from_reports([_recorded("2.13")]))
    whats = [(f.severity, f.what) for f in result.findings]
    assert ("warning", "torch version 2.13.0+cpu -> 2.11.0+cu130") in whats
    regressions = {f.gb_type for f in result.findings if f.severity == "regression"}
    assert regressions == {"Unsupported method call", "Reconstruction failure"}
