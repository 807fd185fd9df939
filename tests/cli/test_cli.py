"""The CLI: exit codes, one-line errors, outputs (typer's CliRunner, stdout/stderr apart)."""

from __future__ import annotations

import io
import json

import pytest
from repo_paths import FIXTURES
from typer.testing import CliRunner

from gbdoctor.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)


def _run(*args: str):
    return runner.invoke(app, list(args))


def _one_line_error(result, *needles: str) -> None:
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


@pytest.mark.parametrize(
    "content, needles",
    [
        ("[model\nname='llama3'", ["llama3_bad.toml"]),
        (
            "[model]\nname='llama3'\nflavor='debugmodel'\n[training]\nseq_lenn=4\n",
            ["seq_lenn", "training", "seq_len"],
        ),
        ("[model]\nname='llama3'\nflavor='nope'\n", ["nope"]),
        (
            "[model]\nname='llama4'\nflavor='debugmodel'\n[parallelism]\nexpert_parallel_degree=3\n",
            ["expert_parallel_degree"],
        ),
        (
            "[model]\nname='llama3'\nflavor='debugmodel'\n[parallelism]\n"
            "tensor_parallel_degree=2\nenable_async_tensor_parallel=true\n",
            ["enable_async_tensor_parallel", "async TP"],
        ),
        (
            "[model]\nname='custom'\nflavor='x'\nfactory='does_not_exist.py:build'\n",
            ["does_not_exist.py"],
        ),
    ],
)
def test_bad_specs_exit_2_with_one_line(tmp_path, content, needles):
    spec = tmp_path / "llama3_bad.toml"
    spec.write_text(content)
    result = _run("inspect", str(spec))
    assert result.exit_code == 2, result.output
    _one_line_error(result, *needles)


def test_bad_override_and_strategy():
    result = _run("inspect", "fixtures/llama3_debug.toml", "--set", "training.nope=1")
    assert result.exit_code == 2
    _one_line_error(result, "nope")
    result = _run("scan", "fixtures/llama3_debug.toml", "--strategy", "fast")
    assert result.exit_code == 2


def test_missing_spec_file():
    result = _run("scan", "fixtures/does_not_exist.toml")
    assert result.exit_code == 2


def test_causes_list_and_explain():
    result = _run("causes")
    assert (
        result.exit_code == 0 and "fsdp-hook" in result.stdout and "inplace-in-sac" in result.stdout
    )
    result = _run("causes", "ep-dispatch")
    assert result.exit_code == 0 and "capture_scalar_outputs" in result.stdout
    result = _run("causes", "nope")
    assert result.exit_code == 2
    data = json.loads(_run("causes", "--format", "json").stdout)
    from gbdoctor.frameworks.registry import cause_taxonomy

    ids = cause_taxonomy().cause_ids
    assert sorted(c["id"] for c in data["causes"]) == sorted(ids)
    # A generic cause and one a framework contributes (DeepSpeed's) are both listed.
    assert "tensor-parallel" in ids and "zero-hook" in ids


