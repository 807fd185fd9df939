"""``timeline --shapes S --predict`` on packed rows, against the real timeline of the same stream
(the oracle): the built-in llama3 debug model fed padding-free packed rows (Flex and its SDPA
twin), and a transformers Llama fed ``position_ids`` that restart per document. Each test trains
and predicts for real (minutes on a loaded 2-core machine), hence slow. Split from
``test_shapes.py`` (the varlen stream and the fixes) so that under ``pytest -n 2 --dist loadfile``
neither file holds a worker for more than a few minutes.
"""

from __future__ import annotations

import pytest
from repo_paths import FIXTURES

from gbdoctor.records.shape_presets import preset_stream
from gbdoctor.report.timeline import step_mark
from gbdoctor.run.settings import Shape, run_settings
from gbdoctor.spec import load_spec
from gbdoctor.timeline.predict import events, predict_timeline
from gbdoctor.timeline.train import run_timeline

pytestmark = pytest.mark.slow


def _settings(spec):
    """What ``timeline --backend aot_eager`` builds (the stream replaces steps and shapes)."""
    return run_settings(spec, steps=2, backend="aot_eager", shape=Shape.CAPTURE)


PACKED_FLEX = FIXTURES / "shapes" / "packed_flex.toml"
PACKED_HF = FIXTURES / "shapes" / "packed_hf_llama.toml"


@pytest.mark.parametrize("flavor", ["debugmodel_flex_attn", "debugmodel"])
def test_packed_rows_predicted_as_trained(flavor) -> None:
    """Padding-free packing (``flattened``: each step's 4 documents in one row of their summed
    length, positions restarting per document) on the built-in llama3, 30 steps, forward and
    backward per step (Flex trains on CPU under aot_eager: ``attention.flex_cpu_backward``).
    The row length changes every step: automatic dynamic recompiles once, with the length a
    symbol. Under Flex the document-masked BlockMask is rebuilt every step; its document-id
    tensor (in the mask function's closure) becomes dynamic with the length, but its block
    counts (``q_indices``: rows of 128 tokens) were compiled static at 1 block: the first row
    past 128 tokens recompiles once more."""
    spec = load_spec(PACKED_FLEX, overrides=[f"model.flavor={flavor}"])
    stream = preset_stream("flattened:steps=30,batch=4,mean=16,max=64")
    lengths = [stream.shape(i, 0).seq for i in range(30)]
    expected = {next(i for i, n in enumerate(lengths) if n != lengths[0])}
    flex = flavor.endswith("flex_attn")
    if flex:
        blocks = [-(-n // 128) for n in lengths]
        expected.add(next(i for i, b in enumerate(blocks) if b != blocks[0]))
    predicted = predict_timeline(spec, stream, _settings(spec))
    real = run_timeline(spec, _settings(spec), shapes=stream)
    assert events(predicted) == events(real)
    marks = "".join(step_mark(s) for s in real.steps)
    assert {i for i, m in enumerate(marks) if m == "R"} == expected, marks
    assert marks[0] == "C" and "E" not in marks and "L" not in marks, marks
    block = [g for g in real.graphs if "decoder.py" in g.frame]
    assert len(block) == 1 + len(expected) and not block[0].dynamic
    assert any("mask_mod" in d for d in block[1].dynamic) == flex, block[1].dynamic
    assert any("`positions` restart" in n for n in real.notes)


def test_hf_position_ids_packing_predicted_as_trained() -> None:
    """A transformers Llama from its config (the factory path), fed ``position_ids`` that
    restart per document: transformers builds a document-masked causal mask from them only when
    a row holds several documents, so the first step that packs a second document gives the
    compiled layers a mask where they had None: a recompile, which the prediction (classes
    single / packed) names at the same step."""
    spec = load_spec(PACKED_HF)
    stream = preset_stream("packed:steps=12,batch=1,seq=64,mean=48")
    kinds = [len(stream.shape(i, 0).docs[0]) > 1 for i in range(12)]
    first_packed = kinds.index(True)
    assert not kinds[0] and first_packed > 0
    predicted = predict_timeline(spec, stream, _settings(spec))
    real = run_timeline(spec, _settings(spec), shapes=stream)
    assert events(predicted) == events(real)
    layer = next(f for f in real.frames if "modeling_layers.py" in f.frame)
    assert layer.recompile_steps == (first_packed,), layer
    assert any("`position_ids` restart" in n for n in real.notes)
