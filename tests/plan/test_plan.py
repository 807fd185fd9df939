"""plan: propose, verify by re-scan (strict), emit valid code that compiles as planned."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from repo_paths import FIXTURES

from gbdoctor.models import build_model
from gbdoctor.plan import dump_plan, load_plan, plan_strategy, propose_plan
from gbdoctor.plan.emit import EMITTERS, emit
from gbdoctor.scan import scan
from gbdoctor.spec import load_spec


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)


@pytest.fixture(scope="module")
def print_plan(tmp_path_factory, print_plan_calls):
    path = tmp_path_factory.mktemp("plan") / "print.toml"
    path.write_text(
        f'[model]\nname = "custom"\nflavor = "print"\nfactory = "{FIXTURES / "models" / "planted.py"}:build"\n'
        '[training]\nlocal_batch_size = 2\nseq_len = 16\n[activation_checkpoint]\nmode = "full"\n'
    )
    spec = load_spec(path)
    with _counting() as (captures, decisions):
        plan = propose_plan(spec)
    print_plan_calls.extend([len(captures), len(decisions)])
    return spec, plan


@pytest.fixture(scope="module")
def print_plan_calls():
    """How many captures (``scan``) and decisions (``decide``) ``print_plan``'s plan, made from
    scratch, took: [captures, decisions]. Counted as it was made, so the test that compares a
    plan made from the command's own scan with it needs no second plan from scratch."""
    return []


@contextlib.contextmanager
def _counting():
    """Count the planner's captures (the strategy of each ``scan``) and decisions (the spec key
    of each ``scan.environment.decide``) inside."""
    from gbdoctor import scan as scan_package
    from gbdoctor.scan import environment

    captures, decisions = [], []
    real_scan, real_decide = scan_package.scan, environment.decide

    def counting_scan(spec, **options):
        captures.append(options.get("strategy"))
        return real_scan(spec, **options)

    def counting_decide(spec, **options):
        decisions.append(spec.key)
        return real_decide(spec, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scan_package, "scan", counting_scan)
        patch.setattr(environment, "decide", counting_decide)
        yield captures, decisions


def test_plan_isolates_a_break_in_block_glue_and_proves_the_rest(print_plan):
    spec, plan = print_plan
    (kind,) = plan.kinds
    assert kind.kind == "dense+ac" and kind.verified and plan.verified
    assert kind.mode == "children" and kind.split_ac
    assert kind.breaks_before == 1 and kind.breaks_after == 0
    assert any(r.startswith("python-side-effect") for r in kind.reasons)
    # scan --plan reproduces the verified result
    report = scan(spec, strategy=plan_strategy(plan, spec))
    assert all(not b.breaks and not b.events and b.error is None for b in report.blocks)


def test_plan_file_round_trips(print_plan, tmp_path):
    _, plan = print_plan
    path = tmp_path / "plan.json"
    path.write_text(dump_plan(plan))
    assert load_plan(path) == plan
    assert emit(plan, "json") == path.read_text()


# The emitters that write Python: json writes the plan file, accelerate a YAML config overlay
# (its own tests load that with accelerate's reader).
PYTHON_EMITTERS = [f for f in EMITTERS if f not in ("json", "accelerate")]


@pytest.mark.parametrize("fmt", PYTHON_EMITTERS)
def test_emitted_python_is_valid(print_plan, fmt):
    _, plan = print_plan
    compile(emit(plan, fmt), f"<{fmt}>", "exec")


def test_emitted_python_compiles_the_model_as_planned(print_plan):
    _, plan = print_plan
    namespace: dict = {}
    exec(compile(emit(plan, "python"), "<plan>", "exec"), namespace)
    spec, _ = print_plan
    model = build_model(spec.model)
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    namespace["apply_gbdoctor_plan"](model, backend=counting_backend)
    compiled = [n for n, m in model.named_modules() if type(m).__name__ == "OptimizedModule"]
    assert compiled and all(n.startswith("layers.") for n in compiled)
    tokens = torch.randint(0, 256, (2, 16))
    with torch._dynamo.error_on_graph_break(True):  # every planned region is fullgraph-clean
        model(tokens).sum().backward()
    assert graphs
    torch._dynamo.reset()


