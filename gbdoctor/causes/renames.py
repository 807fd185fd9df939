"""gb_types that torch renamed between releases: the one table the gate and the rules consult.

A break is the same break across torch releases when its block kind, cause, user location and
checkpoint flag are the same, whatever gb_type torch gives it (``gate/compare.py`` matches on
that first). This table covers the renames the location alone cannot: baselines written before
locations were recorded (schema 1 and 2), and breaks whose reported frame moved with the rename.

Each entry is read from the ``graph_break_registry.json`` shipped in the wheels: the old id still
exists in the newer registry, but torch stopped raising it for this case and raises the new one.
Add an entry only after seeing both registries and a scan of the same code under both versions.
"""

from __future__ import annotations

from dataclasses import dataclass

from gbdoctor.torch_compat import torch_release


@dataclass(frozen=True, slots=True)
class GbRename:
    """``old`` (id, gb_type) became ``new`` (id, gb_type) from torch ``since`` on."""

    since: tuple[int, int]
    """First torch release (major, minor) that raises the new gb_type for this case."""
    old_id: str
    old_type: str
    new_id: str
    new_type: str
    why: str
    """The upstream change behind the rename (registry entry, what triggers it)."""


GB_RENAMES: tuple[GbRename, ...] = (
    GbRename(
        since=(2, 13),
        old_id="GB0067",
        old_type="HOP: Unsafe side effect",
        new_id="GB4413",
        new_type="HOP: Non-nullified side effect",
        # torch 2.13's graph_break_registry.json adds GB4413 ("Attribute '{name}' was not
        # restored to its original value"; absent from 2.11's and 2.12's): an attribute of an
        # outer-scope object set inside a checkpoint (a HOP subgraph) and left changed. 2.11 and
        # 2.12 raise GB0067 "Attempted to mutate" for it. Measured: the planted inplace_in_sac
        # block (fixtures/models/planted.py) under 2.11.0, 2.12.1 and 2.13.0 (docs/versions.md).
        why="attribute mutated inside a HOP and not restored: GB0067 -> GB4413",
    ),
    GbRename(
        since=(2, 14),
        old_id="GB0007",
        old_type="Attempted to call function marked as skipped",
        new_id="GB0376",
        new_type="Call to `torch._dynamo.disable()`",
        # torch 2.14's graph_break_registry.json adds GB0376 ("`torch._dynamo.disable()` was
        # called inside a compiled region"); 2.13's raises GB0007 with context "module:
        # torch._dynamo.decorators, qualname: disable". FSDP2 wraps its pre-forward hook with
        # torch._dynamo.disable at call time, so every FSDP-hook break in an MoE block moved.
        # Measured: fixtures/scans/llama4_ep2_torch2.13.json vs llama4_ep2_torch2.15.json, and
        # 2.14.1 raises GB0376 there too (benchmarks/results/compat/torch-2.14.1.json).
        why="runtime torch._dynamo.disable() call (FSDP2's hook wrapper): GB0007 -> GB0376",
    ),
)
"""Every known rename, oldest first."""


def _matches(gb_type: str, gb_id: str | None, type_: str, id_: str) -> bool:
    return gb_type == type_ or (gb_id is not None and gb_id == id_)


def renamed(
    old_type: str,
    old_id: str | None,
    new_type: str,
    new_id: str | None,
    old_torch: str,
    new_torch: str,
) -> GbRename | None:
    """The rename that turns the old gb_type into the new one between these torch versions
    (either direction: a baseline may be newer than the scan); None when none applies. An
    unknown version (an empty string) does not rule a rename out."""
    was, now = torch_release(old_torch), torch_release(new_torch)
    for rename in GB_RENAMES:
        forward = _matches(old_type, old_id, rename.old_type, rename.old_id) and _matches(
            new_type, new_id, rename.new_type, rename.new_id
        )
        backward = _matches(old_type, old_id, rename.new_type, rename.new_id) and _matches(
            new_type, new_id, rename.old_type, rename.old_id
        )
        if forward and (was is None or now is None or was < rename.since <= now):
            return rename
        if backward and (was is None or now is None or now < rename.since <= was):
            return rename
    return None


def gb_type_in(gb_type: str, torch_version: str) -> str:
    """The gb_type torch ``torch_version`` raises for a case that a newer release names
    ``gb_type``: ``HOP: Non-nullified side effect`` (2.13) is ``HOP: Unsafe side effect`` on 2.11.

    Only newer names map to older ones: every case a rename covers had the old gb_type before,
    but the old gb_type stays in use for other cases after it (GB0007 still marks a skipped
    C function on 2.14 and 2.15), so an old name alone does not say whether a newer release
    renamed it.
    ``gb_type`` itself when no rename applies or the version is unknown."""
    release = torch_release(torch_version)
    if release is None:
        return gb_type
    for rename in reversed(GB_RENAMES):
        if gb_type == rename.new_type and release < rename.since:
            gb_type = rename.old_type
    return gb_type
