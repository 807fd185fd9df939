"""``plan``: a per-block-kind compile and wrapping plan, proven by re-scanning before it is
offered (``planner``), and its emitters for torchtitan, DeepSpeed and plain Python (``emit``).
Records are in ``records.plan``."""

from gbdoctor.plan.planner import (
    PriorScan,
    dump_plan,
    load_plan,
    plan_strategy,
    propose_plan,
    read_plan,
)
from gbdoctor.records import KindPlan, Plan

__all__ = [
    "KindPlan",
    "Plan",
    "PriorScan",
    "dump_plan",
    "load_plan",
    "plan_strategy",
    "propose_plan",
    "read_plan",
]