def test_load_plan_rejects_garbage(tmp_path):
    from gbdoctor.errors import BaselineError

    bad = tmp_path / "plan.json"
    bad.write_text("{not json")
    with pytest.raises(BaselineError):
        load_plan(bad)
    bad.write_text('{"schema_version": 99}')
    with pytest.raises(BaselineError):
        load_plan(bad)
    with pytest.raises(BaselineError):
        load_plan(tmp_path / "missing.json")


@pytest.mark.slow
def test_llama4_ep2_plan_beats_titan_v020_coverage():
    spec = load_spec("fixtures/llama4_debug_ep2.toml", ["activation_checkpoint.mode=none"])
    plan = propose_plan(spec)
    assert plan.verified
    kinds = {k.kind: k for k in plan.kinds}
    assert kinds["dense"].mode == "block" and kinds["dense"].breaks_after == 0
    moe = kinds["moe"]
    assert moe.mode == "children" and moe.eager == ("moe.experts",)
    # The experts' FSDP/EP hooks stay eager; their own forward is compiled between them.
    assert moe.compiled_forward == ("moe.experts",)
    assert moe.breaks_before > 0 and moe.breaks_after == 0
    # v0.2.0 compiled MoE blocks with fullgraph=False: no op was in a fullgraph region.
    assert moe.fullgraph_share_before == 0.0 and moe.fullgraph_share_after > 0.5


@pytest.mark.slow
def test_sac_scenario_splits_the_wrapping_and_keeps_attention_compiled():
    spec = load_spec("fixtures/llama4_debug_ep2.toml")  # op-SAC around whole blocks
    plan = propose_plan(spec)
    moe = next(k for k in plan.kinds if k.kind == "moe+sac")
    assert moe.split_ac and moe.verified and moe.events_before >= 1 and moe.events_after == 0
    report = scan(spec, strategy=plan_strategy(plan, spec))
    block = next(b for b in report.blocks if b.kind == "moe+sac" and b.same_as is None)
    assert f"{block.fqn}.attention" in block.fullgraph_regions
    assert (
        dict(block.region_ops)[f"{block.fqn}.attention"] > 0
        and not block.breaks
        and not block.events
    )
    # The experts' grouped matmuls are captured too: their forward is a fullgraph region of its
    # own, with FSDP's all-gather and EP's dispatch running eagerly around it.
    experts = f"{block.fqn}.moe.experts.forward"
    assert experts in block.fullgraph_regions and dict(block.region_ops)[experts] > 0


def _planted_flavors():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "planted_for_plan", FIXTURES / "models" / "planted.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sorted(f for f, cause in module.EXPECTED_CAUSE.items() if cause)


@pytest.mark.parametrize("flavor", _planted_flavors())
def test_every_planted_break_is_removed_or_isolated_and_proven(flavor, tmp_path):
    path = tmp_path / f"{flavor}.toml"
    path.write_text(
        f'[model]\nname = "custom"\nflavor = "{flavor}"\nfactory = "{FIXTURES / "models" / "planted.py"}:build"\n'
        '[training]\nlocal_batch_size = 2\nseq_len = 16\n[activation_checkpoint]\nmode = "none"\n'
    )
    plan = propose_plan(load_spec(path))
    (kind,) = plan.kinds
    assert kind.breaks_before >= 1 and kind.breaks_after == 0 and kind.verified, kind
    # either a flag removed it (block stays whole) or the breaking code stays eager
    assert plan.flags or kind.mode == "children"


