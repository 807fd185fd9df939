"""apply_setup installs what it claims: AC wrappers, compiled regions, FSDP2, EP hooks, flags."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from repo_paths import REPO
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import FSDPModule

from gbdoctor.frameworks import framework_for
from gbdoctor.models import build_model
from gbdoctor.scan.inspect import inspect_spec
from gbdoctor.setup.apply import apply_setup, recipe_context
from gbdoctor.setup.dist import single_process_group
from gbdoctor.setup.mesh import build_meshes
from gbdoctor.spec import load_spec


def _setup(spec_name: str, overrides: list[str], strategy: str):
    spec = load_spec(REPO / "fixtures" / spec_name, overrides)
    meshes = build_meshes(spec.parallelism, "cpu")
    model = build_model(spec.model)
    # The spec's framework's presets (titan-v0.2.2 is the torchtitan mirror's, not generic).
    chosen = framework_for(spec).strategies[strategy]
    return apply_setup(model, spec, meshes, strategy=chosen, backend="eager")


@pytest.fixture(autouse=True)
def _group():
    with single_process_group("cpu"):
        yield


@pytest.mark.parametrize(
    "mode, option, wrapped",
    [
        ("full", "2", [0, 1, 2, 3, 4, 5]),
        ("selective", "2", [1, 3, 5]),  # torchtitan's counter starts at 1
        ("selective", "3", [2, 5]),
        ("selective", "op", [0, 1, 2, 3, 4, 5]),
        ("none", "2", []),
    ],
)
def test_ac_wraps_the_blocks_torchtitan_wraps(mode, option, wrapped):
    setup = _setup(
        "llama3_debug.toml",
        [
            f"activation_checkpoint.mode={mode}",
            f"activation_checkpoint.selective_ac_option={option}",
        ],
        "none",
    )
    found = [i for i, slot in enumerate(setup.blocks) if isinstance(slot.outer, CheckpointWrapper)]
    assert found == wrapped
    for i in wrapped:
        fn = setup.blocks[i].outer.checkpoint_fn
        has_policy = "context_fn" in getattr(fn, "keywords", {})
        assert has_policy == (option == "op")


def test_titan_v022_compiles_moe_children_and_leaves_experts_eager():
    setup = _setup("llama4_debug.toml", ["activation_checkpoint.mode=none"], "titan-v0.2.2")
    for slot in setup.blocks:
        assert isinstance(slot.outer, FSDPModule)
        if slot.is_moe:
            assert type(slot.block.attention).__name__ == "OptimizedModule"
            assert type(slot.block.moe.router).__name__ == "OptimizedModule"
            assert type(slot.block.moe.experts).__name__ == "GroupedExperts"
            assert f"{slot.fqn}.moe.experts" not in slot.regions
        else:
            assert type(slot.outer).__name__.endswith("OptimizedModule") and slot.regions == (
                slot.fqn,
            )
    assert isinstance(setup.model, FSDPModule) and isinstance(
        setup.model.tok_embeddings, FSDPModule
    )
    assert dict(setup.dynamo_flags) == {"capture_scalar_outputs": True}


def test_recipe_context_restores_dynamo_settings():
    before = torch._dynamo.config.capture_scalar_outputs
    with recipe_context((("capture_scalar_outputs", not before),), ac_enabled=True):
        assert torch._dynamo.config.capture_scalar_outputs is (not before)
    assert torch._dynamo.config.capture_scalar_outputs is before


def test_load_balancing_hook_is_on_the_optimizer():
    setup = _setup("llama4_debug.toml", [], "none")
    assert [(h.module, h.kind, h.installer) for h in setup.hooks] == [
        ("optimizer", "optimizer_pre_step", "load-balancing")
    ]
    assert setup.optimizer._optimizer_step_pre_hooks


@pytest.mark.slow
def test_ep2_installs_dispatch_combine_hooks_and_shards_experts():
    # inspect runs the real setup on two gloo ranks and reports rank 0's view.
    report = inspect_spec(load_spec(REPO / "fixtures" / "llama4_debug_ep2.toml"))
    moe = next(b for b in report.blocks if b.moe)
    ep_hooks = {(h.module, h.kind) for h in moe.hooks if h.installer == "ep"}
    assert ep_hooks == {
        (f"{moe.fqn}.moe.experts", "forward_pre"),
        (f"{moe.fqn}.moe.experts", "forward"),
    }
    assert f"{moe.fqn}.moe.experts" in moe.sharded and moe.fqn in moe.sharded
    dense = next(b for b in report.blocks if not b.moe)
    # Half the experts live on each rank: the MoE block holds fewer local params than 8 experts.
    assert moe.params < 3 * 8 * 256 * 512 + 10 * 256 * 256
    assert not any(h.installer == "ep" for h in dense.hooks)


def test_compiled_forward_runs_between_the_modules_hooks():
    """A plan's ``compiled_forward`` compiles the expert store's own forward: the hooks EP and
    FSDP install run eagerly before it, and the grouped matmuls land in a graph of their own."""
    from torch._dynamo.testing import CompileCounter

    from gbdoctor.setup.compile import BlockRecipe, Strategy

    spec = load_spec(REPO / "fixtures" / "llama4_debug.toml", ["activation_checkpoint.mode=none"])
    moe = BlockRecipe(mode="children", eager=("moe.experts",), compiled_forward=("moe.experts",))
    strategy = Strategy(name="test", dense=BlockRecipe(mode="none"), moe=moe)
    counter = CompileCounter()
    experts_counter = CompileCounter()

    def compile_fn(target, fqn, fullgraph):
        backend = experts_counter if fqn.endswith(".experts.forward") else counter
        return torch.compile(target, backend=backend, fullgraph=fullgraph)

    torch._dynamo.reset()
    setup = apply_setup(
        build_model(spec.model),
        spec,
        build_meshes(spec.parallelism, "cpu"),
        strategy=strategy,
        compile_fn=compile_fn,
    )
    slot = next(s for s in setup.blocks if s.is_moe)
    assert f"{slot.fqn}.moe.experts.forward" in slot.fullgraph_regions
    experts = slot.block.moe.experts
    assert "forward" in vars(experts)  # the instance's forward, not the module, is compiled
    hook_compiling = []
    experts.register_forward_pre_hook(
        lambda *_: hook_compiling.append(torch.compiler.is_compiling())
    )
    with recipe_context(setup.dynamo_flags, ac_enabled=False):
        setup.model(torch.randint(0, 256, (2, 16))).sum().backward()
    assert hook_compiling and not any(hook_compiling)
    assert experts_counter.frame_count >= 1 and experts_counter.op_count > 0
    torch._dynamo.reset()
