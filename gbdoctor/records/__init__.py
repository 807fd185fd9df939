"""The ground floor: every frozen record, the one ``record`` decorator, the StrEnums of every
vocabulary in gbdoctor's JSON, and the one JSON reader/writer (``records.io``).

Nothing here imports torch or any other gbdoctor stage (only ``gbdoctor.errors``, itself a
leaf, for the error a malformed file raises), so every stage above can import it.
"""

from gbdoctor.records.base import record
from gbdoctor.records.enums import (
    ACMode,
    CauseId,
    CompileMode,
    Component,
    EventKind,
    Framework,
    ModeStatus,
    OutputFormat,
    Severity,
)
from gbdoctor.records.gate import (
    BASELINE_SCHEMA_VERSION,
    SEVERITIES,
    Baseline,
    Finding,
    GateResult,
    KindCounts,
)
from gbdoctor.records.plan import PLAN_SCHEMA_VERSION, DeepSpeedPlan, KindPlan, Plan
from gbdoctor.records.run import LOSS_RTOL, RUN_SCHEMA_VERSION, ModeResult, RunReport
from gbdoctor.records.scan import (
    READABLE_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    BlockKind,
    BlockReport,
    BlockSetup,
    Break,
    Event,
    HookInfo,
    Location,
    RawBreak,
    Recompile,
    ScanReport,
    SetupInfo,
    SetupReport,
)
from gbdoctor.records.spec import (
    ACSpec,
    CompileSpec,
    DeepSpeedSpec,
    ModelSpec,
    ParallelSpec,
    Spec,
    ToolSpec,
    TrainingSpec,
)
from gbdoctor.records.summary import KindSummary, ScanSummary

__all__ = [
    "READABLE_SCHEMA_VERSIONS",
    "Framework",
    "DeepSpeedSpec",
    "DeepSpeedPlan",
    "ACMode",
    "ACSpec",
    "BASELINE_SCHEMA_VERSION",
    "Baseline",
    "BlockKind",
    "BlockReport",
    "BlockSetup",
    "Break",
    "CauseId",
    "CompileMode",
    "CompileSpec",
    "Component",
    "Event",
    "EventKind",
    "Finding",
    "GateResult",
    "HookInfo",
    "KindCounts",
    "KindPlan",
    "KindSummary",
    "LOSS_RTOL",
    "Location",
    "ModeResult",
    "ModeStatus",
    "ModelSpec",
    "OutputFormat",
    "PLAN_SCHEMA_VERSION",
    "ParallelSpec",
    "Plan",
    "RUN_SCHEMA_VERSION",
    "RawBreak",
    "Recompile",
    "RunReport",
    "SCHEMA_VERSION",
    "SEVERITIES",
    "ScanReport",
    "ScanSummary",
    "Severity",
    "SetupInfo",
    "SetupReport",
    "Spec",
    "ToolSpec",
    "TrainingSpec",
    "record",
]
