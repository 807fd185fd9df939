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
    rope = model.get_buffer("rope_cache")
    with (
        cpu_ring_attention(),
        context_parallel(mesh, buffers=[tokens, rope], buffer_seq_dims=[1, 0]),
    ):
        try:
            model(tokens)
        finally:
            remove()
        return {
            "local_seq": int(store["layers.0"][0][0].shape[1]),
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
    from gbdoctor.scan.oracle import compare, training_flags
    from gbdoctor.setup.dist import run_ranks

    spec = load_spec(CP2)
    ranks = run_ranks(
        _cp_oracle_rank,
        (str(CP2), training_flags(cp2), spec.root or None),
        world_size=2,
        device_type="cpu",
        timeout_s=900,
    )
    assert [r["local_seq"] for r in ranks] == [32, 32]
    by_fqn = {b.fqn: b for b in cp2.blocks}
    for fqn, statements in ranks[0]["statements"].items():
        unexpected = [d for d in compare(statements, by_fqn[fqn]) if not d.expected]
        assert not unexpected, (fqn, unexpected)
    assert ranks[0]["statements"] == ranks[1]["statements"]
