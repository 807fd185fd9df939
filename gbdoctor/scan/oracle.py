"""The oracle check (``scan --oracle``): plain ``torch.compile`` of every layer, against the scan.

A user's way to check gbdoctor on their own model, by the method anyone would trust: build the
bare model (no training setup), run it once eagerly to record each layer's real inputs, then per
layer ``torch._dynamo.reset()``, ``torch.compile(layer, backend="eager")`` and one forward with
Dynamo's ``graph_breaks`` log on. Each statement the log names is one break (Dynamo logs a
statement again when it restarts analysis or skips the frame). Then, per layer, every statement
on one side only is a difference, explained where it is expected:

- a break the training setup put there (an FSDP/TP/EP/ZeRO hook, the load balancer): the
  oracle compiles the bare model, without the setup's hooks;
- a statement the oracle logs after the first break of an activation-checkpoint region: in
  training the region runs eagerly after that break, so Dynamo never reaches the later ones;
- a layer gbdoctor could not trace at all.

Anything else is unexpected: a place where gbdoctor and plain ``torch.compile`` disagree.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import torch

from gbdoctor import causes
from gbdoctor.capture.block import collect_block_inputs, describe_error, fresh_inputs
from gbdoctor.capture.break_log import graph_break_log
from gbdoctor.capture.locate import portable_path
from gbdoctor.records import BlockReport, Component, EventKind, ScanReport, Spec
from gbdoctor.records.oracle import OracleBlock, OracleDifference, OracleReport, OracleStatement
from gbdoctor.torch_compat import dynamo_config

_SITE = re.compile(r"in user code at (?P<file>.+):(?P<line>\d+)\s*$", re.MULTILINE)
_SETUP_COMPONENTS = frozenset(
    {
        Component.FSDP,
        Component.TP,
        Component.EP,
        Component.ZERO,
        Component.DEEPSPEED,
        Component.LOAD_BALANCING,
    }
)


def plain_compile_statements(
    block: torch.nn.Module, inputs: Any, root: str | None, flags: dict[str, Any] | None = None
) -> tuple[OracleStatement, ...]:
    """The statements plain ``torch.compile(block, backend="eager")`` logs a break at, once
    each, in log order; under the Dynamo settings ``flags`` (the training setup's)."""
    torch.compiler.reset()
    compiled = torch.compile(block, backend="eager")
    args, kwargs = fresh_inputs(inputs)
    try:
        with graph_break_log() as log, dynamo_config().patch(**(flags or {})):
            compiled(*args, **kwargs)
    finally:
        torch.compiler.reset()
    found: dict[tuple[str, int], OracleStatement] = {}
    for message in log.messages:
        site = _SITE.search(message.split("\n", 1)[0] + "\n")
        if site is None:
            continue
        file, line = portable_path(site["file"], root), int(site["line"])
        reason = message.split("Graph Break Reason:", 1)[-1]
        gb_type = causes.parse_reason(reason).gb_type
        found.setdefault((file, line), OracleStatement(file=file, line=line, gb_type=gb_type))
    return tuple(found.values())


def training_flags(report: ScanReport) -> dict[str, Any]:
    """The Dynamo settings training compiles with (the scan's setup records them): an oracle is
    plain torch.compile under the same settings, not under Dynamo's defaults."""
    return {
        name: ast.literal_eval(value)
        for name, value in report.setup.dynamo_config
        if hasattr(dynamo_config(), name)
    }


def oracle_check(spec: Spec, report: ScanReport) -> OracleReport:
    """Compile every layer of ``spec``'s bare model alone and compare with ``report``."""
    from gbdoctor.models import block_container, build_model, vocab_size
    from gbdoctor.setup.train import synthetic_batch

    torch.manual_seed(spec.training.seed)
    model = build_model(spec.model, max_seq_len=spec.training.seq_len)
    model.train()
    blocks = dict(block_container(model))
    tokens, _ = synthetic_batch(
        seed=spec.training.seed,
        step=0,
        vocab=vocab_size(model),
        local_batch=spec.capture_batch_size,
        seq_len=spec.capture_seq_len,
        rank=0,
        world_size=1,
        device="cpu",
    )
    store, remove = collect_block_inputs(model, blocks)
    try:
        # With autograd on, as the scan's training step: models adapt their layers' arguments
        # to training (a Hugging Face decoder drops its KV cache under gradient checkpointing).
        model(tokens)
    finally:
        remove()
    root = spec.root or None
    flags = training_flags(report)
    by_fqn = {b.fqn: b for b in report.blocks}
    results = []
    for fqn, block in blocks.items():
        scanned = by_fqn.get(fqn)
        if scanned is None or fqn not in store:
            continue
        breaks = sum(b.count for b in scanned.breaks)
        try:
            statements = plain_compile_statements(block, store[fqn], root, flags)
        except Exception as exc:  # noqa: BLE001 - a layer plain compile cannot run is data
            error = describe_error(exc, root)
            results.append(OracleBlock(fqn=fqn, oracle=(), gbdoctor_breaks=breaks, error=error))
            continue
        differences = compare(statements, scanned)
        results.append(
            OracleBlock(fqn=fqn, oracle=statements, gbdoctor_breaks=breaks, differences=differences)
        )
    return OracleReport(blocks=tuple(results))


def compare(
    statements: tuple[OracleStatement, ...], block: BlockReport
) -> tuple[OracleDifference, ...]:
    """Statements on one side only, each with whether it is expected and why."""
    sites: dict[str, Any] = {}
    for brk in block.breaks:
        if brk.location is None:
            continue
        sites[str(brk.location)] = brk
        if brk.via is not None:
            sites[str(brk.via)] = brk
    oracle_sites = {f"{s.file}:{s.line}": s for s in statements}
    eager_ac = any(e.kind == EventKind.REGION_EAGER for e in block.events)
    out = []

    def differ(statement: str, side: str, expected: bool, why: str) -> None:
        out.append(
            OracleDifference(statement=statement, side=side, expected=expected, explanation=why)
        )

    for site, stmt in oracle_sites.items():
        if site in sites:
            continue
        if block.error is not None:
            expected, why = True, "gbdoctor could not trace this layer at all (see its error)"
        elif eager_ac:
            expected, why = (
                True,
                "after the first break in the activation-checkpoint region the region runs "
                "eagerly in training, so Dynamo never reaches this statement there",
            )
        else:
            expected, why = False, "plain torch.compile breaks here; gbdoctor reports no break"
        differ(f"{site} {stmt.gb_type}", "oracle", expected, why)
    matched = {id(sites[s]) for s in oracle_sites if s in sites}
    for brk in block.breaks:
        if id(brk) in matched:
            continue
        where = str(brk.location) if brk.location else "(no location)"
        if brk.component in _SETUP_COMPONENTS:
            expected, why = (
                True,
                f"a break from the training setup ({brk.component}): the oracle compiles the "
                "bare model, without the setup's hooks",
            )
        elif brk.location is None:
            expected, why = True, "seen only in Dynamo's counters (no user stack to compare)"
        else:
            expected, why = False, "gbdoctor reports a break here; plain torch.compile does not"
        differ(f"{where} {brk.gb_type}", "gbdoctor", expected, why)
    return tuple(sorted(out, key=lambda d: (d.side, d.statement)))
