"""Context parallelism scanned for real (issue #43): fixtures/llama3_debug_cp2.toml on 2 gloo
ranks under torchtitan v0.2.2's CP context against the same config with CP = 1 (per kind the
same breaks, plus what only CP changes), and against an oracle: plain per-block
``torch.compile`` with the graph-break log, of the bare model under torch's own
``context_parallel`` on 2 gloo ranks (``setup/context_parallel.py``; docs/pipeline.md)."""

from __future__ import annotations

import pytest
from repo_paths import FIXTURES

CP2 = FIXTURES / "llama3_debug_cp2.toml"


def _per_kind(report) -> dict[str, tuple[int, int, frozenset[str], tuple[str, ...]]]:
    """Kind -> (breaks per block, graphs, causes, recompile reasons) of its representative."""
    from gbdoctor.summary import block_break_count

    return {
        b.kind: (
            block_break_count(b),
            b.graph_count,
            frozenset(x.cause for x in b.breaks),
            tuple(r.reason for r in b.recompiles),
        )
        for b in report.blocks
        if b.same_as is None
    }


def _cp_oracle_rank(payload: tuple[str, dict, str | None]) -> dict:
    """On each of 2 ranks: the bare model's forward under torch's ``context_parallel`` (tokens
    and RoPE table sharded, head-tail balancer), each block's recorded (sharded) inputs, then
    plain ``torch.compile(block, backend="eager")`` of each block, still under CP."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    from gbdoctor.capture.block import collect_block_inputs
    from gbdoctor.models import block_container, build_model, vocab_size
    from gbdoctor.scan.oracle import plain_compile_statements
    from gbdoctor.setup.context_parallel import cpu_ring_attention
    from gbdoctor.setup.train import synthetic_batch
    from gbdoctor.spec import load_spec

    path, flags, root = payload
    spec = load_spec(path)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
    torch.manual_seed(spec.training.seed)
    model = build_model(spec.model, max_seq_len=spec.training.seq_len).train()
    tokens, _ = synthetic_batch(
        seed=spec.training.seed,
        step=0,
        vocab=vocab_size(model),
        local_batch=spec.capture_batch_size,
        seq_len=spec.capture_seq_len,
        rank=0,  # the ranks of a CP group read the same rows
        world_size=1,
        device="cpu",
    )
    blocks = dict(block_container(model))
    store, remove = collect_block_inputs(model, blocks)
    # The built-in families' RoPE table shards with the tokens (torchtitan's freqs_cis).
    tables = [b for name, b in model.named_buffers() if name.endswith("rope_cache")]
    with (
        cpu_ring_attention(),
        context_parallel(mesh, buffers=[tokens, *tables], buffer_seq_dims=[1] + [0] * len(tables)),
    ):
        try:
            model(tokens)
        finally:
            remove()
        return {
            "local_seq": int(next(iter(store.values()))[0][0].shape[1]),
            "statements": {
                fqn: plain_compile_statements(block, store[fqn], root, flags)
                for fqn, block in blocks.items()
            },
        }


@pytest.mark.slow
def test_cp2_scan_matches_the_cp1_scan_per_kind_plus_the_cp_findings(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)
    from gbdoctor.scan import scan
    from gbdoctor.spec import load_spec

    cp2 = scan(load_spec(CP2), recompiles=True)
    cp1 = scan(load_spec(CP2, ["parallelism.context_parallel_degree=1"]), recompiles=True)
    assert not cp2.setup.simulated and cp2.setup.world_size == 2 and cp1.setup.world_size == 1
    assert all(b.error is None and not b.events for b in cp2.blocks)
    assert {b.kind for b in cp2.blocks} == {"dense", "dense+ac"}

    # CP-only: each block sees its half of the sequence, so the probe's half-length step
    # recompiles on 32 -> 16 tokens where CP = 1 recompiles on 64 -> 32; nothing else differs.
    one, two = _per_kind(cp1), _per_kind(cp2)
    local = {
        kind: (
            *found[:3],
            tuple(r.replace("expected 64, actual 32", "expected 32, actual 16") for r in found[3]),
        )
        for kind, found in one.items()
    }
    assert two == local and all(found[3] for found in two.values()), (one, two)
    cp_notes = [n for n in cp2.notes if n.startswith("context parallelism")]
    assert any("32-token share of the 64-token sequence" in n for n in cp_notes), cp2.notes
    assert any("allgather rotation" in n for n in cp_notes)
    assert not [n for n in cp1.notes if n.startswith("context parallelism")]

    # Oracle: plain torch.compile of each block under torch's context_parallel agrees.
    _check_oracle(CP2, cp2)


def _check_oracle(path, report) -> dict:
    """Run :func:`_cp_oracle_rank` on 2 gloo ranks; no unexpected difference with ``report``."""
    from gbdoctor.scan.oracle import compare, training_flags
    from gbdoctor.setup.dist import run_ranks
    from gbdoctor.spec import load_spec

    spec = load_spec(path)
    ranks = run_ranks(
        _cp_oracle_rank,
        (str(path), training_flags(report), spec.root or None),
        world_size=2,
        device_type="cpu",
        timeout_s=900,
    )
    assert [r["local_seq"] for r in ranks] == [spec.capture_seq_len // 2] * 2
    by_fqn = {b.fqn: b for b in report.blocks}
    for fqn, statements in ranks[0]["statements"].items():
        unexpected = [d for d in compare(statements, by_fqn[fqn]) if not d.expected]
        assert not unexpected, (fqn, unexpected)
    assert ranks[0]["statements"] == ranks[1]["statements"]
    return ranks[0]["statements"]


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ["print", "item_branch"])
def test_planted_breaks_are_the_same_under_cp2_and_match_the_oracle(custom_spec, flavor):
    """A model with a break planted after its SDPA attention (fixtures/models/planted.py; no
    position table, so only tokens and labels shard): the CP = 2 scan finds the CP = 1 scan's
    break, with the same cause, statement and gb_type, and so does plain torch.compile under
    torch's context_parallel."""
    from gbdoctor.scan import scan
    from gbdoctor.spec import load_spec

    planted = _load_planted()
    path = custom_spec("planted.py", flavor, extra="[parallelism]\ncontext_parallel_degree = 2\n")
    cp2 = scan(load_spec(path), recompiles=False)
    cp1 = scan(load_spec(path, ["parallelism.context_parallel_degree=1"]), recompiles=False)
    assert cp2.setup.world_size == 2 and not cp2.setup.simulated

    def breaks(report):
        return {
            b.kind: tuple((x.cause, x.gb_type, str(x.location)) for x in b.breaks)
            for b in report.blocks
            if b.same_as is None
        }

    assert breaks(cp2) == breaks(cp1)
    assert {x[0] for found in breaks(cp2).values() for x in found} == {
        planted.EXPECTED_CAUSE[flavor]
    }
    assert any("only the tokens and labels were sharded" in n for n in cp2.notes)
    statements = _check_oracle(path, cp2)
    assert any(statements.values())  # the oracle saw the planted break too


def _load_planted():
    import importlib.util

    spec = importlib.util.spec_from_file_location("planted", FIXTURES / "models" / "planted.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_a_simulated_cp2_scan_runs_the_cp_context_and_matches_the_simulated_cp1_scan(
    monkeypatch,
):
    """Fake process group and fake tensors (what a spec too large for the machine gets): the
    same CP context and stand-in run, per kind the CP = 1 simulation's breaks and graphs."""
    monkeypatch.chdir(FIXTURES.parent)
    from gbdoctor.scan import simulate_scan
    from gbdoctor.spec import load_spec

    cp2 = simulate_scan(load_spec(CP2))
    cp1 = simulate_scan(load_spec(CP2, ["parallelism.context_parallel_degree=1"]))
    assert cp2.setup.simulated and cp2.setup.world_size == 2
    assert all(b.error is None for b in cp2.blocks)
    assert {k: v[:3] for k, v in _per_kind(cp2).items()} == {
        k: v[:3] for k, v in _per_kind(cp1).items()
    }
    assert any("32-token share of the 64-token sequence" in n for n in cp2.notes), cp2.notes
