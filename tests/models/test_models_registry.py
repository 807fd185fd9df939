"""Registry API: families, flavors, expert counts, vocab and block helpers, spec errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gbdoctor.errors import SpecError
from gbdoctor.models import (
    FAMILIES,
    block_container,
    build_model,
    family_flavors,
    flavor_args,
    model_facts,
    num_experts,
    vocab_size,
)
from gbdoctor.records import ModelFacts, ModelSpec


def test_families_exact():
    assert FAMILIES == ("custom", "deepseek_v3", "llama3", "llama4")


@pytest.mark.parametrize(
    "family, expected",
    [
        ("llama3", {"debugmodel", "debugmodel_flex_attn", "8B", "70B"}),
        ("llama4", {"debugmodel", "debugmodel_irope", "17bx16e", "17bx128e"}),
        ("deepseek_v3", {"debugmodel", "debugmodel_flex_attn", "16B", "671B"}),
    ],
)
def test_family_flavors_sorted_and_complete(family, expected):
    flavors = family_flavors(family)
    assert flavors == tuple(sorted(flavors))
    assert expected <= set(flavors)


def test_custom_has_no_flavors():
    assert family_flavors("custom") == ()
    assert num_experts("custom", "anything") is None


def test_unknown_family_is_spec_error():
    with pytest.raises(SpecError) as exc:
        family_flavors("gpt5")
    assert "gpt5" in exc.value.message and "llama3" in exc.value.hint
    with pytest.raises(SpecError):
        build_model(ModelSpec(name="gpt5", flavor="debugmodel"), device="meta")


def test_unknown_flavor_is_spec_error():
    with pytest.raises(SpecError) as exc:
        build_model(ModelSpec(name="llama3", flavor="9B"), device="meta")
    assert "'9B'" in exc.value.message and "llama3" in exc.value.message
    assert "8B" in exc.value.hint and "\n" not in exc.value.message
    with pytest.raises(SpecError):
        num_experts("llama4", "nope")


def test_custom_without_factory_is_spec_error():
    with pytest.raises(SpecError) as exc:
        build_model(ModelSpec(name="custom", flavor="x"), device="meta")
    assert "factory" in exc.value.message and exc.value.hint


@pytest.mark.parametrize(
    "family, flavor, experts",
    [
        ("llama3", "debugmodel", None),
        ("llama3", "8B", None),
        ("llama4", "debugmodel", 8),
        ("llama4", "17bx16e", 16),
        ("llama4", "17bx128e", 128),
        ("deepseek_v3", "debugmodel", 8),
        ("deepseek_v3", "16B", 64),
        ("deepseek_v3", "671B", 256),
    ],
)
def test_num_experts(family, flavor, experts):
    assert num_experts(family, flavor) == experts


@pytest.mark.parametrize(
    "family, flavor",
    [
        ("llama3", "debugmodel"),
        ("llama3", "debugmodel_flex_attn"),
        ("llama4", "debugmodel"),
        ("llama4", "debugmodel_irope"),
        ("deepseek_v3", "debugmodel"),
    ],
)
def test_model_facts_match_the_built_model(family, flavor):
    """The oracle is the model built on meta: its blocks, its attention modules' heads and
    kernel, its routers' top-k and expert count."""
    spec = ModelSpec(name=family, flavor=flavor)
    facts = model_facts(spec)
    model = build_model(spec, device="meta")
    assert facts.n_layers == len(block_container(model))
    attention = [m for m in model.modules() if hasattr(m, "attn_type") and hasattr(m, "n_heads")]
    assert attention and {(m.n_heads, m.attn_type) for m in attention} == {
        (facts.n_heads, facts.attn_type)
    }
    routers = [m for m in model.modules() if hasattr(m, "top_k")]
    if facts.top_k is None:
        assert not routers and facts.num_experts is None
    else:
        assert {(m.top_k, m.num_experts) for m in routers} == {(facts.top_k, facts.num_experts)}


def test_model_facts_unknown_without_a_flavor_of_the_zoo():
    # A custom factory, and a framework's own config name (the installed torchtitan's), say
    # nothing before they are built: every fact unknown, not an error.
    assert model_facts(ModelSpec(name="custom", flavor="x", factory="m.py:build")) == ModelFacts()
    assert model_facts(ModelSpec(name="llama3", flavor="llama3_debug")) == ModelFacts()


def test_flavor_args_are_frozen():
    args = flavor_args("llama3", "debugmodel")
    with pytest.raises(AttributeError):  # FrozenInstanceError subclasses AttributeError
        args.dim = 1


def test_vocab_and_blocks_builtin():
    model = build_model(ModelSpec(name="llama4", flavor="debugmodel"), device="meta")
    assert vocab_size(model) == 2048
    blocks = block_container(model)
    assert [fqn for fqn, _ in blocks] == [f"layers.{i}" for i in range(6)]
    assert all(block is model.get_submodule(fqn) for fqn, block in blocks)


def test_vocab_and_blocks_module_list():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
            self.emb = nn.Embedding(37, 4)

    tiny = Tiny()
    assert vocab_size(tiny) == 37
    assert [fqn for fqn, _ in block_container(tiny)] == ["layers.0", "layers.1"]
    with pytest.raises(SpecError):
        block_container(nn.Linear(2, 2))
    with pytest.raises(SpecError):
        vocab_size(nn.Linear(2, 2))


def test_max_seq_len_override():
    model = build_model(
        ModelSpec(name="llama3", flavor="debugmodel"), device="meta", max_seq_len=64
    )
    assert model.rope_cache.shape[0] == 64
    assert tuple(model.rope_cache.shape[1:]) == (
        8,
        2,
    )  # head_dim 16 -> 8 rotation pairs of (cos, sin)
    torch.manual_seed(0)
    short = build_model(ModelSpec(name="llama3", flavor="debugmodel"), max_seq_len=16)
    torch.manual_seed(0)
    long = build_model(ModelSpec(name="llama3", flavor="debugmodel"), max_seq_len=64)
    tokens = torch.randint(0, 2048, (1, 32))
    torch.testing.assert_close(short(tokens), long(tokens))  # past the table: extended, same result
    assert short.rope_cache.shape[0] == 16
