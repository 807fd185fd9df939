"""A scan's breaks as fixes in Accelerate's vocabulary: each an Accelerate config change, a
TrainingArguments change, or a model-code change where no config reaches it.

Read from the scan (the breaks' cause, component, whether they are inside an
activation-checkpoint region, where they are) and the run's settings, never from a model's
name. A fix that changes settings carries them patched (``Fix.patched``), so the planner can
re-scan with them and say whether the fix holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gbdoctor.frameworks.accelerate.config import AccelerateSettings
from gbdoctor.records import BlockReport, CauseId, Component, EventKind, ScanReport

ATTENTION_FILES = ("flash_attention", "flex_attention", "sdpa_attention", "sdpa")
"""transformers' attention integrations (``transformers/integrations/*_attention.py``)."""


@dataclass(frozen=True)
class Fix:
    cause: str
    """What breaks, in Accelerate's terms."""
    accelerate_config: tuple[tuple[str, Any], ...] = ()
    """(dotted key, value) of the YAML ``accelerate config`` writes."""
    training_arguments: tuple[tuple[str, Any], ...] = ()
    """(key, value) of the Trainer's TrainingArguments."""
    model_code: str = ""
    """The change in the training script or model where no config reaches it."""
    patched: AccelerateSettings | None = None
    """The settings with the fix applied (None: not a settings change)."""

    @property
    def text(self) -> str:
        parts = []
        if self.accelerate_config:
            parts.append(
                "accelerate config: "
                + ", ".join(f"{k}: {_yaml(v)}" for k, v in self.accelerate_config)
            )
        if self.training_arguments:
            parts.append(
                "TrainingArguments: " + ", ".join(f"{k}={v!r}" for k, v in self.training_arguments)
            )
        if self.model_code:
            parts.append("code: " + self.model_code)
        return f"{self.cause} -> " + "; ".join(parts)


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _eager_ac(block: BlockReport) -> bool:
    return any(e.kind == EventKind.REGION_EAGER for e in block.events)


def fixes(settings: AccelerateSettings, report: ScanReport) -> list[Fix]:
    """The fixes a scan of ``settings`` calls for, most effective first."""
    out: list[Fix] = []
    breaks = [(block, brk) for block in report.blocks for brk in block.breaks]
    fsdp_in_ac = [
        block
        for block, brk in breaks
        if brk.component == Component.FSDP and (brk.in_checkpoint or _eager_ac(block))
    ]
    if fsdp_in_ac and settings.activation_checkpointing:
        out.append(
            Fix(
                cause=(
                    f"fsdp_activation_checkpointing wraps each layer in a CheckpointWrapper that "
                    f"fully_shard then shards: FSDP2's hooks, which Dynamo skips, run inside the "
                    f"compiled checkpoint region, and the break there sends the whole layer to "
                    f"eager ({len({b.fqn for b in fsdp_in_ac})} layer(s))"
                ),
                accelerate_config=(("fsdp_config.fsdp_activation_checkpointing", False),),
                training_arguments=(
                    ("fsdp_config.activation_checkpointing", False),
                    ("gradient_checkpointing", True),
                    ("gradient_checkpointing_kwargs", {"use_reentrant": False}),
                ),
                model_code=(
                    "without the Trainer, checkpoint inside the layers instead: "
                    'model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}) '
                    "before accelerator.prepare"
                ),
                patched=dataclasses.replace(
                    settings,
                    activation_checkpointing=False,
                    gradient_checkpointing=True,
                    use_reentrant=False,
                ),
            )
        )
    in_checkpoint = [
        brk for _, brk in breaks if brk.in_checkpoint and brk.component != Component.FSDP
    ]
    if in_checkpoint and settings.gradient_checkpointing and settings.use_reentrant is not False:
        out.append(
            Fix(
                cause="the model's gradient checkpointing is reentrant (use_reentrant true), which Dynamo cannot trace",
                training_arguments=(("gradient_checkpointing_kwargs", {"use_reentrant": False}),),
                model_code='gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})',
                patched=dataclasses.replace(settings, use_reentrant=False),
            )
        )
    data_dependent = [
        (block, brk)
        for block, brk in breaks
        if brk.cause == CauseId.DATA_DEPENDENT and block.kind.startswith("moe")
    ]
    if data_dependent and not settings.regional and settings.compiles:
        out.append(
            Fix(
                cause=(
                    "the MoE layers' expert routing is data-dependent (nonzero / a loop over the "
                    "experts hit); regional compilation turns on Dynamo's capture_scalar_outputs"
                ),
                accelerate_config=(("dynamo_config.dynamo_use_regional_compilation", True),),
                training_arguments=(
                    ("(launch environment) ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "true"),
                ),
                patched=dataclasses.replace(settings, regional=True),
            )
        )
    elif data_dependent:
        where = data_dependent[0][1].location
        out.append(
            Fix(
                cause="the MoE layers' expert loop is data-dependent even with capture_scalar_outputs",
                model_code=(
                    f"at {where}: dispatch the experts with one grouped matmul "
                    "(transformers' grouped_mm experts implementation) instead of a Python loop over hit experts"
                ),
            )
        )
    attention = [
        brk
        for _, brk in breaks
        if brk.location is not None and any(name in brk.location.file for name in ATTENTION_FILES)
    ]
    if attention:
        out.append(
            Fix(
                cause=f"the attention implementation breaks the graph ({attention[0].gb_type} at {attention[0].location})",
                model_code='load the model with attn_implementation="sdpa" (or set it in config.json)',
            )
        )
    return out


def fixed_settings(settings: AccelerateSettings, found: list[Fix]) -> AccelerateSettings:
    """``settings`` with every settings fix applied, in order (each fix's changes are read
    against ``settings``, so a later fix does not undo an earlier one)."""
    changed: dict[str, Any] = {}
    for fix in found:
        if fix.patched is not None:
            for f in dataclasses.fields(settings):
                value = getattr(fix.patched, f.name)
                if value != getattr(settings, f.name):
                    changed[f.name] = value
    return dataclasses.replace(settings, **changed)