@pytest.mark.parametrize(
    "cause, flags",
    [
        # data-dependent lists both shape flags among its plan actions: both are set
        ("data-dependent", {"capture_scalar_outputs", "capture_dynamic_output_shape_ops"}),
        # ep-dispatch lists only capture_scalar_outputs: the other flag is not the planner's to set
        ("ep-dispatch", {"capture_scalar_outputs"}),
        # explicit (torch._dynamo.graph_break()) allows no flag: the same gb_type is isolated
        ("explicit", set()),
    ],
)
def test_the_planner_applies_only_the_flags_the_cause_allows(cause, flags):
    from scan_factory import make_block, make_break

    from gbdoctor.frameworks.torchtitan_v02.plan import _absorb, _Candidate

    brk = make_break(
        cause, gb_type="Dynamic shape operator", module="layers.1.moe.router", component="model"
    )
    cand = _Candidate(kind="moe", layers=("layers.1",), ac_wrapped=False, is_moe=True)
    chosen: set[str] = set()
    _absorb(cand, make_block("layers.1", "moe", breaks=(brk,)), chosen)
    assert chosen == flags
    assert ("isolate-child" in cand.actions) == (not flags)


def test_a_hook_break_compiles_the_module_forward_until_the_forward_itself_breaks():
    """FSDP's hook on the expert store is the break, not the experts' computation: the planner
    isolates the module but compiles its own forward between the hooks. When the verification
    re-scan finds a break inside that forward region, the planner leaves the module eager."""
    from scan_factory import make_block, make_break

    from gbdoctor.frameworks.torchtitan_v02.plan import _absorb, _Candidate

    cand = _Candidate(kind="moe", layers=("layers.1",), ac_wrapped=False, is_moe=True)
    hook = make_break("fsdp-hook", module="layers.1.moe", region="layers.1")
    _absorb(cand, make_block("layers.1", "moe", breaks=(hook,)), set())
    recipe = cand.recipe()
    assert recipe.mode == "children" and recipe.eager == ("moe.experts",)
    assert recipe.compiled_forward == ("moe.experts",)
    assert "compile-between-hooks" in cand.actions

    inside = make_break(
        "unsupported",
        gb_type="Unsupported context manager",
        module="layers.1.moe.experts",
        component="model",
        region="layers.1.moe.experts.forward",
    )
    _absorb(cand, make_block("layers.1", "moe", breaks=(inside,)), set())
    recipe = cand.recipe()
    assert recipe.eager == ("moe.experts",) and recipe.compiled_forward == ()
    # A second hook break on the same module does not compile the forward again.
    _absorb(cand, make_block("layers.1", "moe", breaks=(hook,)), set())
    assert cand.recipe().compiled_forward == ()


def test_emitted_python_compiles_an_expert_store_forward_between_its_hooks():
    """The emitted ``apply_gbdoctor_plan`` does what ``compiled_forward`` does in gbdoctor's own
    setup: the expert store's hooks stay eager and its forward is a fullgraph region."""
    from gbdoctor.records import KindPlan, Plan

    spec = load_spec(FIXTURES / "llama4_debug.toml", ["activation_checkpoint.mode=none"])
    model = build_model(spec.model)
    moe_layers = tuple(
        f"layers.{key}" for key, block in model.layers.named_children() if hasattr(block, "moe")
    )
    assert moe_layers
    kind = KindPlan(
        kind="moe",
        layers=moe_layers,
        mode="children",
        fullgraph=True,
        eager=("moe.experts",),
        compiled_forward=("moe.experts",),
        verified=True,
    )
    plan = Plan(
        spec="llama4_debug.toml",
        model="llama4/debugmodel",
        torch_version=torch.__version__,
        baseline_strategy="titan-v0.2.0",
        flags=(),
        flag_costs=(),
        kinds=(kind,),
        verified=True,
        rounds=1,
    )
    namespace: dict = {}
    exec(compile(emit(plan, "python"), "<plan>", "exec"), namespace)
    torch._dynamo.reset()
    namespace["apply_gbdoctor_plan"](model, backend="eager")
    experts = model.get_submodule(moe_layers[0]).moe.experts
    assert "forward" in vars(experts) and type(experts).__name__ == "GroupedExperts"
    hook_compiling = []
    experts.register_forward_pre_hook(
        lambda *_: hook_compiling.append(torch.compiler.is_compiling())
    )
    with torch._dynamo.error_on_graph_break(True):
        model(torch.randint(0, 256, (2, 16))).sum().backward()
    assert hook_compiling and not any(hook_compiling)
    torch._dynamo.reset()


