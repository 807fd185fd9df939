"""gbdoctor.causes: taxonomy, registry lookup, reason parsing, classification rules.

The unit tests use reason texts emitted by torch 2.13 (captured while building the fixtures),
and every gb_type of the installed torch's registry formatted by Dynamo's own formatter.
The integration test compiles every planted fixture block and classifies what Dynamo logged.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import sys
from pathlib import Path

import pytest
from repo_paths import FIXTURES, REPO
from torch_versions import expected_gb_types, torch_bug

from gbdoctor import causes
from gbdoctor.causes import (
    BLOCKER_EXPLANATIONS,
    EFFORTS,
    GENERIC_CAUSES,
    OWNERS,
    PLAN_ACTIONS,
    Cause,
    CauseKnowledge,
    KnownIssue,
    Precedent,
    classify,
    combine,
    gb_id_for,
    gb_registry,
    gb_type_in,
    parse_reason,
    parse_reasons,
)
from gbdoctor.causes.parse import DATA_DEPENDENT_BRANCHING
from gbdoctor.errors import PluginError, SpecError
from gbdoctor.frameworks import registry
from gbdoctor.frameworks.registry import cause_taxonomy
from gbdoctor.records import BlockerKind, CauseId, Location, RawBreak
from gbdoctor.torch_compat import torch_version

PLANTED_PATH = FIXTURES / "models" / "planted.py"
URL = " For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb{}.html"

EXPECTED_IDS = {
    "backward-hook",
    "tensor-parallel",
    "zero-hook",
    "fsdp-hook",
    "ep-dispatch",
    "moe-load-balancing",
    "inplace-in-sac",
    "data-dependent",
    "python-side-effect",
    "collective",
    "compiler-disabled",
    "explicit",
    "unsupported",
    "error",
}

# --------------------------------------------------------------------------- real reason texts

PRINT = """Failed to trace builtin operator
  Explanation: Dynamo does not know how to trace builtin operator `print` with argument types ['str', 'Size'] (has_kwargs False)
  Hint: Avoid calling builtin `print` with argument types ['str', 'Size']. Consider using an equivalent alternative function/method to `print`.
  Hint: If you are attempting to call a logging function (e.g. `print`), you can try adding it to `torch._dynamo.config.reorderable_logging_functions`.
  Hint: Please report an issue to PyTorch.

  Developer debug context: builtin print [<class 'torch._dynamo.variables.constant.ConstantVariable'>, <class 'torch._dynamo.variables.lists.SizeVariable'>] False

""" + URL.format("0059")

ITEM = """Unsupported Tensor.item() call with capture_scalar_outputs=False
  Explanation: Dynamo does not support tracing `Tensor.item()` with config.capture_scalar_outputs=False.
  Hint: Set `torch._dynamo.config.capture_scalar_outputs = True` or `export TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS=1` to include these operations in the captured graph.

  Developer debug context: call_method TensorVariable() item () {}

""" + URL.format("0124")

NONZERO = """Dynamic shape operator
  Explanation: Operator `aten.nonzero.default`'s output shape depends on input Tensor data.
  Hint: Enable tracing of dynamic shape operators with `torch._dynamo.config.capture_dynamic_output_shape_ops = True`

  Developer debug context: aten.nonzero.default

""" + URL.format("0036")

BINCOUNT = NONZERO.replace("nonzero", "bincount")

GRAPH_BREAK = """Call to `torch._dynamo.graph_break()`
  Explanation: User-inserted graph break. Message: None
  Hint: Remove the `torch._dynamo.graph_break()` call.

  Developer debug context: Called `torch._dynamo.graph_break()` with args `[]`, kwargs `{}`

