"""Scan cost versus a naive explain-every-block loop (a benchmark, not a test).

For each case it prints the wall time of ``gbdoctor scan`` (training setup, one capture per
distinct block kind, forward + backward) and of the loop an engineer would write by hand:
``torch._dynamo.explain(block)(x, rope)`` on every layer of the plain model (forward only, no
setup), and their ratio. Run from the repository root:

    python benchmarks/scan_bench.py                # llama4 debug (real) + 48-layer 17bx16e (meta)
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

import torch

from gbdoctor.models import build_model
from gbdoctor.scan import scan
from gbdoctor.spec import load_spec


def naive_explain_loop(spec, device: str) -> tuple[float, int]:
    """explain() on every block of the bare model, with its real inputs; returns (s, breaks)."""
    torch.manual_seed(0)
    model = build_model(spec.model, device=device, max_seq_len=spec.training.seq_len)
    inputs: dict[str, tuple] = {}
    hooks = [
        block.register_forward_pre_hook(
            lambda m, a, k, key=key: inputs.setdefault(key, (a, k)), with_kwargs=True
        )
        for key, block in model.layers.items()
    ]
    tokens = torch.randint(
        0,
        model.tok_embeddings.num_embeddings,
        (spec.capture_batch_size, spec.capture_seq_len),
        device=device,
    )
    with torch.no_grad():
        model(tokens)
    for h in hooks:
        h.remove()
    start = time.perf_counter()
    breaks = 0
    for key, block in model.layers.items():
        args, kwargs = inputs[key]
        out = torch._dynamo.explain(block)(*args, **kwargs)
        breaks += max(out.graph_break_count, 0)
    return time.perf_counter() - start, breaks


def timed_scan(spec) -> tuple[float, int, int]:
    start = time.perf_counter()
    report = scan(spec)
    captured = sum(1 for b in report.blocks if b.same_as is None)
    return time.perf_counter() - start, len(report.blocks), captured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-full-size", action="store_true")
    args = parser.parse_args()
    cases = [("llama4 debugmodel (6 layers, CPU, real)", "fixtures/llama4_debug.toml", [], "cpu")]
    if not args.skip_full_size:
        cases.append(
            (
                "llama4 17bx16e (48 layers, meta, simulated)",
                "fixtures/llama4_debug.toml",
                [
                    "model.flavor=17bx16e",
                    "gbdoctor.simulate=true",
                    "gbdoctor.batch_size=1",
                    "gbdoctor.seq_len=128",
                ],
                "meta",
            )
        )
    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )
    print(
        "| case | layers | captured kinds | gbdoctor scan (s) | naive explain loop (s) | loop / scan |"
    )
    print("|---|---|---|---|---|---|")
    for name, path, overrides, device in cases:
        spec = load_spec(path, overrides)
        scan_s, layers, captured = timed_scan(spec)
        loop_s, _ = naive_explain_loop(spec, device)
        print(
            f"| {name} | {layers} | {captured} | {scan_s:.1f} | {loop_s:.1f} | {loop_s / scan_s:.2f} |"
        )
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