def test_inspect_reports_wrappers_and_hooks():
    result = _run(
        "inspect", "fixtures/llama4_debug.toml", "--strategy", "titan-v0.2.2", "--format", "json"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    moe = next(b for b in data["blocks"] if b["moe"])
    assert moe["ac_wrapped"] == [moe["fqn"]]
    assert (
        f"{moe['fqn']}.attention" in moe["compiled"]
        and f"{moe['fqn']}.moe.experts" not in moe["compiled"]
    )
    assert moe["sharded"] == [moe["fqn"]]
    assert {h["installer"] for h in moe["hooks"]} == {"fsdp"}
    assert any(
        h["installer"] == "load-balancing" and h["kind"] == "optimizer_pre_step"
        for h in data["other_hooks"]
    )


def test_scan_strict_and_output_file(tmp_path, custom_spec):
    spec = custom_spec("planted.py", "graph_break")
    out = tmp_path / "scan.json"
    result = _run("scan", str(spec), "--format", "json", "--output", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["totals"]["by_cause"] == {"explicit": 2}
    assert _run("scan", str(spec), "--strict").exit_code == 1
    clean = custom_spec("planted.py", "clean")
    assert _run("scan", str(clean), "--strict").exit_code == 0


def test_gate_update_then_pass_then_fail_on_new_break(tmp_path, custom_spec):
    clean = custom_spec("planted.py", "clean")
    before = tmp_path / "before.json"
    after = tmp_path / "after.json"
    assert _run("scan", str(clean), "-f", "json", "-o", str(before)).exit_code == 0
    baseline = tmp_path / "baseline.json"
    assert (
        _run(
            "gate", "--scan", str(before), "--baseline", str(baseline), "--update-baseline"
        ).exit_code
        == 0
    )
    assert _run("gate", "--scan", str(before), "--baseline", str(baseline)).exit_code == 0
    # the same spec path now carries a planted break
    broken = custom_spec("planted.py", "nonzero")
    data = json.loads(_run("scan", str(broken), "-f", "json").stdout)
    data["spec"] = json.loads(before.read_text())["spec"]
    after.write_text(json.dumps(data))
    result = _run("gate", "--scan", str(after), "--baseline", str(baseline), "--format", "github")
    assert result.exit_code == 1
    assert "::error" in result.stdout and "planted.py" in result.stdout
    assert _run("diff", str(before), str(after)).exit_code == 1
    assert _run("diff", str(after), str(before)).exit_code == 0


def test_gate_malformed_baseline_exits_2(tmp_path):
    baseline = tmp_path / "baseline.json"
    baseline.write_text("[]")
    result = _run(
        "gate", "--scan", "fixtures/scans/llama4_before.json", "--baseline", str(baseline)
    )
    assert result.exit_code == 2
    _one_line_error(result)


def test_debug_shows_the_traceback_of_a_block_that_does_not_trace():
    """The report keeps a block's error to one line; --debug adds its traceback on stderr."""
    spec = ("fixtures/llama3_debug.toml", "--set", "model.flavor=debugmodel_flex_attn")
    quiet = _run("scan", *spec, "--format", "json")
    loud = _run("--debug", "scan", *spec, "--format", "json")
    assert "does not trace" not in quiet.stderr
    assert "does not trace:" in loud.stderr and "Traceback (most recent call last)" in loud.stderr
    assert json.loads(loud.stdout)["blocks"] == json.loads(quiet.stdout)["blocks"]


def test_debug_after_the_command_says_where_it_goes():
    result = _run("causes", "--debug")
    assert result.exit_code == 2
    assert "gbdoctor --debug COMMAND" in result.stderr


def test_progress_in_a_log_is_plain_lines_at_most_one_per_interval(tmp_path, monkeypatch) -> None:
    """Where stderr is a file or pipe (a CI log) a live bar draws nothing; progress is then a
    plain ``[elapsed] message`` line when the message changes, throttled. An in-memory stream
    (CliRunner's) is not a log and gets nothing."""
    from gbdoctor.cli import output

    log = (tmp_path / "stderr.log").open("w")
    monkeypatch.setattr("sys.stderr", log)
    with output.ProgressBar() as bar:
        bar("round 1/2: as set up", 0, 4)
        bar("round 1/2: as set up", 1, 4)
        bar("round 1/2: fix moe", 1, 4)  # within the interval: skipped
        monkeypatch.setattr(output, "PLAIN_PROGRESS_EVERY_S", 0.0)
        bar("round 2/2: fix moe", 2, 4)
        bar("round 2/2: fix moe", 3, 4)  # same message: skipped
    log.close()
    lines = (tmp_path / "stderr.log").read_text().splitlines()
    assert [line.split("] ", 1)[1] for line in lines if line.strip()] == [
        "round 1/2: as set up",
        "round 2/2: fix moe",
    ], lines
    assert all(line.startswith("[") and " s] " in line for line in lines if line.strip()), lines

    in_memory = io.StringIO()
    monkeypatch.setattr("sys.stderr", in_memory)
    with output.ProgressBar() as bar:
        bar("round 1/2: as set up", 0, 4)
    assert "s] round" not in in_memory.getvalue()
