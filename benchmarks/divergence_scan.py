"""What a rank-divergent model costs a 2-rank scan, against the same model without divergence.

    python benchmarks/divergence_scan.py [--flavors clean,rank0_print_layer,...] [--probe]

Scans ``fixtures/models/rank_divergent.py`` (FSDP2 on 2 spawned gloo ranks, CPU) once per
flavor, ``clean`` first (every rank compiles alike: a normal scan), and prints per flavor the
scan's wall seconds, its ratio to ``clean``, the divergences the report lists and the ranks'
layers captured. ``--probe`` turns the recompile probe on (the CLI's default). Issue 44: before
the fix, ``rank0_print_layer`` never finished (both ranks waited in FSDP's collectives until the
deadline); run on an idle machine for numbers worth comparing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODEL = REPO / "fixtures" / "models" / "rank_divergent.py"


def _spec(directory: Path, flavor: str) -> Path:
    path = directory / f"{flavor}.toml"
    path.write_text(
        f'[model]\nname = "custom"\nflavor = "{flavor}"\nfactory = "{MODEL}:build"\n'
        "[training]\nlocal_batch_size = 2\nseq_len = 16\n"
        "[parallelism]\ndata_parallel_shard_degree = 2\n"
        '[activation_checkpoint]\nmode = "none"\n'
        '[gbdoctor]\nstrategy = "titan-v0.2.0"\ntimeout_s = 900\n'
    )
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavors", default="clean,rank0_print_layer,rank0_item,odd_tolist")
    parser.add_argument("--probe", action="store_true", help="run the recompile probe too")
    args = parser.parse_args()
    os.environ["GBDOCTOR_RECOMPILE_PROBE"] = "1" if args.probe else "0"
    from gbdoctor.scan import scan
    from gbdoctor.spec import load_spec

    flavors = args.flavors.split(",")
    if flavors[0] != "clean":
        flavors.insert(0, "clean")
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        for flavor in flavors:
            spec = load_spec(_spec(Path(tmp), flavor))
            start = time.perf_counter()
            report = scan(spec)
            took = time.perf_counter() - start
            base = base or took
            captured = sum(1 for b in report.blocks if b.same_as is None)
            print(
                f"{flavor:18s} {took:7.1f} s  x{took / base:4.2f} of clean  "
                f"{len(report.divergence)} divergence(s)  rank 0 captured {captured} layer(s)"
            )
            for d in report.divergence:
                print(
                    f"    ranks {d.ranks} not {d.without}: {d.gb_type} at {d.location} ({d.cause})"
                )


if __name__ == "__main__":
    main()
