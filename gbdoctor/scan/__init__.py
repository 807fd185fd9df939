"""``scan``: choose an environment (in-process, spawned ranks, simulated), scan each rank,
dedupe blocks, merge ranks.

Modules, top to bottom: ``environment`` (``scan``, ``simulate_scan``) -> ``merge`` ->
``rank`` (one rank's pipeline) -> ``dedupe``, ``simulate`` (fake process group and tensors),
``job``. ``inspect`` describes the setup a scan would capture.
"""

from gbdoctor.scan.environment import scan, scan_decision, simulate_scan
from gbdoctor.scan.job import Progress, RankScan, ScanJob, strategy_for
from gbdoctor.scan.rank import build_and_setup, scan_rank, setup_info

__all__ = [
    "Progress",
    "RankScan",
    "ScanJob",
    "build_and_setup",
    "scan",
    "scan_decision",
    "scan_rank",
    "setup_info",
    "simulate_scan",
    "strategy_for",
]
