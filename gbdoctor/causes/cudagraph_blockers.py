"""CUDA-graph blocker kinds explained, with their fixes (``gbdoctor causes --cudagraphs``).

The findings come from ``capture/cudagraphs.py``; this is their taxonomy, as ``taxonomy.py`` is
for graph-break causes. No torch import.
"""

from __future__ import annotations

from gbdoctor.records import BlockerKind

BLOCKER_EXPLANATIONS: dict[BlockerKind, tuple[str, str]] = {
    BlockerKind.MUTATED_INPUT: (
        "the graph writes in place into an input whose address is not fixed",
        "make the written tensor a static buffer (a plain module's buffer, same address every step), "
        "or move the in-place update (e.g. MoE token counting) out of the compiled region",
    ),
    BlockerKind.INPUT_COPY: (
        "a non-static tensor input is copied into the recorded buffer before every replay",
        "none needed when the producer is itself a cudagraph; otherwise the copy is the price "
        "(under FSDP2 the blocks' buffers are non-static inputs; parameters stay static)",
    ),
    BlockerKind.SYMINT_INPUT: (
        "an integer input (a size, or a value read with .item()) changes the recording",
        "keep sizes static (pad to a fixed length) or keep the value a 0-dim tensor",
    ),
    BlockerKind.RNG_STATE: (
        "random ops or a recomputed op's saved RNG state",
        "on CUDA keep graphsafe_rng_functionalization on (the default) and one device per graph",
    ),
    BlockerKind.HOST_SYNC: (
        "the host reads a device value (.item(), .tolist(), a blocking .to('cpu'))",
        "keep values on the device (use tensors as split sizes where the op allows), or leave the "
        "syncing code (EP dispatch) outside the graphed region",
    ),
    BlockerKind.CPU_TENSOR: (
        "a tensor would be on the host while training runs on CUDA",
        "create it with device= from an input tensor, or move it out of the region",
    ),
    BlockerKind.COLLECTIVE: (
        "a collective inside the graph",
        "capturable with NCCL when every rank replays the same graphs; not with gloo",
    ),
    BlockerKind.DYNAMIC_SHAPE: (
        "a shape that depends on data (unbacked) or changes between calls",
        "pad to a fixed size or mark the region static",
    ),
    BlockerKind.RELEASED_STATIC_INPUT: (
        "a parameter whose memory the setup frees after the step (FSDP2 reshards it)"
        " and gathers again elsewhere: cudagraph trees record the graph again on each "
        "new address (pytorch/pytorch#183451)",
        "leave this block's parameters resident (not sharded, or no resharding at all: backward "
        "reshards even with reshard_after_forward=False), or gather them inside the compiled "
        "graph so they are not graph inputs",
    ),
}
"""Per blocker kind: (what it is, the fix), naming no framework: a framework adds precedents of
the fixes (``contributions``)."""
