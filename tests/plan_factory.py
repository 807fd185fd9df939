"""Hand-built plan records for the report and price tests (no torch, no planner run)."""

from __future__ import annotations

from typing import Any

from gbdoctor.records import KindPlan, Plan


def make_plan(*kinds: KindPlan, **fields: Any) -> Plan:
    """A verified one-round plan of ``kinds`` for spec ``s.toml``, model ``m`` on torch 2.13.0,
    from the titan-v0.2.0 baseline strategy, without flags; ``fields`` override any of that."""
    defaults: dict[str, Any] = {
        "spec": "s.toml",
        "model": "m",
        "torch_version": "2.13.0",
        "baseline_strategy": "titan-v0.2.0",
        "flags": (),
        "flag_costs": (),
        "verified": True,
        "rounds": 1,
    }
    return Plan(kinds=kinds, **(defaults | fields))