""" + URL.format("0025")

ZLIB = """Attempted to call function marked as skipped
  Explanation: Dynamo does not know how to trace the builtin `zlib.crc32.` This function is either a Python builtin (e.g. _warnings.warn) or a third-party C/C++ Python extension (perhaps created with pybind).
  Hint: If it is a Python builtin, please file an issue on GitHub so the PyTorch team can add support for it and see the next case for a workaround.
  Hint: If it is a third-party C/C++ Python extension, please either wrap it into a PyTorch-understood custom operator (see https://pytorch.org/tutorials/advanced/custom_ops_landing_page.html for more details) or, if it is traceable, use `torch.compiler.allow_in_graph`.

  Developer debug context: module: zlib, qualname: crc32, skip reason: cannot determine source file for zlib (likely a C extension or builtin)

""" + URL.format("0007")

SKIP_DISABLE = """Attempted to call function marked as skipped
  Explanation: Dynamo developers have intentionally marked that the function `disable` in file `/venv/lib/python3.11/site-packages/torch/_dynamo/decorators.py` should not be traced.
  Hint: Avoid calling the function `disable`.

  Developer debug context: module: torch._dynamo.decorators, qualname: disable, skip reason: file matches MOD_SKIPLIST (/venv/lib/python3.11/site-packages/torch/_dynamo)

""" + URL.format("0007")

SKIP_ADD_ = """Attempted to call function marked as skipped
  Explanation: Dynamo does not know how to trace the builtin `<unknown module>.Tensor.add_.` This function is either a Python builtin (e.g. _warnings.warn) or a third-party C/C++ Python extension (perhaps created with pybind).
  Hint: If it is a Python builtin, please file an issue on GitHub so the PyTorch team can add support for it and see the next case for a workaround.

  Developer debug context: module: <unknown module>, qualname: Tensor.add_, skip reason: cannot determine source file for  (likely a C extension or builtin)

""" + URL.format("0007")

PYTHON_TYPE = """Unsupported python_type() call
  Explanation: This VariableTracker does not implement python_type(), which is required for object protocol operations.
  Hint: This is likely to be a Dynamo bug. Please report an issue to PyTorch.

  Developer debug context: GetAttrVariable(LoggingLoggerVariable(), handlers) does not implement python_type()

""" + URL.format("4841")

LOGGER_INFO = """logging.Logger method not supported for non-export cases
  Explanation: logging.Logger methods are not supported for non-export cases.
  Hint: Add the logging method to `torch._dynamo.config.ignore_logging_functions`.

  Developer debug context: method: <Logger probe.user (INFO)>.info, args: [ConstantVariable(str: 'logger.info too')], kwargs: {}

""" + URL.format("0291")

TOLIST_FLOAT = """Tensor.tolist() with non-integer tensor
  Explanation: Dynamo currently does not support tracing `tolist()` on non-integer tensors.
  Hint: Ensure the input tensor to `tolist()` is an integer type (e.g., int8, int16, int32, int64).

  Developer debug context: call_method TensorVariable() to_list

""" + URL.format("0109")

LOCAL_SCALAR = """Data dependent operator
  Explanation: Operator `aten._local_scalar_dense.default` has a non-Tensor output whose value is dependent on the data of Tensor inputs.
  Hint: Enable tracing of data-dependent output operators with `torch._dynamo.config.capture_scalar_outputs = True`

  Developer debug context: aten._local_scalar_dense.default

""" + URL.format("0033")

DISABLED = """Skip calling `torch.compiler.disable()`d function
  Explanation: Skip calling function `<function eager_only at 0x7f5e05232660>` since it was wrapped with `torch.compiler.disable` (reason: None)
  Hint: Remove the `torch.compiler.disable` call

  Developer debug context: <function eager_only at 0x7f5e05232660>

""" + URL.format("0098")

DISABLED_FSDP = DISABLED.replace("(reason: None)", "(reason: skipping FSDP hooks)")

GENERIC_JUMP = """generic_jump SymNodeVariable()
Consider annotating your code using torch._check*(). Could not guard on data-dependent expression zuf0 > 0.0 (unhinted: zuf0 > 0.0).  (Size-like symbols: none)

consider using data-dependent friendly APIs such as guard_or_false, guard_or_true and statically_known_true.
Caused by: if h.mean().item() > 0:  # exp02_classic.py:25 in forward (_dynamo/variables/tensor.py:2606 in evaluate_expr)
For more information, run with TORCH_LOGS="dynamic"
"""

REORDER = """attempted to reorder a debugging function that can't actually be reordered
  Explanation: `torch.compile` can only reorder functions where the arguments are Tensors, constants, or string formatters.
  Hint: Avoid calling the logging function <built-in function print> with args that are not supported.

  Developer debug context: fn: <built-in function print>, args: [ConstantVariable(str: 'shape'), SizeVariable(length=3)], kwargs: {}

""" + URL.format("0296")

BACKWARD_HOOK = """Module-level backwards hooks require compiled autograd.
  Explanation: 
  Hint: Enable compiled autograd by setting torch._dynamo.config.compiled_autograd = True.

  Developer debug context: 

""" + URL.format("0083")

NON_NULLIFIED = """HOP: Non-nullified side effect
  Higher Order Operator: torch.utils.checkpoint.checkpoint
  Explanation: Attribute 'calls' on an outer-scope object was changed from 0 to 1 inside a higher-order op subgraph. Dynamo only supports mutations that are undone before the subgraph exits (e.g., context managers that save/restore a flag). If you intentionally want this side effect, move the mutation outside of the higher-order op.
  Hint: This graph break is fundamental - it is unlikely that Dynamo will ever be able to trace through your code. Consider finding a workaround.

  Developer debug context: Attribute 'calls' was not restored to its original value

""" + URL.format("4413")

ASYNC_OP = """async_op=True for distributed collectives
  Explanation: `torch.compile` doesn't support `async_op=True for <function all_reduce at 0x7ff04fd9cfe0>
  Hint: It may be possible to write Dynamo tracing rules for this code. Please report an issue to PyTorch if you encounter this graph break often and it is causing performance issues.

  Developer debug context: <function all_reduce at 0x7ff04fd9cfe0>, args=[], kwargs={'tensor': TensorVariable(), 'async_op': ConstantVariable(bool: True)}

""" + URL.format("0172")

WORK_WAIT = """Unsupported method call
  Explanation: Dynamo does not know how to trace method `wait` of class `Work`
  Hint: Avoid calling `Work.wait` in your code.
  Hint: Please report an issue to PyTorch.

  Developer debug context: call_method UserDefinedObjectVariable(Work) wait [] {}

""" + URL.format("0156")

FAKE_TENSOR = """RuntimeError when making fake tensor call
  Explanation: Dynamo failed to run FX node with fake tensors: call_function <built-in method _grouped_mm of type object at 0x7f0be40cea40>(...): got RuntimeError('Expected inputs of BF16 type but got mat_a.dtype=torch.float32 and mat_b.dtype=torch.float32.')
  Hint: Your code may result in an error when running in eager.

  Developer debug context: 

""" + URL.format("4315")

# A whole graph_breaks log record (FSDP2 root compile, torch 2.13), chained with GB7000.
FSDP_ROOT_RECORD = """Graph break in user code at /venv/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_common.py:30
Graph Break Reason: Failed to handle graph break gracefully. Skipping the function and falling back to eager. Graph break encountered:
Attempted to call function marked as skipped
  Explanation: Dynamo developers have intentionally marked that the function `disable` in file `/venv/lib/python3.11/site-packages/torch/_dynamo/decorators.py` should not be traced.
  Hint: Avoid calling the function `disable`.

  Developer debug context: module: torch._dynamo.decorators, qualname: disable, skip reason: file matches MOD_SKIPLIST (/venv/lib/python3.11/site-packages/torch/_dynamo)

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0007.html
*** While handling this graph break, another graph break occurred: ***
graph break in loop
  Explanation: torch.compile detected a graph break in a for/while loop. Skipping the frame and falling back to eager, as graph breaks in loops are not supported.
  Hint: This graph break may have been caused by an earlier graph break. Resolving the earlier graph break may resolve this one.

  Developer debug context: frame skipped: forward (/work/main/fixtures/models/planted.py line 379)

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb7000.html

Stack variable source attribution:
  DictValuesIterator() originated from:
  File "/work/main/fixtures/models/planted.py", line 381
            for layer in self.layers.values():

User code traceback:
  File "/work/main/fixtures/models/planted.py", line 382, in forward
    h = layer(h)
"""

# The same break under capture_scalar_outputs=True, as the graph_breaks log shows it.
INLINE_REASON_RECORD = """Graph break in user code at /work/main/fixtures/models/planted.py:115
Graph Break Reason: Data-dependent branching
  Explanation: Detected data-dependent branching (e.g. `if my_tensor.sum() > 0:`). Dynamo does not support tracing dynamic control flow.
  Hint: This graph break is fundamental - it is unlikely that Dynamo will ever be able to trace through your code. Consider finding a workaround.
  Hint: Use `torch.cond` to express dynamic control flow.
  Developer debug context: attempted to jump with SymNodeVariable()
 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0170.html
User code traceback:
  File "/work/main/fixtures/models/planted.py", line 115, in planted
    if h.mean().item() > 0:
"""

TORCH_NN = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"
FSDP_COMMON = (
    "/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_common.py"
)
MODEL = "/repo/model.py"


def raw_break(message: str, **kw) -> RawBreak:
    """A RawBreak as capture.py builds it: gb_type and fields parsed from the message."""
    reason = parse_reason(message)
    fields = dict(
        gb_type=reason.gb_type,
        message=message,
        explanation=reason.explanation,
        hints=reason.hints,
        context=reason.context,
        hop=reason.hop,
        in_checkpoint=bool(reason.hop and "checkpoint" in reason.hop),
    )
    fields.update(kw)
    return RawBreak(**fields)


def frames(*specs: tuple[str, int, str]) -> tuple[Location, ...]:
    return tuple(Location(file=f, line=n, function=fn) for f, n, fn in specs)


# --------------------------------------------------------------------------- taxonomy


CAUSES = cause_taxonomy().causes
"""The whole taxonomy: the generic causes and the frameworks' additions."""


def test_cause_ids_are_exactly_the_contract():
    assert set(CAUSES) == EXPECTED_IDS == {str(c) for c in CauseId}
    assert tuple(CAUSES) == cause_taxonomy().cause_ids
    # zero-hook is DeepSpeed's (its library's hooks), the rest generic.
    assert set(GENERIC_CAUSES) == EXPECTED_IDS - {"zero-hook"}


def test_frameworks_add_precedents_to_generic_fixes():
    generic = GENERIC_CAUSES["fsdp-hook"].fixes[0]
    assert CAUSES["fsdp-hook"].fixes[0] == generic + " (torchtitan's order: compile, then FSDP)"
    assert CAUSES["fsdp-hook"].fixes[1:] == GENERIC_CAUSES["fsdp-hook"].fixes[1:]
    what, fix = cause_taxonomy().blockers[BlockerKind.DYNAMIC_SHAPE]
    assert what == BLOCKER_EXPLANATIONS[BlockerKind.DYNAMIC_SHAPE][0]
    assert BLOCKER_EXPLANATIONS[BlockerKind.DYNAMIC_SHAPE][1] == (
        "pad to a fixed size or mark the region static"
    )
    assert fix == "pad to a fixed size (torchtitan pads expert groups) or mark the region static"
    issue = KnownIssue(pattern="boom", summary="s", link="https://x", workaround="w")
    combined = combine(
        [CauseKnowledge(precedents=(Precedent("error", 1, "a"), Precedent("error", 1, "b")))]
        + [CauseKnowledge(known_issues=(issue,))]
    )
    assert combined.causes["error"].fixes[1] == GENERIC_CAUSES["error"].fixes[1] + " (a) (b)"
    # Said where it belongs in the sentence: after the part it names.
    ep = "set torch._dynamo.config.capture_scalar_outputs = True (torchtitan's apply_compile does)"
    assert CAUSES["ep-dispatch"].fixes[0].startswith(ep + " so the split sizes")
    assert combined.known_issue("it went boom") is issue and combined.known_issue("x") is None


def test_a_contribution_that_contradicts_the_taxonomy_is_refused():
    with pytest.raises(ValueError, match="defined twice"):
        combine([CauseKnowledge(causes=(GENERIC_CAUSES["error"],))])
    with pytest.raises(ValueError, match="precedent of no fix"):
        combine([CauseKnowledge(precedents=(Precedent("error", 9, "x"),))])
    with pytest.raises(ValueError, match="precedent of no fix"):
        combine([CauseKnowledge(precedents=(Precedent("no-such-cause", 0, "x"),))])
    with pytest.raises(ValueError, match="is not once in the fix"):
        combine([CauseKnowledge(precedents=(Precedent("error", 0, "x", after="no such words"),))])


def test_a_plugin_contradicting_the_taxonomy_is_a_plugin_error(monkeypatch):
    class Redefines:
        name = "redefines"
        cause_knowledge = CauseKnowledge(causes=(GENERIC_CAUSES["error"],))

    frameworks = (*registry.all_frameworks(), Redefines())
    monkeypatch.setattr(registry, "all_frameworks", lambda: frameworks)
    with pytest.raises(PluginError, match="'redefines' adds to the cause taxonomy"):
        cause_taxonomy()


@pytest.mark.parametrize("cause_id", sorted(EXPECTED_IDS))
def test_every_cause_is_documented(cause_id):
    cause = CAUSES[cause_id]
    assert isinstance(cause, Cause) and cause.id == cause_id
    assert re.fullmatch(r"[a-z]+(-[a-z]+)*", cause.id)
    assert cause.title.strip()
    assert cause.explanation.strip() and "\n" not in cause.explanation
    assert cause.fixes and all(f.strip() for f in cause.fixes)
    assert cause.owner in OWNERS
    assert cause.effort in EFFORTS
    assert cause.plan_actions and set(cause.plan_actions) <= set(PLAN_ACTIONS)
    with pytest.raises(AttributeError):
        cause.title = "changed"  # frozen


def test_data_dependent_fixes_are_concrete():
    fixes = " ".join(CAUSES["data-dependent"].fixes)
    for needle in ("capture_scalar_outputs = True", "histc", "torch.cond"):
        assert needle in fixes


def test_explain_cause():
    taxonomy = cause_taxonomy()
    assert taxonomy.explain("fsdp-hook") == CAUSES["fsdp-hook"]
    with pytest.raises(SpecError) as info:
        taxonomy.explain("no-such-cause")
    assert "no-such-cause" in info.value.message
    assert "data-dependent" in info.value.hint and "unsupported" in info.value.hint


# --------------------------------------------------------------------------- registry


def test_registry_loads_from_installed_torch():
    path = causes.registry_path()
    assert path is not None and path.name == "graph_break_registry.json"
    origin = Path(importlib.util.find_spec("torch").origin).parent
    assert path.parent.parent == origin
    reg = causes.registry()
    assert len(reg) > 200
    assert reg["Failed to trace builtin operator"].gb_id == "GB0059"
    assert gb_id_for("Failed to trace builtin operator") == "GB0059"
    assert gb_id_for("Module-level backwards hooks require compiled autograd.") == "GB0083"
    # The one gb_type here that torch renamed within the supported releases (causes/renames.py).
    hop = gb_type_in("HOP: Non-nullified side effect", torch_version())
    assert gb_id_for(hop) == {"HOP: Non-nullified side effect": "GB4413"}.get(hop, "GB0067")
    assert gb_id_for("no such gb_type") is None
    assert gb_id_for("no such gb_type", PRINT) == "GB0059"  # URL fallback


def test_causes_does_not_import_torch():
    import subprocess

    code = (
        "import sys, gbdoctor.records, gbdoctor.errors\n"
        "before = 'torch' in sys.modules\n"
        "from gbdoctor import causes\n"
        "from gbdoctor.records import RawBreak\ncauses.registry(); causes.classify(RawBreak(gb_type='x', message='x'))\n"
        "print(before or 'torch' not in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == "True"


def test_load_registry_variants(tmp_path):
    path = tmp_path / "graph_break_registry.json"
    path.write_text(
        json.dumps(
            {
                "GB0001": [
                    {
                        "Gb_type": "New name",
                        "Context": "",
                        "Explanation": "new",
                        "Hints": ["h1", "h2"],
                    },
                    {"Gb_type": "Old name", "Context": "", "Explanation": "old", "Hints": []},
                    {"Gb_type": "_gb_type", "Context": "", "Explanation": "", "Hints": []},
                ],
                "GB0002": [
                    {"Gb_type": "Old name", "Context": "", "Explanation": "other", "Hints": []}
                ],
            }
        )
    )
    reg = causes.load_registry(path)
    assert reg["New name"].gb_id == "GB0001" and reg["New name"].hints == ("h1", "h2")
    assert reg["Old name"].gb_id == "GB0002"  # a newest variant beats an older one
    assert "_gb_type" not in reg


def test_gb_id_for_without_registry(monkeypatch):
    monkeypatch.setattr(gb_registry, "registry_path", lambda: None)
    causes.registry.cache_clear()
    try:
        assert causes.registry() == {}
        assert gb_id_for("Failed to trace builtin operator") is None
        # Rules still match by registry text without the file.
        assert classify(raw_break(PRINT)) == "python-side-effect"
    finally:
        causes.registry.cache_clear()


def test_renamed_gb_type_matches_by_registry_id():
    old = "HigherOrderOperator: Mutating a variable not in the current scope (SideEffects)"
    assert gb_id_for(old) == "GB0067"
    raw = RawBreak(
        gb_type=old, message=old, in_checkpoint=True, hop="torch.utils.checkpoint.checkpoint"
    )
    assert classify(raw) == "inplace-in-sac"


# --------------------------------------------------------------------------- parse_reason


def test_parse_reason_layout():
    r = parse_reason(PRINT)
    assert r.gb_type == "Failed to trace builtin operator"
    assert r.explanation.startswith("Dynamo does not know how to trace builtin operator `print`")
    assert len(r.hints) == 3 and r.hints[-1] == "Please report an issue to PyTorch."
    assert r.context.startswith("builtin print [")
    assert r.hop is None
    assert tuple(r) == (r.gb_type, r.explanation, r.hints, r.context, r.hop)


def test_parse_reason_empty_fields():
    r = parse_reason(BACKWARD_HOOK)
    assert r.gb_type == "Module-level backwards hooks require compiled autograd."
    assert r.explanation == "" and r.context == ""
    assert r.hints == (
        "Enable compiled autograd by setting torch._dynamo.config.compiled_autograd = True.",
    )


def test_parse_reason_hop_line():
    r = parse_reason(NON_NULLIFIED)
    assert r.gb_type == "HOP: Non-nullified side effect"
    assert r.hop == "torch.utils.checkpoint.checkpoint"
    assert r.explanation.startswith("Attribute 'calls' on an outer-scope object")
    assert r.context == "Attribute 'calls' was not restored to its original value"


def test_parse_reason_generic_jump():
    r = parse_reason(GENERIC_JUMP)
    assert r.gb_type == "Data-dependent branching"
    assert "Could not guard on data-dependent expression" in r.explanation
    assert r.context == "generic_jump SymNodeVariable()"
    # The graph_breaks log prints the same break without the generic_jump line.
    r2 = parse_reason("\n".join(GENERIC_JUMP.splitlines()[1:]))
    assert r2.gb_type == "Data-dependent branching"
    assert r2.context.startswith("Caused by: if h.mean().item() > 0:")


def test_parse_reason_log_records():
    r = parse_reason(FSDP_ROOT_RECORD)
    assert r.gb_type == "Attempted to call function marked as skipped"
    assert r.context.startswith("module: torch._dynamo.decorators, qualname: disable")
    chained = parse_reasons(FSDP_ROOT_RECORD)
    assert [x.gb_type for x in chained] == [
        "Attempted to call function marked as skipped",
        "graph break in loop",
    ]
    assert chained[1].context.startswith("frame skipped: forward")
    inline = parse_reason(INLINE_REASON_RECORD)
    assert inline.gb_type == "Data-dependent branching"
    assert inline.context == "attempted to jump with SymNodeVariable()"
    assert len(inline.hints) == 2


@pytest.mark.parametrize("text", ["", "   \n\n", "\n\nsomething odd\nmore"])
def test_parse_reason_odd_input(text):
    r = parse_reason(text)
    assert r.hints == () and r.hop is None and r.context == ""
    expected = text.strip().splitlines()[0] if text.strip() else ""
    assert r.gb_type == expected


def test_parse_reason_every_registry_entry():
    """Oracle: Dynamo's own formatter (``format_graph_break_message``, what ``unimplemented``
    raises with) over every gb_type of the installed torch's registry; parse_reason must give
    back the gb_type, the explanation and the hints it was formatted from."""
    exc = pytest.importorskip("torch._dynamo.exc")
    entries = gb_registry.registry()
    assert len(entries) > 100, "the installed torch ships its graph-break registry"
    for entry in entries.values():
        hints = [h for h in entry.hints if h.strip()]
        text = exc.format_graph_break_message(
            gb_type=entry.gb_type, context="ctx", explanation=entry.explanation, hints=hints
        )
        r = parse_reason(text)
        expected = (
            DATA_DEPENDENT_BRANCHING if entry.gb_type.startswith("generic_jump") else entry.gb_type
        )
        assert r.gb_type == expected, entry.gb_id
        if entry.explanation.strip() and "\n" not in entry.explanation.strip():
            assert r.explanation == entry.explanation.strip(), entry.gb_id


# --------------------------------------------------------------------------- classify: rules


@pytest.mark.parametrize(
    "message, expected",
    [
        (PRINT, "python-side-effect"),
        (LOGGER_INFO, "python-side-effect"),
        (REORDER, "python-side-effect"),
        (ITEM, "data-dependent"),
        (NONZERO, "data-dependent"),
        (BINCOUNT, "data-dependent"),
        (TOLIST_FLOAT, "data-dependent"),
        (LOCAL_SCALAR, "data-dependent"),
        (GENERIC_JUMP, "data-dependent"),
        (INLINE_REASON_RECORD, "data-dependent"),
        (GRAPH_BREAK, "explicit"),
        (DISABLED, "compiler-disabled"),
        (SKIP_DISABLE, "compiler-disabled"),
        (BACKWARD_HOOK, "backward-hook"),
        (ASYNC_OP, "collective"),
        (WORK_WAIT, "collective"),
        (ZLIB, "unsupported"),
        (SKIP_ADD_, "unsupported"),
        (PYTHON_TYPE.replace("LoggingLoggerVariable", "UserDefinedObjectVariable"), "unsupported"),
        (FAKE_TENSOR, "error"),
    ],
)
def test_classify_by_gb_type(message, expected):
    assert (
        classify(raw_break(message, module="layers.0", frames=frames((MODEL, 10, "forward"))))
        == expected
    )


def test_fsdp_disable_reason_beats_compiler_disabled():
    assert classify(raw_break(DISABLED_FSDP)) == "fsdp-hook"


def test_fsdp_frames_and_component():
    stack = frames((MODEL, 30, "forward"), (TORCH_NN, 1811, "inner"), (FSDP_COMMON, 30, "wrapper"))
    assert classify(raw_break(SKIP_DISABLE, frames=stack)) == "fsdp-hook"
    assert classify(raw_break(FSDP_ROOT_RECORD, frames=stack)) == "fsdp-hook"
    assert classify(raw_break(SKIP_DISABLE, component="fsdp")) == "fsdp-hook"
    assert classify(raw_break(ITEM, component="fsdp")) == "fsdp-hook"
    # An FSDP frame further out (a wrapper's forward around the model) is not an FSDP hook.
    fsdp1 = (
        "/venv/lib/python3.11/site-packages/torch/distributed/fsdp/fully_sharded_data_parallel.py"
    )
    wrapped = frames((fsdp1, 850, "forward"), (MODEL, 20, "forward"))
    assert classify(raw_break(ITEM, frames=wrapped)) == "data-dependent"


def test_ep_dispatch():
    dispatch = frames((MODEL, 50, "forward"), ("/repo/expert_parallel.py", 80, "_token_dispatch"))
    assert (
        classify(raw_break(LOCAL_SCALAR, frames=dispatch, module="layers.1.moe.experts"))
        == "ep-dispatch"
    )
    assert (
        classify(raw_break(ASYNC_OP, frames=frames((MODEL, 9, "token_combine")))) == "ep-dispatch"
    )
    assert classify(raw_break(LOCAL_SCALAR, component="ep")) == "ep-dispatch"
    # Not data-dependent or collective: the dispatch frame alone does not make it EP.
    assert classify(raw_break(GRAPH_BREAK, frames=dispatch)) == "explicit"
    # A training-loop frame further out does not count as dispatch code.
    loop = frames(("/repo/train.py", 3, "dispatch_batches"), (MODEL, 50, "forward"))
    assert classify(raw_break(LOCAL_SCALAR, frames=loop)) == "data-dependent"
    # Same .tolist() without dispatch code: plain data-dependent.
    assert (
        classify(
            raw_break(
                LOCAL_SCALAR, frames=frames((MODEL, 50, "forward")), module="layers.1.moe.experts"
            )
        )
        == "data-dependent"
    )


def test_backward_hook_from_user_hook_component():
    hook_stack = frames((MODEL, 5, "forward"), ("/repo/hooks.py", 12, "grad_norm_backward_hook"))
    unsafe = raw_break(
        "HOP: Unsafe side effect\n  Explanation: Mutating a variable from outside the scope of this HOP is not supported.\n"
        "  Developer debug context: Attempted to mutate ListVariable()\n",
        component="user-hook",
        frames=hook_stack,
    )
    assert classify(unsafe) == "backward-hook"
    # The same side effect in model code, outside any checkpoint: a Python side effect.
    assert (
        classify(raw_break(unsafe.message, frames=frames((MODEL, 5, "forward"))))
        == "python-side-effect"
    )


def test_side_effect_inside_checkpoint_is_inplace_in_sac():
    raw = raw_break(NON_NULLIFIED, frames=frames((MODEL, 181, "planted")))
    assert raw.in_checkpoint
    assert classify(raw) == "inplace-in-sac"
    # HOP known only from the message (capture did not set the flags).
    assert (
        classify(RawBreak(gb_type="HOP: Non-nullified side effect", message=NON_NULLIFIED))
        == "inplace-in-sac"
    )
    # Outside a checkpoint the same gb_type is a plain Python side effect.
    outside = NON_NULLIFIED.replace(
        "  Higher Order Operator: torch.utils.checkpoint.checkpoint\n", ""
    )
    assert classify(raw_break(outside)) == "python-side-effect"
    # Mutation of module state named in the message.
    module_mut = (
        "nn.Module mutation in HigherOrderOp\n  Higher Order Operator: torch.utils.checkpoint.checkpoint\n"
        "  Explanation: Inplace modifying nn.Module params/buffers inside HigherOrderOps is not allowed.\n"
    )
    assert classify(raw_break(module_mut)) == "inplace-in-sac"


def test_non_mutation_break_inside_checkpoint_keeps_its_cause():
    in_ac = PRINT.replace(
        "Failed to trace builtin operator\n",
        "Failed to trace builtin operator\n  Higher Order Operator: torch.utils.checkpoint.checkpoint\n",
    )
    raw = raw_break(in_ac)
    assert raw.in_checkpoint and classify(raw) == "python-side-effect"
    item_in_ac = raw_break(ITEM, in_checkpoint=True, hop="torch.utils.checkpoint.checkpoint")
    assert classify(item_in_ac) == "data-dependent"


def test_moe_load_balancing_vs_plain_data_dependent():
    router = frames((MODEL, 90, "forward"), ("/repo/moe.py", 197, "forward"))
    assert (
        classify(raw_break(BINCOUNT, module="layers.3.moe.router", frames=router))
        == "moe-load-balancing"
    )
    assert (
        classify(
            raw_break(BINCOUNT, module="layers.3.attention", frames=frames((MODEL, 9, "forward")))
        )
        == "data-dependent"
    )
    counting = frames((MODEL, 90, "forward"), ("/repo/moe.py", 40, "_update_tokens_per_expert"))
    assert (
        classify(raw_break(BINCOUNT, module="layers.3.moe", frames=counting))
        == "moe-load-balancing"
    )
    assert classify(raw_break(ITEM, component="load-balancing")) == "moe-load-balancing"
    assert (
        classify(raw_break(BINCOUNT, module="layers.3.block_sparse_moe.gate"))
        == "moe-load-balancing"
    )
    # The follow-on "Tensor.add_ marked as skipped" break of the counter update.
    assert (
        classify(raw_break(SKIP_ADD_, module="layers.3.moe.router", frames=router))
        == "moe-load-balancing"
    )
    # A side effect in a router inside a checkpoint is still a checkpoint mutation.
    assert classify(raw_break(NON_NULLIFIED, module="layers.3.moe.router")) == "inplace-in-sac"


def test_python_side_effect_logging_internals():
    logging_frames = frames(
        (MODEL, 9, "forward"), ("/usr/lib/python3.11/logging/__init__.py", 2146, "info")
    )
    assert classify(raw_break(PYTHON_TYPE, frames=logging_frames)) == "python-side-effect"
    assert (
        classify(raw_break(PYTHON_TYPE)) == "python-side-effect"
    )  # LoggingLoggerVariable in context
    non_print = PRINT.replace("`print`", "`setattr`").replace("builtin print", "builtin setattr")
    assert classify(raw_break(non_print)) == "unsupported"


def test_unknown_and_empty_are_unsupported():
    assert (
        classify(
            RawBreak(
                gb_type="A brand new gb_type", message="A brand new gb_type\n  Explanation: x\n"
            )
        )
        == "unsupported"
    )
    assert classify(RawBreak(gb_type="", message="")) == "unsupported"


def test_classify_parses_message_when_gb_type_missing():
    assert classify(RawBreak(gb_type="", message=GRAPH_BREAK)) == "explicit"
    assert classify(RawBreak(gb_type="", message=DISABLED_FSDP)) == "fsdp-hook"


def test_rule_order_covers_every_cause():
    ids = [cause_id for cause_id, _ in causes.RULE_ORDER] + ["unsupported"]
    assert set(ids) == EXPECTED_IDS and len(ids) == len(EXPECTED_IDS)


# --------------------------------------------------------------------------- integration


def _load_planted():
    spec = importlib.util.spec_from_file_location("gbdoctor_fixture_planted", PLANTED_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)$')
_AT = re.compile(r"in user code at (?P<where>\S+)")


def _frames_of(record: str) -> tuple[Location, ...]:
    if "User code traceback:" not in record:
        return ()
    tail = record.split("User code traceback:", 1)[1]
    return tuple(
        Location(file=m["file"], line=int(m["line"]), function=m["fn"].strip())
        for m in map(_FRAME.match, tail.splitlines())
        if m
    )


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _capture(block, x, backward_error: str | None = None) -> list[str]:
    """The graph_breaks log of a forward + backward; ``backward_error``: the backward must raise
    that (a torch bug of the running release, tests/torch_versions.py)."""
    import torch
    import torch._logging

    torch._dynamo.reset()
    logger = logging.getLogger("torch._dynamo.symbolic_convert.__graph_breaks")
    handler = _ListHandler()
    propagate = logger.propagate
    torch._logging.set_logs(graph_breaks=True)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        out = torch.compile(block, backend="eager")(x)
        if backward_error is None:
            out.sum().backward()
        else:
            with pytest.raises(RuntimeError, match=backward_error):
                out.sum().backward()
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        torch._logging.set_logs()
        torch._dynamo.reset()
    return handler.messages


@pytest.fixture(scope="module")
def planted():
    pytest.importorskip("torch")
    return _load_planted()


def test_planted_fixture_metadata(planted):
    flavors = planted.build_flavors()
    assert set(flavors) == set(planted.EXPECTED_CAUSE) == set(planted.EXPECTED_GB_TYPE)
    assert planted.EXPECTED_CAUSE["clean"] is None
    assert {c for c in planted.EXPECTED_CAUSE.values() if c} <= EXPECTED_IDS
    model = planted.build("print")
    assert sorted(model.layers) == ["0", "1"]
    assert model.tok_embeddings.num_embeddings == 256 and model.tok_embeddings.embedding_dim == 64


@pytest.mark.parametrize(
    "flavor",
    [
        "clean",
        "backward_hook",
        "print",
        "logging",
        "item_branch",
        "nonzero",
        "graph_break",
        "compiler_disable",
        "c_extension",
        "inplace_in_sac",
        "moe_bincount",
        "ep_tolist",
    ],
)
def test_planted_flavor_breaks_as_expected(planted, flavor, capsys):
    import torch

    torch.manual_seed(0)
    block = planted.build_block(flavor)
    x = torch.randn(2, 16, planted.DIM, requires_grad=True)
    bug = torch_bug(f"planted {flavor} backward")
    records = _capture(block, x, backward_error=bug.error if bug else None)
    capsys.readouterr()  # the print flavor prints when its frame runs eagerly

    expected_cause = planted.EXPECTED_CAUSE[flavor]
    if expected_cause is None:
        assert records == []
        return
    assert records, f"{flavor}: no graph break logged"

    # Group duplicates ("user stack suppressed") with the record that carries the stack,
    # as capture.py counts them: key = (gb_type, file:line).
    breaks: dict[tuple[str, str], tuple[str, tuple[Location, ...]]] = {}
    for record in records:
        reason = parse_reason(record)
        where = _AT.search(record)
        key = (reason.gb_type, where["where"] if where else "")
        stack = _frames_of(record)
        if key not in breaks or (stack and not breaks[key][1]):
            breaks[key] = (record, stack)

    assert {gb for gb, _ in breaks} == expected_gb_types(planted.EXPECTED_GB_TYPE[flavor])
    module = ".".join(p for p in ("layers.0", planted.PLANTED_MODULE[flavor]) if p)
    for (gb_type, _), (record, stack) in breaks.items():
        reason = parse_reason(record)
        raw = RawBreak(
            gb_type=reason.gb_type,
            message=record,
            frames=stack,
            module=module,
            component="model",
            in_checkpoint=bool(reason.hop and "checkpoint" in reason.hop),
            hop=reason.hop,
            explanation=reason.explanation,
            hints=reason.hints,
            context=reason.context,
        )
        assert gb_id_for(gb_type) is not None
        assert classify(raw) == expected_cause, (flavor, gb_type)


def test_tiny_custom_model_is_clean_with_hf_style_blocks():
    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location(
        "gbdoctor_fixture_tiny", FIXTURES / "models" / "tiny_custom.py"
    )
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    model = tiny.build("tiny")
    tokens = torch.randint(0, 256, (2, 16))
    expected = model(tokens)
    seen = []
    handle = model.layers[0].register_forward_pre_hook(
        lambda m, a, k: seen.append(sorted(k)), with_kwargs=True
    )
    for i, layer in enumerate(model.layers):
        model.layers[i] = torch.compile(layer, backend="eager", fullgraph=True)
    torch._dynamo.reset()
    try:
        out = model(tokens)
        out.sum().backward()
    finally:
        handle.remove()
        torch._dynamo.reset()
    assert seen == [["attention_mask", "position_embeddings"]]
    assert torch.allclose(out, expected, atol=1e-5)
    with pytest.raises(TypeError):
        tiny.DecoderLayer(64, 4)(torch.randn(1, 4, 64))


# --------------------------------------------------------------------------- issue 34: torch 2.11


# torch 2.11's GB0156 for ``self.ep_mesh.get_group()`` in EP's dispatch hook, as recorded by a
# real scan on 2.11.0 (fixtures/scans/llama4_ep2_torch2.11.json): the mesh looks its process group
# up by name (``mesh._pg_registry.get(name)`` in ``device_mesh.py``).
def _recorded_mesh_lookup() -> str:
    report = json.loads((FIXTURES / "scans" / "llama4_ep2_torch2.11.json").read_text())
    brk = next(b for blk in report["blocks"] for b in blk["breaks"] if b["gb_id"] == "GB0156")
    return (
        f"{brk['gb_type']}\n  Explanation: {brk['explanation']}\n\n"
        f"  Developer debug context: {brk['context']}\n\n" + URL.format("0156")
    )


MESH_LOOKUP = _recorded_mesh_lookup()


@pytest.mark.parametrize("component", ["model", "torch", "ep"])
def test_a_mesh_lookup_in_ep_setup_is_ep_dispatch_at_the_user_line(component: str) -> None:
    """Attributed to the setup code it came from (gbdoctor/setup/ep.py), not to the word
    "DeviceMesh": the spec has no TP and no TP code is on the stack."""
    from gbdoctor.capture import innermost_user_location
    from gbdoctor.causes.gb_registry import _torch_dir

    torch_dir = _torch_dir()
    assert torch_dir is not None
    mesh = f"{torch_dir.rstrip('/')}/distributed/device_mesh.py"
    # The stack capture records on 2.11: Dynamo compiles get_group as a frame of its own (its
    # caller ran eagerly), so its user stack is torch's; capture adds the calling line.
    stack = frames(
        (str(REPO / "gbdoctor/setup/ep.py"), 35, "token_dispatch"),
        (mesh, 763, "get_group"),
        (mesh, 83, "_get_pg_from_name"),
    )
    raw = raw_break(MESH_LOOKUP, frames=stack, module="layers.1.moe.experts", component=component)
    assert classify(raw) == "ep-dispatch"
    where = innermost_user_location(stack, root=str(REPO))
    assert where is not None and (where.file, where.line) == ("gbdoctor/setup/ep.py", 35)


def test_tensor_parallel_needs_tp_on_the_stack() -> None:
    """DTensor's words still mark TP in model code; a TP style's file marks it in any code."""
    from gbdoctor.causes.gb_registry import _torch_dir

    torch_dir = (_torch_dir() or "").rstrip("/")
    dtensor = MESH_LOOKUP.replace("DeviceMeshVariable()", "DTensor.redistribute")
    assert dtensor != MESH_LOOKUP
    in_model = frames((MODEL, 10, "forward"))
    assert classify(raw_break(MESH_LOOKUP, frames=in_model)) != "tensor-parallel"
    assert classify(raw_break(dtensor, frames=in_model)) == "tensor-parallel"
    tp_hook = frames(
        (MODEL, 10, "forward"),
        (f"{torch_dir}/distributed/tensor/parallel/style.py", 5, "_prepare_input_fn"),
    )
    assert classify(raw_break(MESH_LOOKUP, frames=tp_hook)) == "tensor-parallel"
