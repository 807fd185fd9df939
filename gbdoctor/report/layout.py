"""Text helpers shared by the formatters: labels and one-line strings, no counting, no rich."""

from __future__ import annotations

from pathlib import PurePath

from gbdoctor.records import Location, ScanReport, SetupInfo

__all__ = [
    "ac_label",
    "dynamo_label",
    "fit_path",
    "location_label",
    "header_fields",
    "one_line",
    "parallel_label",
    "setup_line",
    "short_location",
]


def short_location(loc: Location | None) -> str:
    """``moe.py:42`` (basename and line); ``-`` when the break has no location."""
    if loc is None:
        return "-"
    name = PurePath(loc.file.replace("\\", "/")).name
    return f"{name}:{loc.line}"


ELLIPSIS = "\u2026"


def fit_path(where: str, width: int, sep: str = "/") -> str:
    """``where`` (``path/to/file.py:47``) in at most ``width`` characters, shortened from the
    left by whole directories (``\u2026/models/decoder.py:47``): the file and line stay whole, so
    a terminal never breaks the name a user searches for. A file name longer than ``width``
    keeps its end. ``sep="."``: a module path (``\u2026self_attn.q_proj``)."""
    if len(where) <= width:
        return where
    parts = where.split(sep)
    for start in range(1, len(parts)):
        shortened = ELLIPSIS + ("/" if sep == "/" else "") + sep.join(parts[start:])
        if len(shortened) <= width:
            return shortened
    return ELLIPSIS + where[len(where) - width + 1 :]


def location_label(loc: Location | None, width: int) -> str:
    """``path:line`` of a location in at most ``width`` characters (:func:`fit_path`)."""
    if loc is None:
        return "-"
    return fit_path(f"{loc.file.replace(chr(92), '/')}:{loc.line}", width)


def one_line(text: str) -> str:
    """Collapse whitespace (newlines included) so a message fits in a table cell."""
    return " ".join(text.split())


def ac_label(report: ScanReport) -> str:
    """``none``, ``full`` or ``selective (2)`` / ``selective (op)``."""
    s = report.setup
    return f"{s.ac_mode} ({s.ac_option})" if s.ac_mode == "selective" else s.ac_mode


def dynamo_label(report: ScanReport) -> str:
    """``name=value, ...`` of the recipe's Dynamo settings; ``defaults`` when there are none."""
    pairs = report.setup.dynamo_config
    return ", ".join(f"{name}={value}" for name, value in pairs) if pairs else "defaults"


def parallel_label(s: SetupInfo) -> str:
    """The resolved degrees: ``EP 8, FSDP dp_shard 64`` (``dp_replicate 2 x dp_shard 4`` with HSDP)."""
    shard = (
        f"dp_replicate {s.dp_replicate} x dp_shard {s.dp_shard}"
        if s.dp_replicate > 1
        else (f"dp_shard {s.dp_shard}")
    )
    return (
        f"EP {s.ep_degree}, FSDP {shard}"
        + (f", TP {s.tp_degree}" if s.tp_degree > 1 else "")
        + (
            f", PP {s.pp_degree} ({s.pp_schedule}, {s.pp_stages} stages, "
            f"{s.pp_microbatches} microbatch(es))"
            if s.pp_degree > 1
            else ""
        )
        + ("" if s.fsdp else " (no FSDP)")
    )


def header_fields(report: ScanReport) -> list[tuple[str, str]]:
    """(label, value) pairs describing what was scanned and how it was set up."""
    s = report.setup
    fields = [
        ("spec", report.spec),
        ("model", report.model),
        ("torch", report.torch_version),
        ("strategy", s.strategy + (f" + plan {s.plan}" if s.plan else "")),
        ("device", s.device + (" (simulated)" if s.simulated else "")),
        ("world size", str(s.world_size)),
        ("parallelism", parallel_label(s)),
        ("AC", ac_label(report)),
        ("dynamo", dynamo_label(report)),
    ]
    if s.batch_size or s.seq_len:
        fields.append(("input", f"batch {s.batch_size} x seq {s.seq_len}"))
    fields.extend(("note", note) for note in report.notes)
    return fields


def setup_line(report: ScanReport) -> str:
    """The header's essentials on one line: what was scanned, on what, set up how."""
    s = report.setup
    parts = [
        report.model,
        f"torch {report.torch_version}",
        s.strategy + (f" + plan {s.plan}" if s.plan else ""),
        f"{s.device}{' (simulated)' if s.simulated else ''} x {s.world_size}",
        parallel_label(s),
        f"AC {ac_label(report)}",
    ]
    if s.dynamo_config:
        parts.append(dynamo_label(report))
    return f"{report.spec}: " + ", ".join(parts)
