"""One input-validation layer, run before anything heavy (issue 45): every number is checked
with its unit and range, every string is valid Unicode, and a bad value is exit 2 naming it.

- JSON reads (``report``, ``diff``, ``gate --scan``, ``plan --price``, ``run --price``, all
  through ``records.io``): a 401-digit integer in a float field, a lone surrogate in a string
  and an implausible price (``world_size`` 0, ``rounds`` 1e18, ``share`` 1e308) name the field.
- Options: ``price``'s and ``timeline``'s numbers and ``--plan`` are checked in the first second,
  ``--set`` integers are int64 and typed against the spec, ``--dynamo-config`` values are typed
  against ``torch._dynamo.config``'s own types, a spec name must be valid UTF-8.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import Done, in_process
from repo_paths import FIXTURES, REPO

from gbdoctor.errors import BaselineError
from gbdoctor.records import PriceReport
from gbdoctor.records.io import to_jsonable
from gbdoctor.report.json import load_scan_json

SCAN = FIXTURES / "scans" / "llama4_before.json"
SPEC = FIXTURES / "custom_tiny.toml"


def gbdoctor(*args: str, cwd: Path = REPO) -> Done:
    """In this process (``tests/cli_runs.py``): these commands end before any rank or model."""
    return in_process(*args, cwd=cwd)


def gbdoctor_process(
    *args: str, cwd: Path = REPO, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gbdoctor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _priced_scan() -> dict:
    data = json.loads(SCAN.read_text())
    price = PriceReport(backend="inductor", device="cpu", device_name="cpu", world_size=1,
                        rounds=2, warmup=1, steps=1, batch_size=1, seq_len=1, step_ms=100.0,
                        step_spread_ms=(90.0, 110.0), kinds=(), breaks=())  # fmt: skip
    data["price"] = to_jsonable(price)
    return data


def _write(tmp_path: Path, data: dict, text: str | None = None) -> Path:
    path = tmp_path / "scan.json"
    path.write_text(text if text is not None else json.dumps(data))
    return path


def test_a_priced_scan_as_written_reads_back(tmp_path: Path) -> None:
    """The control: the ranges refuse nothing gbdoctor writes."""
    report = load_scan_json(_write(tmp_path, _priced_scan()))
    assert report.price is not None and report.price.rounds == 2


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("world_size", 0, "$.price.world_size: must be at least 1 (got 0)"),
        ("rounds", 10**18, "$.price.rounds: must be at most 1000 rounds (got 1000000000000000000)"),
        ("step_ms", 10**400, "$.price.step_ms: a 401-digit number is out of range"),
        ("seq_len", -5, "$.price.seq_len: -5 is"),
    ],
    ids=["world_size-0", "rounds-1e18", "float-401-digits", "seq_len-negative"],
)
def test_an_implausible_price_field_is_refused_by_name(
    tmp_path: Path, field: str, value: int, words: str
) -> None:
    data = _priced_scan()
    data["price"][field] = value
    with pytest.raises(BaselineError, match=re.escape(words)):
        load_scan_json(_write(tmp_path, data))


def test_a_share_of_1e308_steps_is_refused(tmp_path: Path) -> None:
    data = _priced_scan()
    kind = {"kind": "layers", "layers": 1, "counterfactual": "plan-fix", "recipe": "block",
            "ms_per_step": 1.0, "share": 1e308}  # fmt: skip
    data["price"]["kinds"] = [kind]
    with pytest.raises(
        BaselineError,
        match=r"\$\.price\.kinds\[0\]\.share: must be at most 100 steps \(got 1e\+308\)",
    ):
        load_scan_json(_write(tmp_path, data))


def test_a_lone_surrogate_in_a_string_is_refused_by_name(tmp_path: Path) -> None:
    data = json.loads(SCAN.read_text())
    text = json.dumps(data).replace('"model": "', '"model": "\\ud800', 1)
    with pytest.raises(BaselineError, match=r"\$\.model: not valid Unicode"):
        load_scan_json(_write(tmp_path, data, text))


@pytest.mark.parametrize("command", ["report", "diff", "gate"])
def test_the_commands_that_read_a_scan_json_say_which_field(tmp_path: Path, command: str) -> None:
    data = json.loads(SCAN.read_text())
    text = json.dumps(data).replace('"model": "', '"model": "\\udc80', 1)
    bad = _write(tmp_path, data, text)
    args = {
        "report": ["report", str(bad), "-o", str(tmp_path / "r.html")],
        "diff": ["diff", str(SCAN), str(bad)],
        "gate": [
            "gate",
            "--scan",
            str(bad),
            "--baseline",
            str(tmp_path / "b.json"),
            "--update-baseline",
            "--html",
            str(tmp_path / "g.html"),
        ],  # fmt: skip
    }[command]
    done = gbdoctor(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "$.model: not valid Unicode" in done.stderr and "Traceback" not in done.stderr


def test_a_401_digit_integer_in_a_float_field_of_a_block_is_refused(tmp_path: Path) -> None:
    data = _priced_scan()
    data["price"]["step_spread_ms"] = [10**400, 1.0]
    done = gbdoctor("report", str(_write(tmp_path, data)), "-o", str(tmp_path / "r.html"))
    assert done.returncode == 2, done.stderr
    assert "$.price.step_spread_ms[0]: a 401-digit number is out of range" in done.stderr


# --------------------------------------------------------------------------- options


def _quick(
    *args: str, cwd: Path = REPO, process: bool = False
) -> Done | subprocess.CompletedProcess:
    """The command, which must end with exit 2 before any model is built (``process``: in a
    fresh interpreter, whose argv the operating system hands over as bytes)."""
    started = time.monotonic()
    done = gbdoctor_process(*args, cwd=cwd, timeout=60) if process else gbdoctor(*args, cwd=cwd)
    elapsed = time.monotonic() - started
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2
    # No progress line came before the error: nothing was scanned or trained. (Timed loosely:
    # the start and imports alone take tens of seconds on a loaded machine.)
    assert elapsed < 60, f"{args}: {elapsed:.1f} s"
    return done


BIG = "99999999999999999999"


@pytest.mark.parametrize(
    "options, words",
    [
        (["--rounds", "0"], "--rounds must be at least 1 (got 0)"),
        (["--steps", "0"], "--steps must be at least 1 (got 0)"),
        (["--warmup", "-1"], "--warmup must be at least 1 (got -1)"),
        (["--batch-size", "-1"], "--batch-size must be at least 1 (got -1)"),
        (["--seq-len", "-5"], "--seq-len must be at least 1 (got -5)"),
        (["--rounds", BIG], "--rounds must be at most 1000 rounds (got 99999999999999999999)"),
        (["--steps", BIG], "--steps must be at most 100000 steps (got 99999999999999999999)"),
        (["--plan", "/dev/zero"], "not a regular file"),
        (["--plan", "missing-plan.json"], "no such plan file"),
        (["--plan", str(SPEC)], "not valid JSON"),
    ],
    ids=[
        "rounds0",
        "steps0",
        "warmup-1",
        "batch-1",
        "seq-5",
        "rounds-big",
        "steps-big",
        "plan-dev-zero",
        "plan-missing",
        "plan-toml",
    ],  # fmt: skip
)
def test_price_checks_its_options_before_the_scan(options: list[str], words: str) -> None:
    done = _quick("price", str(SPEC), *options)
    assert words in done.stderr, done.stderr


@pytest.mark.parametrize(
    "options, words",
    [
        (
            ["--steps", "100000000000000"],
            "--steps must be at most 100000 steps (got 100000000000000)",
        ),
        (["--batch-size", "-1"], "--batch-size must be at least 1 (got -1)"),
        (["--seq-lens", "64,-3"], "--seq-lens must be at least 1 (got -3)"),
        (["--dynamo-config", "recompile_limit=abc"], "recompile_limit"),
        (["--dynamo-config", "recompile_limit=1e999"], "recompile_limit"),
        (["--dynamo-config", "__class__=1"], "__class__"),
        (["--dynamo-config", "no_such_flag=1"], "no_such_flag"),
        (["--dynamo-config", "capture_scalar_outputs=maybe"], "capture_scalar_outputs"),
    ],
    ids=[
        "steps-big",
        "batch-1",
        "seq-lens",
        "dc-abc",
        "dc-1e999",
        "dc-dunder",
        "dc-unknown",
        "dc-bool",
    ],  # fmt: skip
)
def test_timeline_checks_its_options_before_the_ranks_start(options: list[str], words: str) -> None:
    done = _quick("timeline", str(SPEC), *options)
    assert words in done.stderr, done.stderr


@pytest.mark.parametrize(
    "override, words",
    [
        ("training.seq_len=9999999999999999999999", "training.seq_len"),
        ("training.steps=" + "9" * 5000, "training.steps"),
        ('compile.components="model"', "compile.components"),
        ("training.local_batch_size=-2", "training.local_batch_size"),
    ],
    ids=["int64", "5000-digits", "string-for-list", "negative"],
)
def test_set_values_are_checked_and_named(override: str, words: str) -> None:
    done = _quick("inspect", str(SPEC), "--set", override)
    assert words in done.stderr, done.stderr


@pytest.mark.parametrize("run", ["../../x:cfg", "llama3:../x", "/abs/path:cfg"])
def test_a_registry_run_that_is_not_a_module_name_is_refused(run: str) -> None:
    done = _quick("scan", "--torchtitan", run)
    assert "MODULE must be a dotted module name" in done.stderr, done.stderr


def test_a_spec_name_that_is_not_utf8_is_refused_before_the_scan(tmp_path: Path) -> None:
    name = os.fsdecode(b"spec-\xff.toml")
    (tmp_path / name).write_text(
        SPEC.read_text().replace("models/", str(FIXTURES / "models") + "/")
    )
    # A real process: the name reaches it as argv bytes, decoded as Python decodes them.
    done = _quick("scan", name, "-o", str(tmp_path / "out.json"), cwd=tmp_path, process=True)
    assert "not valid UTF-8" in done.stderr, done.stderr
    assert not (tmp_path / "out.json").exists()


def test_dataclass_fields_of_price_carry_their_ranges() -> None:
    """The mechanism, not the case: every measured size of a price names its range."""
    import typing

    hints = typing.get_type_hints(PriceReport, include_extras=True)
    for name in ("world_size", "rounds", "warmup", "steps", "batch_size", "seq_len"):
        assert typing.get_origin(hints[name]) is typing.Annotated, name
    assert {f.name for f in dataclasses.fields(PriceReport)} >= set(hints)
