"""DeepSpeed tests need the ``deepspeed`` extra (stage 2 of ``.ci/run`` installs it): each module
here is marked ``extra("deepspeed")`` and skipped without it, naming the install command."""

from __future__ import annotations

import os

from repo_paths import REPO

# DeepSpeed JIT-builds its CPU shm comm op on first use; keep the build in the project.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
