"""The bad-input corpus: every case through the CLI, in-process (typer's CliRunner).

For each case: the documented exit code; exactly one ``Error:`` line, unwrapped, naming the
problem; no traceback; nothing left behind (no new file next to the inputs or outputs, no
``/dev/shm`` file, no child process); and for option, output, plan-file, baseline and spec errors,
failure before any model is built (a spy on ``gbdoctor.models.build_model`` and on the rank
launcher must not have been called).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from corpus.harness import (
    FACTORIES,
    check_one_error_line,
    children_of,
    shm_mapped,
)
from repo_paths import FIXTURES
from typer.testing import CliRunner

from gbdoctor.cli import app

SCAN = FIXTURES / "scans" / "llama4_before.json"
BASELINE = FIXTURES / "baselines" / "debug-specs.json"
LLAMA3 = FIXTURES / "llama3_debug.toml"
TINY = FIXTURES / "custom_tiny.toml"

runner = CliRunner()


# --------------------------------------------------------------------------- the harness


@dataclass
class Case:
    id: str
    args: list[str]
    """CLI arguments; ``{tmp}`` is the case's directory, ``{f:NAME}`` a file written there first."""
    code: int
    needles: tuple[str, ...]
    """Substrings of the one Error: line (one from its start, one from its end: no wrapping)."""
    files: dict[str, str | bytes] = field(default_factory=dict)
    before_build: bool = True
    """The error must come before any model is built (false for factory failures)."""


def _spec(body: str) -> str:
    return '[model]\nname = "llama3"\nflavor = "debugmodel"\n' + body


def _custom(flavor: str, factory: str | None = None, extra: str = "") -> str:
    factory = factory or f"{FACTORIES.as_posix()}:build"
    return (
        f'[model]\nname = "custom"\nflavor = "{flavor}"\nfactory = "{factory}"\n'
        f'[training]\nlocal_batch_size = 2\nseq_len = 16\n[gbdoctor]\nstrategy = "titan-v0.2.0"\n{extra}'
    )


def _scan_json(**changes) -> str:
    data = json.loads(SCAN.read_text())
    block = next(b for b in data["blocks"] if b["breaks"])
    for key, value in changes.items():
        if key == "line":
            block["breaks"][0]["location"]["line"] = value
        elif key == "count":
            block["breaks"][0]["count"] = value
        elif key in block:
            block[key] = value
        else:
            data[key] = value
    return json.dumps(data)


def _plan(**changes) -> str:
    plan = {
        "baseline_strategy": "titan-v0.2.0",
        "flag_costs": [],
        "flags": [["capture_scalar_outputs", True]],
        "kinds": [
            {
                "kind": "dense",
                "layers": ["layers.0"],
                "mode": "block",
                "fullgraph": True,
                "eager": [],
                "split_ac": False,
                "actions": [],
                "reasons": [],
                "breaks_before": 0,
                "breaks_after": 0,
                "events_before": 0,
                "events_after": 0,
                "fullgraph_share_before": 1.0,
                "fullgraph_share_after": 1.0,
                "verified": True,
                "detail": "",
            }
        ],
        "model": "custom/tiny",
        "rounds": 1,
        "schema_version": 1,
        "spec": "x.toml",
        "suggestions": [],
        "torch_version": "2.13.0",
        "verified": True,
    }
    for key, value in changes.items():
        if key in plan["kinds"][0]:
            plan["kinds"][0][key] = value
        else:
            plan[key] = value
    return json.dumps(plan)


_DEEP = "[" * 100000 + "]" * 100000
_BASELINE_OK = BASELINE.read_text()
_STDLIB_OS = os.path.join(os.path.dirname(os.__file__), "os.py")
_COLLECT_ENV = importlib.util.find_spec("torch.utils.collect_env").origin  # finds, runs nothing

