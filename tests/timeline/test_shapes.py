"""``timeline --shapes S --predict`` against the real timeline of the same stream (the oracle).

A 30-step varlen stream on the tiny debug spec (``fixtures/shapes/varlen_tiny.toml``): the
prediction (one forward per distinct shape, Dynamo's eager backend, in this process) must give
the same recompiles, dynamic dims, limit hits, eager steps and distinct shapes per graph (the
CUDA-graph re-records) as a real ``timeline`` run training every step with aot_eager, then the
same for each fix on the same stream: ``--fix`` (every size dynamic) and padding to 4 buckets;
at world size 2 with per-rank lengths, the same steps per rank (which ranks diverge). Then
``scan --shapes``: the recompile probe at the stream's shapes; and ``--fix-with shapes-spec`` on
a padding-free stream. Packed rows (positions restarting per document) are ``test_packing.py``'s.
Each test trains or scans for real (minutes on a loaded 2-core machine), hence slow.
"""

from __future__ import annotations

import pytest
from repo_paths import FIXTURES

from gbdoctor.records.shape_presets import pad_to_buckets, preset_stream
from gbdoctor.report.timeline import render_table, step_mark
from gbdoctor.run.settings import Shape, run_settings
from gbdoctor.spec import load_spec
from gbdoctor.timeline.predict import events, predict_timeline
from gbdoctor.timeline.train import run_timeline

pytestmark = pytest.mark.slow

SPEC = FIXTURES / "shapes" / "varlen_tiny.toml"
STREAM = preset_stream("varlen:steps=30,min=8,max=56,multiple=4")
STATIC = (("automatic_dynamic_shapes", "false"),)
"""Every new length recompiles (what ``torch.compile(dynamic=False)`` does): the stream's 12
distinct lengths pass ``recompile_limit`` (8)."""


def _settings(spec):
    """What ``timeline --backend aot_eager`` builds (the stream replaces steps and shapes)."""
    return run_settings(spec, steps=2, backend="aot_eager", shape=Shape.CAPTURE)


def _after(report):
    """The events of the run with the fixes applied (``verification.after_steps``)."""
    v = report.verification
    assert v is not None
    return [
        ([(c.frame, c.attempt, c.guard_kind, c.limit_hit) for c in s.compiles], s.eager_frames)
        for s in v.after_steps
    ]


def test_static_sizes_past_the_limit_predicted_and_fixed() -> None:
    spec = load_spec(SPEC)
    lengths = [STREAM.shape(i, 0).seq for i in range(30)]
    assert len(set(lengths)) > 8  # more distinct lengths than the recompile limit
    predicted = predict_timeline(spec, STREAM, _settings(spec), dynamo_config=STATIC, fix=True)
    real = run_timeline(spec, _settings(spec), shapes=STREAM, dynamo_config=STATIC, fix=True)
    assert predicted.predicted and not real.predicted
    assert events(predicted) == events(real)
    # What it predicted: a recompile at each new length until the 9th, then a limit hit, and
    # every later step at a length without a graph runs eagerly.
    block = next(f for f in real.frames if "tiny_custom.py" in f.frame)
    firsts = sorted({lengths.index(n) for n in lengths})
    assert block.recompile_steps == tuple(firsts[1:8])
    assert block.limit_hit_step == firsts[8]
    cached = {lengths[i] for i in firsts[:8]}
    late = tuple(i for i in range(firsts[8], 30) if lengths[i] not in cached)
    assert block.eager_steps == late and late
    assert all(not g.dynamic for g in real.graphs)
    # The fix (every size a symbol from the first compile) verified on the same stream, both
    # ways: no recompile after step 0, no limit hit, no eager step.
    for report in (predicted, real):
        v = report.verification
        assert v is not None and v.gone, v
        assert ("assume_static_by_default", "False") in v.applied
        assert (v.after_recompiles, v.after_limit_hits, v.after_eager_steps) == (0, 0, 0)
    assert _after(predicted) == _after(real)
    assert "shapes: varlen:" in render_table(predicted)


