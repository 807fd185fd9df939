"""Capture: the only stage that talks to Dynamo internals (``torch._dynamo.*`` beyond its
public ``reset``/``config``, ``torch._logging``, Dynamo's counters and log streams).

``session`` (a capture: compiling regions with the recording backend, intercepting breaks,
pausing; strict mode), ``recording_backend`` (graph and op counts, CUDA-graph findings of the
ATen graphs), ``break_records`` (a break Dynamo met, a log message or an abandoned frame as a
``RawBreak``, one per statement), ``raw_capture`` (what one capture saw), ``block`` (driving one
block with its real inputs), ``locate`` (frames -> module FQN and the setup component that
installed the code), ``cudagraphs`` (CUDA-graph readiness read from the captured
forward/backward graphs; ``cudagraph_verdict`` the verdict of a block kind), ``recompiles``
(the ``recompiles`` log stream as records, for ``run``, the scan's probe and any other recipe's
training loop), ``counters`` (Dynamo's counters and failure kinds for ``run``), ``settings``
(Dynamo settings without a public switch, for the training setup), ``break_log`` (Dynamo's
graph-break log as messages, for the oracle check and the capture's fallback), ``rank_local``
(FSDP's collectives served on the rank, so per-rank capture work never waits on another rank).
Stages above receive records and plain values, never Dynamo objects.
"""

from gbdoctor.capture.block import (
    collect_block_inputs,
    describe_error,
    eager_stance,
    error_traceback,
    fresh_inputs,
    reset_fsdp_state,
    run_block,
    tokens_dynamic,
)
from gbdoctor.capture.locate import (
    Locator,
    clean_fqn,
    find_hooks,
    innermost_user_location,
    within,
)
from gbdoctor.capture.rank_local import rank_local_fsdp
from gbdoctor.capture.raw_capture import RawCapture
from gbdoctor.capture.recompiles import RecompileWatch, parse_recompile, watch_recompiles
from gbdoctor.capture.recording_backend import count_ops
from gbdoctor.capture.session import CaptureSession, strict_breaks
from gbdoctor.torch_compat import torch_version

__all__ = [
    "CaptureSession",
    "Locator",
    "RawCapture",
    "RecompileWatch",
    "clean_fqn",
    "collect_block_inputs",
    "count_ops",
    "describe_error",
    "eager_stance",
    "error_traceback",
    "find_hooks",
    "fresh_inputs",
    "innermost_user_location",
    "parse_recompile",
    "reset_fsdp_state",
    "rank_local_fsdp",
    "run_block",
    "strict_breaks",
    "tokens_dynamic",
    "torch_version",
    "watch_recompiles",
    "within",
]
