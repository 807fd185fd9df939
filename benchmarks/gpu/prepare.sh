#!/usr/bin/env bash
# Run on a machine WITH network, before going to the offline GPU machine (docs/gpu.md).
#
#   benchmarks/gpu/prepare.sh [WHEELHOUSE]        (default: benchmarks/gpu/wheelhouse, git-ignored)
#
# GBDOCTOR_GPU_EXTRAS (default "accelerate"; "" for none): gbdoctor extras whose steps validate.py
# runs too. Their packages come without torch: each one's own wheel with --no-deps, then its
# requirements other than torch with theirs.
# Downloads CPython 3.12 manylinux x86_64 wheels of everything gbdoctor needs besides torch:
# its runtime dependencies (read from pyproject.toml, torch left out: the GPU image has its own,
# which validate.sh never touches), pytest, and setuptools (to build gbdoctor from the tree with
# no index). An image that already has pandas/rich/typer/pytest uses its own; the wheelhouse only
# fills what is missing. Prints the wheelhouse's size; fails above 60 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
wheelhouse="${1:-benchmarks/gpu/wheelhouse}"
mkdir -p "$wheelhouse"
python=${PYTHON:-python3}

# gbdoctor's requirements minus torch (and gbdoctor's own test tools beyond pytest).
mapfile -t reqs < <("$python" - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for d in deps:
    if re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].strip().lower() != "torch":
        print(d)
PY
)
reqs+=("pytest>=7" "setuptools>=68")
echo "prepare: ${reqs[*]}"
download=("$python" -m pip download --quiet --dest "$wheelhouse"
    --only-binary=:all: --implementation cp --python-version 3.12 --abi cp312
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform any)
"${download[@]}" "${reqs[@]}"

extras=${GBDOCTOR_GPU_EXTRAS-accelerate}
for extra in $extras; do
    mapfile -t extra_reqs < <(EXTRA="$extra" "$python" - <<'PY'
import os, tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"][os.environ["EXTRA"]]))
PY
)
    echo "prepare: extra $extra: ${extra_reqs[*]}"
    "${download[@]}" --no-deps "${extra_reqs[@]}"
    # Their requirements, torch left out (accelerate requires torch; the image's is kept).
    mapfile -t deps < <(WHEELHOUSE="$wheelhouse" "$python" - "${extra_reqs[@]}" <<'PY'
import os, re, sys, zipfile
from pathlib import Path
names = {re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0].strip().lower().replace("-", "_") for r in sys.argv[1:]}
for wheel in Path(os.environ["WHEELHOUSE"]).glob("*.whl"):
    if wheel.name.split("-")[0].lower() not in names:
        continue
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                req = line.split(":", 1)[1].strip()
                if re.split(r"[<>=!~ ;\[(]", req, maxsplit=1)[0].strip().lower() != "torch":
                    print(req)
PY
)
    [ ${#deps[@]} -eq 0 ] || "${download[@]}" "${deps[@]}"
done
if ls "$wheelhouse" | grep -qiE '^(torch|nvidia|triton)[-_]'; then
    echo "Error: the wheelhouse holds torch or CUDA wheels; it must not (the image's torch is kept)" >&2
    exit 1
fi
size_mb=$(du -sm "$wheelhouse" | cut -f1)
count=$(ls "$wheelhouse" | wc -l)
echo "prepare: $count wheels, ${size_mb} MB in $wheelhouse"
if [ "$size_mb" -gt 60 ]; then
    echo "Error: the wheelhouse is ${size_mb} MB, over the 60 MB budget" >&2
    exit 1
fi
