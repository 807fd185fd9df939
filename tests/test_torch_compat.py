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
def test_a_rename_maps_both_ways_by_release(rename):
    before = f"{rename.since[0]}.{rename.since[1] - 1}.0"
    since = f"{rename.since[0]}.{rename.since[1]}.0"
    assert gb_type_in(rename.old_type, since) == rename.new_type
    assert gb_type_in(rename.new_type, before) == rename.old_type
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
