"""The backward of a break's eager work is charged to that break (``capture.profile``): the
autograd engine's node events carry the sequence number of the forward op that made the node.

Oracle: the profiler's own events. The costly break runs ``tanh`` 24 times per layer eagerly
(``fixtures/models/priced.py``), so its backward must hold at least the 48 ``TanhBackward0``
nodes' time and at most every non-compiled backward node's; the cheap break runs nothing
eagerly, so nothing is added to it.
"""

from __future__ import annotations

import importlib.util

import torch
import torch._dynamo
from repo_paths import FIXTURES

from gbdoctor.capture.profile import eager_us_by_frame, watch_break_frames
from gbdoctor.records import Location

MODEL = FIXTURES / "models" / "priced.py"
NODE = "autograd::engine::evaluate_function: "


def _line(text: str) -> int:
    lines = MODEL.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(text))


def test_the_backward_of_eager_work_is_charged_to_its_break():
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.reset()
    spec = importlib.util.spec_from_file_location("priced_backward", MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build()
    for layer in model.layers.values():
        layer.compile(backend="aot_eager")
    tokens = torch.randint(0, module.VOCAB, (4, 32))

    def step():
        model(tokens).sum().backward()

    with watch_break_frames() as frames:
        step()
        step()
    (costly,) = frames.frames_at(Location(file="models/priced.py", line=_line("return eager_mix(")))
    (cheap,) = frames.frames_at(
        Location(file="models/priced.py", line=_line("torch._dynamo.graph_break()"))
    )
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = prof.events()
    forward = eager_us_by_frame(events, set(frames.frames), backward=False)
    both = eager_us_by_frame(events, set(frames.frames))
    added = both[costly] - forward[costly]

    tanh = [e for e in events if e.name == NODE + "TanhBackward0"]
    assert len(tanh) == module.EAGER_MATMULS * module.N_LAYERS
    eager_nodes = [
        e for e in events if e.name.startswith(NODE) and "CompiledFunctionBackward" not in e.name
    ]
    assert sum(e.time_range.elapsed_us() for e in tanh) <= added + 1e-6
    assert added <= sum(e.time_range.elapsed_us() for e in eager_nodes) + 1e-6
    assert both.get(cheap, 0.0) == forward.get(cheap, 0.0)
    torch._dynamo.reset()
