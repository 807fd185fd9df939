"""Run the planted-break suite under each torch version given, each in a throwaway venv.

    python benchmarks/compat.py 2.13.0 2.14.1 [--venv-root /tmp/gbdoctor-compat]

For every version: a venv under --venv-root (never inside the repository), ``pip install
torch==VERSION`` from the CPU index pip is configured with, this checkout's test extra, then the
planted-break tests (``tests/test_causes.py tests/test_scan.py``). Prints one line per version:
installed torch, passed/failed counts, wall seconds. A version pip cannot install is reported as
such, not skipped silently.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITE = ("tests/test_causes.py", "tests/test_scan.py")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


TORCH_PY_DEPS = ("sympy", "networkx", "jinja2", "fsspec", "filelock", "typing_extensions")


def check(version: str, root: Path, *, no_deps: bool = False) -> str:
    venv = root / f"torch-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    if no_deps:
        # e.g. torch 2.14.1 exists here only as the CUDA wheel whose nvidia-* runtime packages
        # are not available: install it alone, plus its pure-Python dependencies (CPU use only).
        install = _run([*pip, "--no-deps", f"torch=={version}"])
        if not install.returncode:
            install = _run([*pip, *TORCH_PY_DEPS])
    else:
        install = _run([*pip, f"torch=={version}"])
    if install.returncode:
        tail = (install.stderr.strip().splitlines() or ["?"])[-1]
        return f"torch {version}: not installable here ({tail})"
    _run([str(python), "-m", "pip", "install", "-q", "-e", f"{REPO}[test]"], check=True)
    start = time.monotonic()
    tests = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITE], cwd=REPO)
    took = time.monotonic() - start
    torch_v = _run([str(python), "-c", "import torch; print(torch.__version__)"]).stdout.strip()
    counts = re.findall(r"(\d+) (passed|failed|error)", tests.stdout)
    summary = ", ".join(f"{n} {what}" for n, what in counts) or tests.stdout.strip()[-200:]
    return f"torch {torch_v}: {summary} in {took:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("versions", nargs="+")
    parser.add_argument("--venv-root", type=Path, default=Path("/tmp/gbdoctor-compat"))
    parser.add_argument(
        "--torch-no-deps",
        action="store_true",
        help="install torch without its (CUDA runtime) dependencies",
    )
    args = parser.parse_args()
    if REPO in args.venv_root.resolve().parents:
        parser.error("--venv-root must be outside the repository")
    args.venv_root.mkdir(parents=True, exist_ok=True)
    for version in args.versions:
        print(check(version, args.venv_root, no_deps=args.torch_no_deps), flush=True)


if __name__ == "__main__":
    main()
