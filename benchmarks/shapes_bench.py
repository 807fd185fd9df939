"""Benchmark for ``gbdoctor timeline --shapes S --predict``: what the prediction costs against the
timeline it predicts, on the same stream, in one process, and whether it predicted it.

For each repetition it runs :func:`gbdoctor.timeline.predict.predict_timeline` and then
:func:`gbdoctor.timeline.train.run_timeline` on the same spec, stream, backend and Dynamo
settings, and prints both wall times, their ratio (the target is at most 1/3), the prediction's
calls (forwards at its distinct shape classes) against the stream's steps, and whether the events
(recompiles, dynamic dims, limit hits, eager steps, distinct shapes per graph) are equal.

    python benchmarks/shapes_bench.py                     # varlen_tiny, varlen 30 steps
    python benchmarks/shapes_bench.py --spec fixtures/llama3_debug.toml \
        --set gbdoctor.strategy=block-nofullgraph --shapes varlen:steps=30,min=8,max=96
    python benchmarks/shapes_bench.py --shapes buckets:steps=30,lens=16/32/64 --repeat 2
    python benchmarks/shapes_bench.py --dynamo-config automatic_dynamic_shapes=false

Not a test: the times depend on the machine and its load (``os.getloadavg`` before and after is
printed); the ratio is measured within one run.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "fixtures/shapes/varlen_tiny.toml"))
    parser.add_argument("--set", action="append", default=None, help="spec overrides")
    parser.add_argument("--shapes", default="varlen:steps=30,min=8,max=56,multiple=4")
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--dynamo-config", action="append", default=[])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    from gbdoctor.records.shape_presets import is_preset, preset_stream
    from gbdoctor.records.shapes import read_shape_stream
    from gbdoctor.run.settings import Shape, run_settings
    from gbdoctor.spec import load_spec
    from gbdoctor.timeline.predict import events, predict_timeline
    from gbdoctor.timeline.train import run_timeline

    spec = load_spec(args.spec, overrides=args.set or ())
    stream = (
        preset_stream(args.shapes) if is_preset(args.shapes) else read_shape_stream(args.shapes)
    )
    config = tuple(tuple(text.split("=", 1)) for text in args.dynamo_config)
    # As `timeline --backend` builds them; the stream replaces the steps and shapes.
    settings = run_settings(spec, steps=2, backend=args.backend, shape=Shape.CAPTURE)
    print(f"spec {args.spec} {args.set}, shapes {args.shapes}, backend {args.backend}, {config}")
    print(f"load before: {os.getloadavg()}")
    for i in range(args.repeat):
        start = time.perf_counter()
        predicted = predict_timeline(
            spec,
            stream,
            settings,
            dynamo_config=config,  # type: ignore[arg-type]
        )
        predict_s = time.perf_counter() - start
        start = time.perf_counter()
        real = run_timeline(
            spec,
            settings,
            shapes=stream,
            dynamo_config=config,  # type: ignore[arg-type]
        )
        timeline_s = time.perf_counter() - start
        calls = len({stream.shape(s, 0).shape for s in range(len(stream.steps))})
        print(
            f"run {i}: predict {predict_s:.1f} s ({calls} forwards), timeline {timeline_s:.1f} s "
            f"({len(stream.steps)} steps), ratio {predict_s / timeline_s:.3f}; "
            f"events equal: {events(predicted) == events(real)}"
        )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
