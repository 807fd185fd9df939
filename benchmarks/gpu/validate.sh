#!/usr/bin/env bash
# One command on a GPU machine with the image's torch, Python 3.12 and NO network (docs/gpu.md):
#
#   benchmarks/gpu/validate.sh [--dry-run] [--out DIR]
#
# 1. installs gbdoctor from this tree into a venv that sees the image's packages
#    (--system-site-packages): pip runs with --no-index, the wheelhouse of prepare.sh as its only
#    source, and the machine's pip configuration ignored; torch is compared before and after (a
#    torch that is not in gbdoctor's range fails the install: the wheelhouse has no torch);
# 2. runs benchmarks/gpu/validate.py: scan, plan and run of the bundled debug specs on CUDA (nccl,
#    inductor), the 2-rank EP spec with >= 2 GPUs, predicted CUDA-graph readiness against
#    inductor's own skip reasons, every number with the GPU name into benchmarks/results/gpu/.
#
# Exit: 0 all steps passed; 1 a prediction disagreed with inductor; 2 no CUDA device (after every
# step before the first CUDA call); 3 a step that should work failed (its output is printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
wheelhouse=$(realpath -m "${GBDOCTOR_WHEELHOUSE:-benchmarks/gpu/wheelhouse}")
venv=${GBDOCTOR_GPU_VENV:-benchmarks/gpu/.venv}
python=${PYTHON:-python3}
fail() { echo "validate: FAILED: $*" >&2; exit 3; }

echo "validate: [install] the image's python: $("$python" -c 'import sys; print(sys.version.split()[0])')"
torch_before=$("$python" -c 'import torch; print(torch.__version__)') \
    || fail "the image's $python has no importable torch"
[ -d "$venv" ] || "$python" -m venv --system-site-packages "$venv" || fail "venv $venv"
# --system-site-packages reaches the base interpreter's packages only: where the image's python is
# itself a venv (e.g. /opt/torch/.venv), its torch would be invisible. A .pth file naming the image
# python's own site-packages makes them visible either way (gbdoctor's install still goes first).
image_site=$("$python" -c 'import site; print("\n".join(site.getsitepackages()))')
venv_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "$image_site" >"$venv_site/_gbdoctor_image_site.pth"
# The machine's pip configuration (an index, constraints) is not this kit's: ignore it; no index.
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
pip=("$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheelhouse")
# gbdoctor builds with setuptools>=68 (pyproject.toml); no build isolation, so no index is needed.
"${pip[@]}" "setuptools>=68" || fail "setuptools>=68 is neither installed nor in $wheelhouse (run prepare.sh)"
"${pip[@]}" --no-build-isolation -e . \
    || fail "offline install of gbdoctor (a dependency missing from $wheelhouse? run prepare.sh)"
# The extras prepare.sh fetched (GBDOCTOR_GPU_EXTRAS, default accelerate): a missing one only
# skips its steps (validate.py says which), the core steps still run.
for extra in ${GBDOCTOR_GPU_EXTRAS-accelerate}; do
    "${pip[@]}" --no-build-isolation -e ".[$extra]" \
        || echo "validate: [install] extra $extra NOT installed (its wheels missing from $wheelhouse?)"
done
torch_after=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
[ "$torch_before" = "$torch_after" ] || fail "installing gbdoctor changed torch $torch_before -> $torch_after"
echo "validate: [install] gbdoctor from the tree, torch $torch_after kept, no index used"
exec "$venv/bin/python" benchmarks/gpu/validate.py "$@"