def test_dynamic_sizes_re_record_per_shape_and_buckets_bound_them() -> None:
    spec = load_spec(SPEC)
    distinct = len({STREAM.shape(i, 0).seq for i in range(30)})
    padded, buckets, extra = pad_to_buckets(STREAM, 4)
    assert len(buckets) == 4 and extra > 0
    for stream, shapes in ((STREAM, distinct), (padded, 4)):
        predicted = predict_timeline(spec, stream, _settings(spec))
        real = run_timeline(spec, _settings(spec), shapes=stream)
        assert events(predicted) == events(real)
        # Automatic dynamic: the first new length recompiles with the length as a symbol;
        # that graph then serves every other length, one CUDA-graph recording per length.
        marks = "".join(step_mark(s) for s in real.steps)
        assert marks.count("R") == 1 and "L" not in marks and "E" not in marks, marks
        block = [g for g in real.graphs if "tiny_custom.py" in g.frame]
        assert [bool(g.dynamic) for g in block] == [False, True]
        assert any("dim 1" in d for d in block[1].dynamic)
        assert len(block[0].shape_steps) + len(block[1].shape_steps) == shapes


def test_scan_probe_follows_the_stream() -> None:
    """``scan --shapes``: the recompile probe replays each block kind at the stream's distinct
    shapes; with automatic dynamic shapes the first new length recompiles (expected, not
    measured) and the dynamic graph takes every later one."""
    from gbdoctor.scan import scan

    stream = preset_stream("varlen:steps=12,min=8,max=56,multiple=4")
    report = scan(load_spec(SPEC), recompiles=True, shapes=stream)
    assert any("distinct shapes of --shapes varlen" in n for n in report.notes)
    probed = [r for b in report.blocks for r in b.recompiles]
    assert probed and all(not r.measured and not r.limit_hit for r in probed)
    assert all("size mismatch at index 1" in r.reason for r in probed)
    assert len({(r.function, r.step) for r in probed}) == len(probed)


def test_per_rank_shapes_predict_which_ranks_diverge() -> None:
    """Two FSDP ranks, each its own lengths: the ranks compile in different steps, and the
    prediction names the same steps per rank as the real run."""
    spec = load_spec(SPEC, overrides=["parallelism.data_parallel_shard_degree=2"])
    stream = preset_stream("varlen:steps=8,min=8,max=24,multiple=8,ranks=2")
    predicted = predict_timeline(spec, stream, _settings(spec))
    real = run_timeline(spec, _settings(spec), shapes=stream)
    assert events(predicted) == events(real)
    assert len(set(real.rank_compile_steps)) == 2, real.rank_compile_steps
    assert any("diverge" in n for n in real.notes) and any("diverge" in n for n in predicted.notes)


PACKED_FLEX = FIXTURES / "shapes" / "packed_flex.toml"


def test_shapes_spec_fix_predicted_as_trained() -> None:
    """``--fix --fix-with shapes-spec`` on the same padding-free stream, static sizes (every new
    length recompiles, past the limit): torch.compile(shapes_spec=...) over the dim the guards
    name (the row length, shared by the RoPE table) compiles it unbacked from the first call;
    no recompile after step 0, predicted and trained alike."""
    spec = load_spec(PACKED_FLEX, overrides=["model.flavor=debugmodel"])
    stream = preset_stream("flattened:steps=12,batch=4,mean=16,max=64")
    kwargs = dict(dynamo_config=STATIC, fix=True, fix_with="shapes-spec")
    predicted = predict_timeline(spec, stream, _settings(spec), **kwargs)
    real = run_timeline(spec, _settings(spec), shapes=stream, **kwargs)
    assert events(predicted) == events(real)
    for report in (predicted, real):
        v = report.verification
        assert v is not None and v.gone, v
        assert v.applied == (("shapes_spec", "x dim 1"),)
        assert v.before_recompiles > 0 and v.after_recompiles == 0
    assert _after(predicted) == _after(real)