CASES: list[Case] = [
    # ---- spec files
    Case("spec-missing", ["scan", "{tmp}/nope.toml"], 2, ("nope.toml", "no such spec file")),
    Case("spec-directory", ["scan", "{tmp}"], 2, ("is a directory",)),
    Case(
        "spec-binary",
        ["scan", "{f:bin.toml}"],
        2,
        ("bin.toml", "not UTF-8"),
        {"bin.toml": b"\xff\xfe\x00\x81"},
    ),
    Case(
        "spec-bad-toml",
        ["scan", "{f:s.toml}"],
        2,
        ("s.toml", "invalid TOML"),
        {"s.toml": "[model\nname='x'"},
    ),
    Case(
        "spec-unknown-section",
        ["scan", "{f:s.toml}"],
        2,
        ("unknown section [modle]", "known sections"),
        {"s.toml": "[modle]\nname='llama3'\n"},
    ),
    Case(
        "spec-unknown-key",
        ["scan", "{f:s.toml}"],
        2,
        ("seq_lenn", "did you mean 'seq_len'"),
        {"s.toml": _spec("[training]\nseq_lenn = 4\n")},
    ),
    Case(
        "spec-wrong-type",
        ["scan", "{f:s.toml}"],
        2,
        ("training.seq_len must be an integer", "a string"),
        {"s.toml": _spec('[training]\nseq_len = "long"\n')},
    ),
    Case(
        "spec-no-model",
        ["scan", "{f:s.toml}"],
        2,
        ("missing [model] section",),
        {"s.toml": "[training]\nseq_len = 4\n"},
    ),
    Case(
        "spec-unknown-family",
        ["scan", "{f:s.toml}"],
        2,
        ("'llama9' is not a known model family", "choose one of"),
        {"s.toml": '[model]\nname = "llama9"\n'},
    ),
    Case(
        "spec-unknown-flavor",
        ["scan", "{f:s.toml}"],
        2,
        ("'huge' is not a flavor of llama3", "valid flavors"),
        {"s.toml": '[model]\nname = "llama3"\nflavor = "huge"\n'},
    ),
    Case(
        "spec-section-not-table",
        ["scan", "{f:s.toml}"],
        2,
        ("[model] must be a table",),
        {"s.toml": "model = 3\n"},
    ),
    Case(
        "spec-factory-without-custom",
        ["scan", "{f:s.toml}"],
        2,
        ("factory is only used with name = 'custom'",),
        {"s.toml": _spec('factory = "x.py:build"\n')},
    ),
    Case(
        "spec-custom-without-factory",
        ["scan", "{f:s.toml}"],
        2,
        ("name = 'custom' needs a factory",),
        {"s.toml": '[model]\nname = "custom"\nflavor = "x"\n'},
    ),
    Case(
        "spec-factory-format",
        ["scan", "{f:s.toml}"],
        2,
        ("model.factory = 'nocolon' is not",),
        {"s.toml": '[model]\nname = "custom"\nflavor = "x"\nfactory = "nocolon"\n'},
    ),
    Case(
        "spec-pipeline-parallel",
        ["scan", "{f:s.toml}"],
        2,
        ("pipeline_parallel_microbatch_size = 3", "not divisible"),
        {
            "s.toml": _spec(
                "[parallelism]\npipeline_parallel_degree = 2\n"
                "pipeline_parallel_microbatch_size = 3\n"
            )
        },
    ),
    Case(
        "spec-ep-not-dividing",
        ["scan", "{f:s.toml}"],
        2,
        ("expert_parallel_degree = 3 does not divide",),
        {
            "s.toml": '[model]\nname = "llama4"\nflavor = "debugmodel"\n[parallelism]\nexpert_parallel_degree = 3\n'
        },
    ),
    Case(
        "spec-negative-degree",
        ["scan", "{f:s.toml}"],
        2,
        ("data_parallel_replicate_degree must be a positive integer",),
        {"s.toml": _spec("[parallelism]\ndata_parallel_replicate_degree = -2\n")},
    ),
    Case(
        "spec-world-too-big",
        ["scan", "{f:s.toml}"],
        2,
        ("world size 1000000000", "exceeds gbdoctor's limit of 16384 ranks"),
        {"s.toml": _spec("[parallelism]\ndata_parallel_shard_degree = 1000000000\n")},
    ),
    Case(
        "spec-degree-float",
        ["scan", "{f:s.toml}"],
        2,
        ("data_parallel_shard_degree must be an integer", "a number"),
        {"s.toml": _spec("[parallelism]\ndata_parallel_shard_degree = 1e9\n")},
    ),
    Case(
        "spec-timeout-inf",
        ["scan", "{f:s.toml}"],
        2,
        ("gbdoctor.timeout_s must be a number of seconds", "got inf"),
        {"s.toml": _spec("[gbdoctor]\ntimeout_s = inf\n")},
    ),
    Case(
        "spec-timeout-nan",
        ["scan", "{f:s.toml}"],
        2,
        ("gbdoctor.timeout_s must be a number of seconds", "got nan"),
        {"s.toml": _spec("[gbdoctor]\ntimeout_s = nan\n")},
    ),
    Case(
        "spec-timeout-negative",
        ["scan", "{f:s.toml}"],
        2,
        ("timeout_s must be", "got -1.0"),
        {"s.toml": _spec("[gbdoctor]\ntimeout_s = -1\n")},
    ),
    Case(
        "spec-timeout-huge",
        ["scan", "{f:s.toml}"],
        2,
        ("timeout_s must be", "got 1000000000000.0"),
        {"s.toml": _spec("[gbdoctor]\ntimeout_s = 1e12\n")},
    ),
    Case(
        "spec-sac-superscript",
        ["scan", "{f:s.toml}"],
        2,
        ("selective_ac_option = '²' must be a positive integer",),
        {
            "s.toml": _spec(
                "[activation_checkpoint]\nmode = 'selective'\nselective_ac_option = '²'\n"
            )
        },
    ),
    Case(
        "spec-sac-zero",
        ["scan", "{f:s.toml}"],
        2,
        ("selective_ac_option = '0' must be a positive integer",),
        {
            "s.toml": _spec(
                "[activation_checkpoint]\nmode = 'selective'\nselective_ac_option = '0'\n"
            )
        },
    ),
    Case(
        "spec-ac-mode",
        ["scan", "{f:s.toml}"],
        2,
        ("activation_checkpoint.mode = 'partial' is not one of",),
        {"s.toml": _spec("[activation_checkpoint]\nmode = 'partial'\n")},
    ),
    Case(
        "spec-capture-too-big",
        ["scan", "{f:s.toml}"],
        2,
        ("capture batch 100000 x 100000", "exceeds gbdoctor's limit"),
        {"s.toml": _spec("[gbdoctor]\nbatch_size = 100000\nseq_len = 100000\n")},
    ),
    Case(
        "spec-strategy",
        ["scan", "{f:s.toml}"],
        2,
        ("gbdoctor.strategy = 'fastest' is not a known strategy",),
        {"s.toml": _spec("[gbdoctor]\nstrategy = 'fastest'\n")},
    ),
    Case(
        "spec-device",
        ["scan", "{f:s.toml}"],
        2,
        ("gbdoctor.device = 'tpu' is not one of",),
        {"s.toml": _spec("[gbdoctor]\ndevice = 'tpu'\n")},
    ),
    # ---- --set values
    Case(
        "set-no-equals",
        ["scan", str(LLAMA3), "--set", "training.seq_len"],
        2,
        ("override 'training.seq_len' is not section.key=value",),
    ),
    Case(
        "set-unknown-section",
        ["scan", str(LLAMA3), "--set", "trainig.seq_len=4"],
        2,
        ("unknown section [trainig] (from --set",),
    ),
    Case(
        "set-unknown-key",
        ["scan", str(LLAMA3), "--set", "training.nope=1"],
        2,
        ("[training] unknown key 'nope' (from --set",),
    ),
    Case(
        "set-wrong-type",
        ["scan", str(LLAMA3), "--set", "parallelism.data_parallel_shard_degree=abc"],
        2,
        ("data_parallel_shard_degree (from --set", "must be an integer"),
    ),
    Case(
        "set-timeout-nan",
        ["scan", str(LLAMA3), "--set", "gbdoctor.timeout_s=nan"],
        2,
        ("timeout_s (from --set", "got nan"),
    ),
    Case(
        "set-timeout-inf",
        ["scan", str(LLAMA3), "--set", "gbdoctor.timeout_s=inf"],
        2,
        ("timeout_s (from --set", "got inf"),
    ),
    Case(
        "set-sac-superscript",
        [
            "scan",
            str(LLAMA3),
            "--set",
            "activation_checkpoint.mode=selective",
            "--set",
            "activation_checkpoint.selective_ac_option=²",
        ],
        2,
        ("selective_ac_option (from --set",),
    ),
    Case(
        "set-ep-zero",
        ["scan", str(LLAMA3), "--set", "parallelism.expert_parallel_degree=0"],
        2,
        ("expert_parallel_degree (from --set", "must be a positive integer"),
    ),
    Case(
        "set-world-too-big",
        ["scan", str(LLAMA3), "--set", "parallelism.data_parallel_shard_degree=1000000000"],
        2,
        ("world size 1000000000",),
    ),
    # ---- factories: targets a spec may not name (refused when the spec loads)
    Case(
        "factory-os-system",
        ["scan", "{f:s.toml}"],
        2,
        ("names the standard-library or builtin module 'os'",),
        {"s.toml": _custom("echo pwned", "os:system")},
    ),
    Case(
        "factory-builtins-exec",
        ["scan", "{f:s.toml}"],
        2,
        ("builtin module 'builtins'",),
        {"s.toml": _custom("print(1)", "builtins:exec")},
    ),
    Case(
        "factory-subprocess",
        ["scan", "{f:s.toml}"],
        2,
        ("module 'subprocess'",),
        {"s.toml": _custom("ls", "subprocess:run")},
    ),
    Case(
        "factory-os-path",
        ["scan", "{f:s.toml}"],
        2,
        ("module 'os.path'",),
        {"s.toml": _custom("x", "os.path:join")},
    ),
    Case(
        "factory-stdlib-file",
        ["scan", "{f:s.toml}"],
        2,
        ("is part of the Python standard library",),
        {"s.toml": _custom("x", f"{Path(_STDLIB_OS).as_posix()}:system")},
    ),
    Case(
        "factory-installed-package-file",  # a path into site-packages, not a module name
        ["scan", "{f:s.toml}"],
        2,
        ("collect_env.py', which belongs to the installed package 'torch'", "flavor string)"),
        {"s.toml": _custom("touch pwned", f"{Path(_COLLECT_ENV).as_posix()}:run")},
    ),
    *(
        Case(  # every command that loads a spec refuses it as the spec loads (a "pwned" file
            # written by the shell command would fail the files-left-behind check)
            f"factory-installed-package-{command[0]}",
            [*command, "{f:s.toml}"],
            2,
            ("which belongs to the installed package 'torch'", "flavor string)"),
            {"s.toml": _custom("touch pwned", "torch.utils.collect_env:run")},
        )
        for command in (
            ["scan"],
            ["inspect"],
            ["plan"],
            ["run"],
            ["gate", "--baseline", "{tmp}/b.json", "--update-baseline"],
            ["price"],
            ["timeline"],
        )
    ),
    # ---- factories that fail when they are loaded or called (the model build is where they fail)
    Case(
        "factory-file-missing",
        ["scan", "{f:s.toml}"],
        2,
        ("missing.py", "does not exist"),
        {"s.toml": _custom("x", "missing.py:build")},
        before_build=False,
    ),
    Case(
        "factory-module-missing",
        ["scan", "{f:s.toml}"],
        2,
        ("module 'no_such_pkg_xyz.models' not found",),
        {"s.toml": _custom("x", "no_such_pkg_xyz.models:build")},
        before_build=False,
    ),
    Case(
        "factory-no-attribute",
        ["scan", "{f:s.toml}"],
        2,
        ("has no attribute 'nope'",),
        {"s.toml": _custom("x", f"{FACTORIES.as_posix()}:nope")},
        before_build=False,
    ),
    Case(
        "factory-not-callable",
        ["scan", "{f:s.toml}"],
        2,
        ("'not_callable' is a int, not a function",),
        {"s.toml": _custom("x", f"{FACTORIES.as_posix()}:not_callable")},
        before_build=False,
    ),
    Case(
        "factory-reexported-stdlib",
        ["scan", "{f:s.toml}"],
        2,
        ("'reexported_system' is defined in posix",),
        {"s.toml": _custom("echo pwned", f"{FACTORIES.as_posix()}:reexported_system")},
        before_build=False,
    ),
    Case(
        "factory-raises",
        ["scan", "{f:s.toml}"],
        2,
        ("raised RuntimeError: the factory failed on purpose",),
        {"s.toml": _custom("raise")},
        before_build=False,
    ),
    Case(
        "factory-returns-none",
        ["scan", "{f:s.toml}"],
        2,
        ("returned NoneType, not a torch.nn.Module",),
        {"s.toml": _custom("none")},
        before_build=False,
    ),
    Case(
        "factory-no-layers",
        ["scan", "{f:s.toml}"],
        2,
        ("model Sequential has no non-empty ModuleList/ModuleDict of blocks",),
        {"s.toml": _custom("no-layers")},
        before_build=False,
    ),
    Case(
        "factory-empty-layers",
        ["scan", "{f:s.toml}"],
        2,
        ("has no non-empty ModuleList/ModuleDict of blocks with parameters",),
        {"s.toml": _custom("empty-layers")},
        before_build=False,
    ),
    Case(
        "factory-no-embedding",
        ["scan", "{f:s.toml}"],
        2,
        ("has no nn.Embedding",),
        {"s.toml": _custom("no-embedding")},
        before_build=False,
    ),
    Case(
        "factory-recursion",
        ["scan", "{f:s.toml}"],
        2,
        ("raised RecursionError",),
        {"s.toml": _custom("recursion")},
        before_build=False,
    ),
    Case(
        "factory-import-error",
        ["scan", "{f:s.toml}"],
        2,
        ("importing bad_syntax.py failed with SyntaxError",),
        {"s.toml": _custom("x", "bad_syntax.py:build"), "bad_syntax.py": "def build(:\n"},
        before_build=False,
    ),
    # ---- user code that ends the process: exit 3, saying where
    Case(
        "factory-sys-exit",
        ["scan", "{f:s.toml}"],
        3,
        ("user code called sys.exit(0) at", "factories.py:"),
        {"s.toml": _custom("sysexit0")},
        before_build=False,
    ),
    Case(
        "factory-exit-builtin",
        ["scan", "{f:s.toml}"],
        3,
        ("user code called sys.exit(0) at", "factories.py:"),
        {"s.toml": _custom("exit-builtin")},
        before_build=False,
    ),
    Case(
        "factory-os-exit-0",
        ["scan", "{f:s.toml}"],
        3,
        ("user code called os._exit(0) at", "factories.py:"),
        {"s.toml": _custom("osexit0")},
        before_build=False,
    ),
    Case(
        "factory-os-exit-1",
        ["gate", "{f:s.toml}", "--baseline", str(BASELINE)],
        3,
        ("user code called os._exit(1) at", "(in _misbehave)"),
        {"s.toml": _custom("osexit1")},
        before_build=False,
    ),
    Case(
        "forward-sys-exit",
        ["gate", "{f:s.toml}", "--baseline", str(BASELINE)],
        3,
        ("user code called sys.exit(0) at", "factories.py:"),
        {"s.toml": _custom("forward-sysexit")},
        before_build=False,
    ),
    Case(
        "forward-os-exit",
        ["scan", "{f:s.toml}"],
        3,
        ("user code called os._exit(0) at", "factories.py:"),
        {"s.toml": _custom("forward-osexit0")},
        before_build=False,
    ),
    Case(
        "import-sys-exit",
        ["scan", "{f:s.toml}"],
        3,
        ("user code called sys.exit(0) at", "exits_on_import.py:1"),
        {
            "s.toml": _custom("x", "exits_on_import.py:build"),
            "exits_on_import.py": "import sys; sys.exit(0)\n",
        },
        before_build=False,
    ),
    # ---- outputs and formats
    Case("output-directory", ["scan", str(LLAMA3), "-o", "{tmp}"], 2, ("output", "is a directory")),
    Case(
        "output-parent-file",
        ["scan", str(LLAMA3), "-o", "{f:plain.txt}/out.json"],
        2,
        ("is not a directory",),
        {"plain.txt": "x"},
    ),
    Case(
        "format-unknown", ["scan", str(LLAMA3), "--format", "yaml"], 2, ("unknown --format 'yaml'",)
    ),
    Case(
        "gate-format-unknown",
        ["gate", str(LLAMA3), "--baseline", str(BASELINE), "--format", "xml"],
        2,
        ("unknown --format 'xml'",),
    ),
    Case("run-csv-directory", ["run", str(LLAMA3), "--csv", "{tmp}"], 2, ("is a directory",)),
    Case(
        "inspect-format-unknown",
        ["inspect", str(LLAMA3), "--format", "markdown"],
        2,
        ("unknown --format 'markdown'",),
    ),
    # ---- plan files
    Case(
        "plan-missing",
        ["scan", str(TINY), "--plan", "{tmp}/none.json"],
        2,
        ("no such plan file",),
    ),
    Case(
        "plan-binary",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("not a plan file (binary data, not UTF-8 text)",),
        {"p.json": b"\x89PNG\x00\xff"},
    ),
    Case(
        "plan-not-json",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("not valid JSON (line 1",),
        {"p.json": "{oops"},
    ),
    Case(
        "plan-deep",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("nested too deeply",),
        {"p.json": _DEEP},
    ),
    Case(
        "plan-unknown-flag",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("'capture_everything' is not a torch._dynamo.config setting",),
        {"p.json": _plan(flags=[["capture_everything", True]])},
    ),
    Case(
        "plan-short-flag",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("$.flags[0]: expected 2 items, got 1",),
        {"p.json": _plan(flags=[["capture_scalar_outputs"]])},
    ),
    Case(
        "plan-unknown-mode",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("mode: 'everything' is not one of block, children",),
        {"p.json": _plan(mode="everything")},
    ),
    Case(
        "plan-schema",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("plan schema_version 7, this gbdoctor reads 1",),
        {"p.json": _plan(schema_version=7)},
    ),
    Case(
        "plan-negative",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("breaks_after: -3 is negative",),
        {"p.json": _plan(breaks_after=-3)},
    ),
    Case(
        "plan-wrong-type",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("fullgraph: expected bool, got str",),
        {"p.json": _plan(fullgraph="yes")},
    ),
    Case(
        "plan-foreign",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("does not match this model", "the model has dense, dense+ac"),
        {"p.json": _plan(kind="moe")},
        before_build=False,
    ),
    Case(
        "plan-missing-module",
        ["scan", str(TINY), "--plan", "{f:p.json}"],
        2,
        ("leaves module 'moe.experts' of the dense blocks eager", "no such module"),
        {
            "p.json": _plan(
                kinds=[
                    {
                        **json.loads(_plan())["kinds"][0],
                        "mode": "children",
                        "eager": ["moe.experts"],
                    },
                    {**json.loads(_plan())["kinds"][0], "kind": "dense+ac"},
                ]
            )
        },
        before_build=False,
    ),
    # ---- baselines
    Case(
        "baseline-missing",
        ["gate", str(LLAMA3), "--baseline", "{tmp}/none.json"],
        2,
        ("no such baseline file",),
    ),
    Case(
        "baseline-truncated",
        ["gate", str(LLAMA3), "--baseline", "{f:b.json}"],
        2,
        ("not valid JSON",),
        {"b.json": _BASELINE_OK[: len(_BASELINE_OK) // 2]},
    ),
    Case(
        "baseline-truncated-update",
        ["gate", str(LLAMA3), "--baseline", "{f:b.json}", "--update-baseline"],
        2,
        ("not valid JSON",),
        {"b.json": _BASELINE_OK[:40]},
    ),
    Case(
        "baseline-empty",
        ["gate", str(LLAMA3), "--baseline", "{f:b.json}"],
        2,
        ("not valid JSON",),
        {"b.json": ""},
    ),
    Case(
        "baseline-negative",
        ["gate", str(LLAMA3), "--baseline", "{f:b.json}"],
        2,
        ("graph_count: expected a non-negative integer",),
        {"b.json": _BASELINE_OK.replace('"graph_count": 1', '"graph_count": -1', 1)},
    ),
    Case(
        "baseline-is-scan",
        ["gate", str(LLAMA3), "--baseline", str(SCAN)],
        2,
        ("this is a scan report, not a baseline",),
    ),
    Case(
        "baseline-deep",
        ["gate", str(LLAMA3), "--baseline", "{f:b.json}"],
        2,
        ("nested too deeply",),
        {"b.json": _DEEP},
    ),
    Case(
        "baseline-binary",
        ["gate", str(LLAMA3), "--baseline", "{f:b.json}"],
        2,
        ("not a baseline file (binary data",),
        {"b.json": b"\xff\x00\xfe"},
    ),
    Case(
        "baseline-update-directory",
        ["gate", str(LLAMA3), "--baseline", "{tmp}", "--update-baseline"],
        2,
        ("baseline", "is a directory"),
    ),
    # ---- scan JSON (diff and gate --scan)
    Case(
        "scan-negative-graphs",
        ["diff", str(SCAN), "{f:n.json}"],
        2,
        ("graph_count: -5 is negative",),
        {"n.json": _scan_json(graph_count=-5)},
    ),
    Case(
        "scan-negative-line",
        ["diff", str(SCAN), "{f:n.json}"],
        2,
        ("location.line: -1 is negative",),
        {"n.json": _scan_json(line=-1)},
    ),
    Case(
        "scan-zero-count-type",
        ["diff", str(SCAN), "{f:n.json}"],
        2,
        ("count: expected int, got float",),
        {"n.json": _scan_json(count=1.5)},
    ),
    Case(
        "scan-deep", ["diff", str(SCAN), "{f:n.json}"], 2, ("nested too deeply",), {"n.json": _DEEP}
    ),
    Case("scan-missing", ["diff", str(SCAN), "{tmp}/none.json"], 2, ("no such scan file",)),
    Case(
        "scan-not-json", ["diff", str(SCAN), "{f:n.json}"], 2, ("not valid JSON",), {"n.json": "{]"}
    ),
    Case(
        "scan-schema",
        ["diff", str(SCAN), "{f:n.json}"],
        2,
        ("scan schema_version 99",),
        {"n.json": _scan_json(schema_version=99)},
    ),
    Case(
        "scan-unknown-key",
        ["diff", str(SCAN), "{f:n.json}"],
        2,
        ("unknown key(s) ['colour']",),
        {"n.json": _scan_json(colour="red")},
    ),
    Case(
        "gate-scan-negative",
        ["gate", "--scan", "{f:n.json}", "--baseline", str(BASELINE)],
        2,
        ("graph_count: -5 is negative",),
        {"n.json": _scan_json(graph_count=-5)},
    ),
    # ---- run options
    Case(
        "run-steps-zero", ["run", str(LLAMA3), "--steps", "0"], 2, ("--steps must be at least 1",)
    ),
    Case(
        "run-mode-unknown",
        ["run", str(LLAMA3), "--modes", "eager,turbo"],
        2,
        ("unknown run mode(s) 'turbo'",),
    ),
    Case(
        "run-nproc",
        ["run", str(LLAMA3), "--nproc", "4"],
        2,
        ("--nproc 4 does not match the spec's world size 1",),
    ),
    Case(
        "run-backend",
        ["run", str(LLAMA3), "--backend", "warp"],
        2,
        ("unknown compile backend 'warp'",),
    ),
    # ---- usage errors from the option parser
    Case(
        "usage-unknown-option", ["inspect", str(LLAMA3), "--fast"], 2, ("no such option: --fast",)
    ),
    Case(
        "usage-bad-int",
        ["run", str(LLAMA3), "--steps", "many"],
        2,
        ("Invalid value for '--steps'", "integer"),
    ),
    Case(
        "usage-plan-and-strategy",
        ["scan", str(TINY), "--plan", str(SCAN), "--strategy", "block"],
        2,
        ("--plan and --strategy are mutually exclusive",),
    ),
]


@pytest.fixture
def build_spy(monkeypatch):
    """Records every model build and rank launch (and lets them run)."""
    import gbdoctor.models
    import gbdoctor.scan.environment
    import gbdoctor.scan.inspect
    import gbdoctor.setup.dist

    calls: list[str] = []
    real_build, real_ranks = gbdoctor.models.build_model, gbdoctor.setup.dist.run_ranks

    def build(*args, **kwargs):
        calls.append("build_model")
        return real_build(*args, **kwargs)

    def ranks(*args, **kwargs):
        calls.append("run_ranks")
        return real_ranks(*args, **kwargs)

    monkeypatch.setattr(gbdoctor.models, "build_model", build)
    for module in (gbdoctor.setup.dist, gbdoctor.scan.environment, gbdoctor.scan.inspect):
        monkeypatch.setattr(module, "run_ranks", ranks)
    return calls


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _expand(arg: str, tmp: Path) -> str:
    if arg.startswith("{f:"):
        name, _, rest = arg[3:].partition("}")
        return str(tmp / name) + rest
    return arg.replace("{tmp}", str(tmp))


# Fresh ranks: the check that no child process is left behind would see the session's warm
# ranks started by a case as left behind (and not see a case's own ranks that were left).
@pytest.mark.fresh_ranks
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, build_spy, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name, content in case.files.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    args = [_expand(a, tmp_path) for a in case.args]
    before_files, before_shm, before_children = (
        _tree(tmp_path),
        shm_mapped(),
        set(children_of(os.getpid())),
    )
    result = runner.invoke(app, args)
    assert result.exit_code == case.code, (result.exit_code, result.stderr, result.stdout)
    check_one_error_line(result.stderr, result.stdout, case.needles)
    if case.before_build:
        assert build_spy == [], f"failed only after {build_spy}"
    assert _tree(tmp_path) == before_files, "files left behind"
    assert shm_mapped() <= before_shm, "/dev/shm files left behind"
    assert set(children_of(os.getpid())) <= before_children, "child processes left behind"


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


def test_python_version_has_stdlib_names() -> None:
    # The stdlib refusal reads sys.stdlib_module_names (Python 3.10+).
    assert "os" in sys.stdlib_module_names and "subprocess" in sys.stdlib_module_names
