"""The oracle of the Accelerate scans: the same model prepared by accelerate's own functions in
``Accelerator._prepare_fsdp2``'s order, on a one-rank gloo group, with one block compiled at a
time (a fresh model and a fresh Dynamo per block: Dynamo caches the code objects layers share,
so a second compiled layer would log nothing), one training step, and Dynamo's graph-break log.

Independent of gbdoctor's setup code: the plugins are built here from each case's keyword
arguments (not from gbdoctor's config reader), the steps are accelerate's functions called as
``_prepare_fsdp2`` calls them, and the breaks are read from the log's own text.
"""

from __future__ import annotations

import logging
import os
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._dynamo
import torch._logging
import torch.distributed as dist

GB_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
FSDP_DIR = os.path.join("torch", "distributed", "fsdp")


@dataclass(frozen=True)
class Case:
    """One Accelerate setup, as the keyword arguments of accelerate's own plugins."""

    config: str
    """The fixture config file (fixtures/accelerate/) the scan reads."""
    ac: bool
    regional: bool


@dataclass
class OracleBlock:
    statements: set[tuple[str, str, int]] = field(default_factory=set)
    """(gb_type, file base name, line) of each break the log names."""
    graphs: int = 0


def _gb_type(message: str) -> str:
    body = message.split("Graph Break Reason:", 1)[-1].split("User code traceback:", 1)[0]
    lines = [line.strip() for line in body.splitlines()]
    return next(line for line in lines[1:] if line and not line.endswith(":"))


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _accelerator(case: Case, model: torch.nn.Module) -> Any:
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        activation_checkpointing=case.ac,
        reshard_after_forward=True,
    )
    return types.SimpleNamespace(
        state=types.SimpleNamespace(fsdp_plugin=plugin),
        mixed_precision="no",
        torch_device_mesh=None,
        parallelism_config=None,
        is_main_process=True,
        device=torch.device("cpu"),
    )


def _prepared(
    case: Case, model_dir: str, target: str, backend: Any
) -> tuple[torch.nn.Module, dict]:
    """accelerate's steps on a fresh model; only ``target`` stays compiled."""
    from accelerate.utils.fsdp_utils import fsdp2_apply_ac, fsdp2_prepare_model
    from accelerate.utils.other import compile_regions_fsdp2
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(model_dir), dtype=torch.float32
    )
    accelerator = _accelerator(case, model)
    accelerator.state.fsdp_plugin.set_auto_wrap_policy(model)
    if case.ac:
        model = fsdp2_apply_ac(accelerator, model)
    flags: dict[str, Any] = {}
    outer = model.get_submodule(target)
    if case.regional:
        flags = {
            "capture_scalar_outputs": True,
            "skip_fwd_side_effects_in_bwd_under_checkpoint": True,
        }
        compile_regions_fsdp2(model, backend=backend)
        for module in model.modules():
            if module is not outer:
                module._compiled_call_impl = None  # one region at a time (module docstring)
    else:
        outer.compile(backend=backend)  # the whole-model compile, seen one block at a time
    return fsdp2_prepare_model(accelerator, model), flags


def oracle(case: Case, model_dir: str, fqns: list[str]) -> dict[str, OracleBlock]:
    """Per block: the breaks Dynamo's log names and the graphs compiled, one training step."""
    out: dict[str, OracleBlock] = {}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    log = _Log()
    logger = logging.getLogger(GB_LOGGER)
    torch._logging.set_logs(graph_breaks=True)
    logger.addHandler(log)
    logger.propagate = False
    try:
        for fqn in fqns:
            block = out[fqn] = OracleBlock()

            def count(gm: torch.fx.GraphModule, example: Any, block: OracleBlock = block) -> Any:
                block.graphs += 1
                return gm.forward

            torch._dynamo.reset()
            model, flags = _prepared(case, model_dir, fqn, count)
            log.messages.clear()
            with torch._dynamo.config.patch(**flags):
                tokens = torch.randint(0, model.config.vocab_size, (2, 32))
                model(tokens).logits.float().square().mean().backward()
            for message in log.messages:
                first = message.splitlines()[0]
                if "Graph break in user code at " not in first:
                    continue
                path, _, line = first.split("Graph break in user code at ", 1)[1].rpartition(":")
                where = "fsdp" if FSDP_DIR in path else os.path.basename(path)
                block.statements.add((_gb_type(message), where, int(line)))
    finally:
        logger.removeHandler(log)
        logger.propagate = True
        torch._logging.set_logs()
        torch._dynamo.reset()
        dist.destroy_process_group()
    return out