def test_a_plan_takes_the_commands_own_scan_and_decision(print_plan, print_plan_calls):
    """``price`` scans, then plans: the planner keeps the command's decision (no second
    ``decide``: no meta model built again, no memory estimate) and takes its scan where it asks
    for that same capture (the baseline strategy, no recompile probe). Oracle: the plan made
    from scratch (``print_plan``'s, its captures and decisions counted as it was made), same in
    every field, with one capture more and one decision more."""
    from gbdoctor import scan as scan_package
    from gbdoctor.frameworks.torchtitan_v02.plan import BASELINE_STRATEGY
    from gbdoctor.plan import PriorScan
    from gbdoctor.scan import scan_decision

    spec, fresh = print_plan
    fresh_captures, fresh_decisions = print_plan_calls
    assert fresh_decisions == 1 and fresh_captures >= 3  # baseline, a round, strict

    real_scan = scan_package.scan
    with _counting() as (captures, decisions):
        decision = scan_decision(spec)
        report = real_scan(spec, strategy=BASELINE_STRATEGY, recompiles=False, decision=decision)
        prior = PriorScan(report=report, spec=spec, strategy=BASELINE_STRATEGY, recompiles=False)
        reused = propose_plan(spec, decision=decision, prior=prior)
        assert reused == fresh
        assert len(decisions) == 1  # the command's own, above
        assert len(captures) == fresh_captures - 1
        # A scan made otherwise (the recompile probe on) is not the planner's capture: scanned
        # again.
        captures.clear()
        other = PriorScan(report=report, spec=spec, strategy=BASELINE_STRATEGY, recompiles=True)
        assert propose_plan(spec, decision=decision, prior=other) == fresh
        assert len(captures) == fresh_captures


def _scripted_scans(fail: Callable[[bool, int], bool]):
    """A ``scan_fn`` over real simulated scans of llama3's debug config, where every block of
    scan number N (from 0) fails to trace when ``fail(strict, N)``; and the steps it took."""
    from gbdoctor.scan import simulate_scan

    calls: list[str] = []

    def scan_fn(spec, *, strategy, strict=False, recompiles=False):
        report = simulate_scan(spec, strategy=strategy, strict=strict)
        calls.append("strict" if strict else "scan")
        if not fail(strict, len(calls) - 1):
            return report
        planted = tuple(replace(b, error="AssertionError: planted") for b in report.blocks)
        return replace(report, blocks=planted)

    return scan_fn, calls


@pytest.mark.slow  # 2-4 simulated scans: ~8 s
def test_a_clean_baseline_whose_strict_scan_fails_runs_the_rounds():
    """The one-round shortcut (a clean baseline: the strict scan alone) falls back to the
    rounds when that strict scan fails, and the plan is verified by a second strict scan."""
    from gbdoctor.frameworks.torchtitan_v02.plan import propose_block_plan

    scan_fn, calls = _scripted_scans(lambda strict, n: n == 1)
    steps: list[str] = []
    plan = propose_block_plan(
        load_spec("fixtures/llama3_debug.toml"),
        scan_fn=scan_fn,
        progress=lambda what, *_: steps.append(what),
    )
    assert calls == ["scan", "strict", "scan", "strict"]
    assert steps == [
        "baseline scan (whole blocks, no flags)",
        "strict verification",
        "verification round 1",
        "strict verification",
        "done",
    ]
    assert plan.verified, [k.detail for k in plan.kinds]


@pytest.mark.slow  # 2-4 simulated scans: ~8 s
def test_no_strict_scan_when_no_kind_could_pass_it():
    """Every kind still failing under the strategy a strict scan would apply: strict only adds
    failures, so the planner stops at the round that shows it, unverified, and says why."""
    from gbdoctor.frameworks.torchtitan_v02.plan import propose_block_plan

    scan_fn, calls = _scripted_scans(lambda strict, n: True)
    plan = propose_block_plan(load_spec("fixtures/llama3_debug.toml"), scan_fn=scan_fn)
    assert "strict" not in calls and len(calls) >= 2
    assert not plan.verified
    assert plan.kinds and all("no strict check could pass" in k.detail for k in plan.kinds)
