"""Shape streams (``--shapes``): the file format, the presets and bucket padding, without a model.

The prediction against a real timeline of the same stream is ``tests/timeline/test_shapes.py`` (slow).
"""

from __future__ import annotations

import json
import random

import pytest

from gbdoctor.errors import BaselineError, ExitCode, SpecError
from gbdoctor.records.io import dumps
from gbdoctor.records.shape_presets import _best_buckets, pad_to_buckets, preset_stream
from gbdoctor.records.shapes import read_shape_stream, shape_stream_from_json


def _seqs(stream, rank=0):
    return [stream.shape(i, rank).seq for i in range(len(stream.steps))]


def test_a_written_file_reads_back_equal(tmp_path) -> None:
    stream = preset_stream("packed:steps=5,seq=32,mean=8,ranks=2")
    path = tmp_path / "s.json"
    path.write_text(dumps(stream))
    assert read_shape_stream(path) == stream
    assert stream.ranks == 2 and all(len(s.ranks) == 2 for s in stream.steps)
    for step in stream.steps:
        for shape in step.ranks:
            assert len(shape.docs) == shape.batch and all(sum(r) == 32 for r in shape.docs)


def test_presets_are_deterministic_and_follow_their_distribution() -> None:
    a = preset_stream("varlen:steps=30,min=8,max=64,seed=3")
    assert a == preset_stream("varlen:steps=30,min=8,max=64,seed=3")
    assert a != preset_stream("varlen:steps=30,min=8,max=64,seed=4")
    assert all(s % 8 == 0 and 8 <= s <= 64 for s in _seqs(a))
    assert set(_seqs(preset_stream("buckets:steps=40,lens=16/48"))) == {16, 48}
    # 7 samples in batches of 2: three full batches, then the last partial batch of 1.
    partial = preset_stream("last-partial:steps=8,batch=2,samples=7")
    assert [s.ranks[0].batch for s in partial.steps] == [2, 2, 2, 1, 2, 2, 2, 1]
    # Per-rank draws differ (a sampler without cross-rank bucketing).
    two = preset_stream("varlen:steps=20,ranks=2")
    assert _seqs(two, 0) != _seqs(two, 1)


def test_padding_to_buckets_is_the_least_padding() -> None:
    stream = preset_stream("varlen:steps=30,min=8,max=96,seed=1")
    padded, buckets, extra = pad_to_buckets(stream, 3)
    assert len(buckets) == 3 and max(buckets) == max(_seqs(stream))
    assert set(_seqs(padded)) <= set(buckets)
    assert extra == padded.tokens() - stream.tokens() > 0
    # Exact against brute force over every choice of 3 lengths (the longest always one).
    weights = {}
    for s in _seqs(stream):
        weights[s] = weights.get(s, 0) + 2
    lens = sorted(weights)

    def cost(bs):
        return sum(w * (min(b for b in bs if b >= x) - x) for x, w in weights.items())

    rng = random.Random(0)
    best = min(
        cost((*c, lens[-1]))
        for c in ({tuple(sorted(rng.sample(lens[:-1], 2))) for _ in range(400)})
    )
    assert cost(_best_buckets(__import__("collections").Counter(weights), 3)) <= best
    # A packed row is padded with one more document.
    packed, _, _ = pad_to_buckets(preset_stream("packed:steps=2,seq=30"), 1)
    assert all(sum(r) == 30 for s in packed.steps for r in s.ranks[0].docs)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"steps": []}', "missing key 'schema_version'"),
        ('{"schema_version": 1, "steps": []}', "no steps"),
        ('{"schema_version": 1, "steps": [{"ranks": [{"batch": 0, "seq": 8}]}]}', "batch"),
        ('{"schema_version": 1, "steps": [{"ranks": [{"batch": 1, "seqq": 8}]}]}', "seqq"),
        (
            '{"schema_version": 1, "steps": [{"ranks": [{"batch": 1, "seq": 8, '
            '"docs": [[3, 4]]}]}]}',
            "do not sum to seq 8",
        ),
        (
            '{"schema_version": 1, "steps": [{"ranks": [{"batch": 1, "seq": 8}]}, '
            '{"ranks": [{"batch": 1, "seq": 8}, {"batch": 1, "seq": 8}, '
            '{"batch": 1, "seq": 8}]}, {"ranks": [{"batch": 1, "seq": 8}, '
            '{"batch": 1, "seq": 8}]}]}',
            "rank shapes",
        ),
    ],
)
def test_a_bad_file_is_one_line_naming_the_problem(text, message) -> None:
    with pytest.raises(BaselineError) as err:
        shape_stream_from_json(text, "s.json")
    assert message in err.value.message and "\n" not in err.value.message
    assert err.value.exit_code == ExitCode.BAD_INPUT


@pytest.mark.parametrize(
    "text", ["varlen:steps=0", "varlen:stepz=3", "buckets:lens=a/b", "varlen:min=9,max=15"]
)
def test_a_bad_preset_is_a_spec_error(text) -> None:
    with pytest.raises(SpecError) as err:
        preset_stream(text)
    assert err.value.exit_code == ExitCode.BAD_INPUT and "--shapes" in err.value.message


