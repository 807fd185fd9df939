"""Model-zoo tests run single-threaded.

The tensors here are tiny (batch 2, seq 32), so intra-op parallelism buys nothing, while on a busy
2-core machine OpenMP threads spin against other processes: measured 25 s single-threaded versus
65 s with 2 threads for this folder under load. The previous setting is restored afterwards.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
