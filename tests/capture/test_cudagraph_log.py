"""What ``run``'s ``cudagraphs`` mode reads from inductor's ``cudagraphs`` log: skips and
re-recordings, taken over from both of inductor's loggers so the recordings (one debug line per
graph and input) no longer flood the terminal (seen on an H200: 46 recordings, 28 re-recordings
in 12 steps, docs/gpu.md)."""

from __future__ import annotations

import logging

from gbdoctor.capture.counters import CUDAGRAPHS_LOGGERS, record_cudagraph_log

# The messages as inductor 2.11 logged them on the H200 (cudagraph_trees.py, cudagraph_utils.py).
RERECORD = (
    "Re-recording function=partition_0, reason=static input data pointer changed.\n"
    "input name: primals_10. data pointer changed from 139750379880448 to 139750673481728."
)
RECORDING = "Recording function=partition_0, cuda_graph_id=40, inputs: [0]: Tensor(size=[8])"
SKIP = "skipping cudagraphs due to mutated inputs (1 instances). Found from :\n  File x.py"


def test_skips_and_re_recordings_are_recorded_and_not_printed(capsys):
    utils, trees = (logging.getLogger(name) for name in CUDAGRAPHS_LOGGERS)
    with record_cudagraph_log() as recorded:
        trees.debug(RECORDING)
        trees.debug(RERECORD)
        trees.debug(RERECORD.replace("primals_10", "primals_4"))
        utils.debug(SKIP)
        # torch 2.13's form names the mode as well
        trees.debug(
            "[0/0] Re-recording function=partition_1, mode=FORWARD, reason=static input data "
            "pointer changed.\ninput name: primals_4."
        )
    assert recorded.rerecords == [
        "partition_0: static input data pointer changed",
        "partition_0: static input data pointer changed",
        "partition_1: static input data pointer changed",
    ]
    assert recorded.reasons == [
        "skipping cudagraphs due to mutated inputs (1 instances). Found from :"
    ]
    captured = capsys.readouterr()
    assert "Recording" not in captured.err + captured.out
    # Restored afterwards: the loggers propagate again, the recorder is gone.
    assert all(logging.getLogger(n).propagate for n in CUDAGRAPHS_LOGGERS)
    assert not any(logging.getLogger(n).handlers for n in CUDAGRAPHS_LOGGERS)
