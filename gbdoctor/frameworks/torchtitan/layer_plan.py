"""A plan's per-layer choices applied after torchtitan's own ``parallelize_fn``.

torchtitan >= 0.3 compiles every transformer block in place with ``fullgraph=True``
(``distributed/compile.py``); its config can switch compile on or off, but not per block. What a
plan may change per layer, beyond the config: leave a layer eager, or compile it with
``fullgraph=False`` (a block that breaks would fail training under ``fullgraph=True``), and set
Dynamo flags that remove breaks. :func:`apply_layer_plan` is self-contained (torch only): the
emitter (``emit.py``) copies its source into the artefact a user applies, so the code a plan
scan runs and the code the user runs are the same text.
"""

from __future__ import annotations

from typing import Any

EAGER = "eager"
PARTIAL = "nofullgraph"
LAYER_MODES = (EAGER, PARTIAL)


def apply_layer_plan(
    model: Any,
    layers: tuple[tuple[str, str], ...],
    flags: tuple[tuple[str, bool], ...],
    backend: str,
) -> None:
    """Per ``(layer, mode)`` of ``model.layers``: ``eager`` undoes the block's in-place compile,
    ``nofullgraph`` compiles it again with ``fullgraph=False``; then each Dynamo flag is set."""
    from gbdoctor.torch_compat import dynamo_config

    for name, mode in layers:
        try:
            block = model.layers.get_submodule(name)
        except AttributeError:
            # Under PP this runs once per model part, and a part keeps its own stage's layers
            # only (the others deleted, the keys global): the layer is another stage's.
            continue
        if mode == "eager":
            block._compiled_call_impl = None  # what Module.compile set
        elif mode == "nofullgraph":
            block.compile(backend=backend, fullgraph=False)
        else:
            raise ValueError(f"unknown layer mode {mode!r} for layers.{name}")
    for flag, value in flags:
        setattr(dynamo_config(), flag, value)