def test_cli_refuses_bad_shapes_before_any_model(tmp_path) -> None:
    from repo_paths import FIXTURES
    from typer.testing import CliRunner

    from gbdoctor.cli.root import app

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": 1, "steps": [{"ranks": [{"batch": 1}]}]}))
    spec = str(FIXTURES / "llama3_debug.toml")
    runner = CliRunner()
    for args, words in (
        (["--shapes", str(bad)], "missing"),
        (["--shapes", "varlen:steps=1"], "steps"),
        (["--predict"], "need --shapes"),
        (["--shapes", "varlen", "--seq-lens", "8"], "both"),
        (["--shapes", "varlen", "--pad-buckets", "0"], "--pad-buckets"),
        (["--shapes", "varlen", "--fix", "--fix-with", "spec"], "--fix-with"),
        (["--dynamo-config", "enable_compiler_collectives=true"], "accelerator"),
    ):
        result = runner.invoke(app, ["timeline", spec, *args])
        assert result.exit_code == ExitCode.BAD_INPUT, (args, result.output)
        assert words in result.output, (args, result.output)
    for command, args, words in (
        ("scan", ["--shapes", "varlen", "--no-recompile-probe"], "--no-recompile-probe"),
        ("gate", ["--baseline", str(tmp_path / "b.json"), "--shapes", "varlen"], "--recompiles"),
        ("scan", ["--shapes", str(bad)], "missing"),
    ):
        result = runner.invoke(app, [command, spec, *args])
        assert result.exit_code == ExitCode.BAD_INPUT, (command, args, result.output)
        assert words in result.output, (command, args, result.output)


def test_a_version_1_timeline_still_reads_and_a_version_2_round_trips() -> None:
    """Schema 2 added graphs, shapes, rank_compile_steps and predicted, all with defaults."""
    from gbdoctor.records.io import from_dict
    from gbdoctor.records.timeline import TimelineGraph, TimelineReport
    from gbdoctor.report.html.documents import _load_timeline

    v1 = {
        "schema_version": 1, "spec": "s.toml", "framework": "f", "mode": "as-is",
        "strategy": "block", "backend": "aot_eager", "device": "cpu", "world_size": 1,
        "torch_version": "2.13", "recompile_limit": 8, "seq_lens": [8], "batch_size": 2,
        "steps": [], "frames": [], "warmup_steps": 0, "findings": [], "periods": [],
    }  # fmt: skip
    old = _load_timeline(json.loads(json.dumps(v1)), "t.json")
    assert old.graphs == () and not old.predicted and old.shapes == ""
    graph = TimelineGraph(
        frame="forward", graph=1, compiled_step=1, dynamic=("L['x'] dim 1",), shape_steps=(1, 4)
    )
    new = from_dict(TimelineReport, {**v1, "schema_version": 2})
    from dataclasses import replace

    new = replace(new, graphs=(graph,), shapes="varlen", predicted=True)
    assert _load_timeline(json.loads(dumps(new)), "t.json") == new


def test_flattened_preset_puts_each_steps_documents_in_one_row() -> None:
    stream = preset_stream("flattened:steps=20,batch=4,mean=16,max=64")
    for step in stream.steps:
        (shape,) = step.ranks
        assert shape.batch == 1 and len(shape.docs) == 1 and len(shape.docs[0]) == 4
        assert sum(shape.docs[0]) == shape.seq and max(shape.docs[0]) <= 64
    assert len(set(_seqs(stream))) > 5  # padding-free: the row length changes step to step


@pytest.mark.slow  # builds and runs the llama3 debug model 5 times: over the inner loop's 2 s
@pytest.mark.parametrize("flavor", ["debugmodel", "debugmodel_flex_attn"])
def test_packed_rows_reach_the_built_in_models(flavor) -> None:
    """The oracle for a packed row is the same documents run alone. Flex (torchtitan's document
    mask, positions restarting): every document gets exactly its own logits. SDPA stays causal
    across a row's documents, as torchtitan's SDPA does: the first document's logits are its
    own, a later one's are not (it attends to the documents before it); a row of one document
    is the plain row."""
    import torch

    from gbdoctor.models import build_model
    from gbdoctor.models.attention import document_positions
    from gbdoctor.records import ModelSpec

    torch.manual_seed(0)
    model = build_model(ModelSpec(name="llama3", flavor=flavor), max_seq_len=64)
    tokens = torch.randint(0, 2048, (1, 40))
    with torch.no_grad():
        packed = model(tokens, positions=document_positions(((24, 16),), "cpu"))
        first, second = model(tokens[:, :24]), model(tokens[:, 24:])
        single = model(tokens, positions=document_positions(((40,),), "cpu"))
        plain = model(tokens)
    torch.testing.assert_close(packed[:, :24], first)
    torch.testing.assert_close(single, plain)
    if flavor.endswith("flex_attn"):
        torch.testing.assert_close(packed[:, 24:], second)
    else:
        assert not torch.allclose(packed[:, 24:], second, atol=1e-3)
