"""What the dedupe proof costs on a 48-layer model, against capturing every layer.

    python benchmarks/dedupe_proof.py [--repeats 3] [--flavors clean,resume,by_flag]

Scans ``fixtures/models/frame_shapes.py`` with 48 layers (``deep_<flavor>``) in-process, on CPU,
three ways per flavor: with dedupe (capture the first layer, prove the others on its compiled
code), with ``--no-dedupe`` (capture every layer), and reports the time spent in the proofs
alone (``scan.dedupe.prove_shared``). Prints per flavor: layers captured, layers proven and
how, scan seconds with and without dedupe (median, min-max over the repeats), proof seconds in
total and per layer, and the ratios proof / capture-every-layer and dedupe / no-dedupe.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("GBDOCTOR_RECOMPILE_PROBE", "0")

from gbdoctor.scan import rank, scan  # noqa: E402
from gbdoctor.spec import load_spec  # noqa: E402

MODEL = REPO / "fixtures" / "models" / "frame_shapes.py"


def _spec(directory: Path, flavor: str) -> Path:
    path = directory / f"{flavor}.toml"
    path.write_text(
        f'[model]\nname = "custom"\nflavor = "deep_{flavor}"\nfactory = "{MODEL}:build"\n'
        "[training]\nlocal_batch_size = 2\nseq_len = 16\n"
        '[activation_checkpoint]\nmode = "none"\n[gbdoctor]\nstrategy = "titan-v0.2.0"\n'
    )
    return path


class _ProofTimer:
    """Wraps ``prove_shared`` as the scan calls it, summing its wall time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._original = rank.prove_shared

    def __enter__(self) -> _ProofTimer:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return self._original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        rank.prove_shared = timed
        return self

    def __exit__(self, *exc: object) -> None:
        rank.prove_shared = self._original


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} s ({min(values):.1f}-{max(values):.1f})"


def bench(flavor: str, repeats: int, directory: Path) -> None:
    spec = load_spec(_spec(directory, flavor))
    with_dedupe, without, proof, per_layer = [], [], [], []
    report = None
    for _ in range(repeats):
        with _ProofTimer() as timer:
            start = time.perf_counter()
            report = scan(spec, dedupe=True)
            with_dedupe.append(time.perf_counter() - start)
        proof.append(timer.seconds)
        per_layer.append(timer.seconds / max(timer.calls, 1))
        start = time.perf_counter()
        scan(spec, dedupe=False)
        without.append(time.perf_counter() - start)
    assert report is not None
    captured = sum(1 for b in report.blocks if b.same_as is None)
    how = Counter(str(b.dedupe) for b in report.blocks if b.dedupe is not None)
    ratio = statistics.median(proof) / statistics.median(without)
    print(
        f"{flavor:>18}: {len(report.blocks)} layers, {captured} captured, proofs {dict(how)}\n"
        f"{'':>20}scan with dedupe {_spread(with_dedupe)}, every layer captured "
        f"{_spread(without)}, ratio {statistics.median(with_dedupe) / statistics.median(without):.2f}\n"
        f"{'':>20}proofs {_spread(proof)} in all, {statistics.median(per_layer) * 1000:.0f} ms "
        f"per layer; proofs / capturing every layer = {ratio:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flavors", default="clean,resume,autograd_function,by_flag")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for flavor in args.flavors.split(","):
            bench(flavor, args.repeats, Path(tmp))


if __name__ == "__main__":
    main()
