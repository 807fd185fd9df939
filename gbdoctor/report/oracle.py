"""Lay out an :class:`OracleReport` (``scan --oracle``): the agreement count, then each layer's
differences from plain ``torch.compile``."""

from __future__ import annotations

from gbdoctor.records.oracle import OracleReport


def render_oracle(result: OracleReport) -> str:
    """Lines for the terminal: the agreement count, then each layer's differences."""
    lines = [
        f"oracle (plain torch.compile per layer, graph-break log): {result.agreeing}/"
        f"{len(result.blocks)} layers agree with the scan"
    ]
    for block in result.blocks:
        if block.error is not None:
            lines.append(f"  {block.fqn}: plain torch.compile failed: {block.error}")
            continue
        if not block.differences:
            continue
        verdict = "agrees" if block.agrees else "DIFFERS"
        lines.append(
            f"  {block.fqn}: {verdict} (oracle {len(block.oracle)} statement(s), scan "
            f"{block.gbdoctor_breaks} break(s))"
        )
        for diff in block.differences:
            mark = "expected" if diff.expected else "UNEXPECTED"
            lines.append(f"    {mark}: only {diff.side}: {diff.statement}: {diff.explanation}")
    return "\n".join(lines)
