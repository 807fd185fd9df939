"""The one format registry (``report/formats.py``): every format of every printout renders
from the stored goldens, and every command's ``--format`` choices, help and check come from it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from repo_paths import FIXTURES
from scan_factory import llama4_after_new_break, llama4_before

from gbdoctor.errors import SpecError
from gbdoctor.records import (
    BreakPrice,
    Counterfactual,
    KindPrice,
    PriceReport,
    ScanReport,
    SetupReport,
)
from gbdoctor.records.enums import OutputFormat
from gbdoctor.records.io import load_record
from gbdoctor.records.scan import SCHEMA_VERSION as SCAN_SCHEMA_VERSION
from gbdoctor.report.causes_table import CausesPrintout
from gbdoctor.report.formats import (
    RENDERERS,
    Printout,
    RenderOptions,
    check_format,
    format_help,
    formats_of,
    render,
)
from gbdoctor.report.gate_formats import GatePrintout
from gbdoctor.report.html import Results, load_document
from gbdoctor.report.plan_table import PlanPrintout
from gbdoctor.summary import summarize

GOLDEN = FIXTURES / "golden"
RUN_JSON = Path(__file__).resolve().parent / "test_html_run_llama4_debug.json"


def _golden(kind: str) -> list[Path]:
    paths = sorted((GOLDEN / kind).glob("*.json"))
    assert paths, f"no golden under {GOLDEN / kind}"
    return paths


def _scans() -> list[ScanReport]:
    return [load_document(path).record for path in _golden("scan")]


def _priced(report: ScanReport) -> ScanReport:
    """A golden scan with a price for each kind and each of its distinct breaks (the numbers
    made up: a renderer lays them out, it does not check them)."""
    rows = summarize(report).kinds
    kinds = tuple(
        KindPrice(
            kind=row.kind,
            layers=len(row.layers),
            counterfactual=Counterfactual.PLAN_FIX,
            recipe="block fullgraph",
            ms_per_step=10.0 + i,
            spread_ms=(9.0 + i, 11.0 + i),
            share=0.1,
        )
        for i, row in enumerate(rows)
    )
    breaks = tuple(
        BreakPrice(
            kind=row.kind,
            cause=brk.cause,
            gb_type=brk.gb_type,
            gb_id=brk.gb_id,
            location=str(brk.location) if brk.location else "",
            module=brk.module,
            ms_per_step=5.0,
            spread_ms=(4.0, 6.0),
            share=0.05,
        )
        for row in rows
        for brk in row.break_records
    )
    price = PriceReport(
        backend="inductor", device="cpu", device_name="cpu", world_size=report.setup.world_size,
        rounds=2, warmup=1, steps=2, batch_size=1, seq_len=16, step_ms=100.0,
        step_spread_ms=(95.0, 105.0), kinds=kinds, breaks=breaks,
    )  # fmt: skip
    return replace(report, price=price)


def _plans() -> list[PlanPrintout]:
    plans = [load_document(path).record for path in _golden("plan")]
    return [PlanPrintout(plan, configs=lambda: (("json", "{}\n"),)) for plan in plans]


def _gates() -> list[GatePrintout]:
    from gbdoctor.gate import baseline_from_reports, check_gate, diff_reports

    before, after = llama4_before(), llama4_after_new_break()
    stored = [load_document(path).record for path in _golden("diff")]
    return [
        *(GatePrintout(result, title="gbdoctor diff") for result in stored),
        GatePrintout(diff_reports(before, after), title="gbdoctor diff"),
        GatePrintout(
            check_gate([after], baseline_from_reports([before])),
            scans=(after,),
            source_roots=(FIXTURES,),
        ),
    ]


def _inspects() -> list[SetupReport]:
    return [
        load_record(SetupReport, json.loads(path.read_text(encoding="utf-8")), path.name)
        for path in _golden("inspect")
    ]


def _timelines() -> list[Any]:
    from gbdoctor.records.timeline import StepCompile, TimelineReport, TimelineStep
    from gbdoctor.timeline.pattern import findings

    frame = "forward at m.py:3"
    steps = [
        TimelineStep(
            step=i,
            time_s=0.1,
            forward_s=0.05,
            backward_s=0.03,
            optimizer_s=0.0,
            collective_s=0.0,
            collective_calls=0,
            compile_s=0.0,
            tokens=128,
            boundary=None,
            compiles=(StepCompile(frame=frame, attempt=i, compile_s=0.5, guard="self.x == 1"),),
            eager_frames=(),
        )  # fmt: skip
        for i in range(4)
    ]
    found, periods = findings(steps, 1, 8)
    return [
        TimelineReport(
            schema_version=1,
            spec="s.toml",
            framework="torchtitan",
            mode="as-is",
            strategy="block",
            backend="aot_eager",
            device="cpu",
            world_size=1,
            torch_version="2.13.0",
            recompile_limit=8,
            seq_lens=(64,),
            batch_size=2,
            steps=tuple(steps),
            frames=(),
            warmup_steps=1,
            findings=tuple(found),
            periods=tuple(periods),
        )  # fmt: skip
    ]


def _results() -> list[Results]:
    files = [_golden("scan")[0], _golden("plan")[0], RUN_JSON, _golden("diff")[0]]
    return [Results(tuple(load_document(path) for path in files), source_roots=(FIXTURES,))]


RECORDS: dict[Printout, Callable[[], list[Any]]] = {
    Printout.SCAN: _scans,
    Printout.PRICE: lambda: [_priced(report) for report in _scans()],
    Printout.PLAN: _plans,
    Printout.RUN: lambda: [load_document(RUN_JSON).record],
    Printout.GATE: _gates,
    Printout.TIMELINE: _timelines,
    Printout.INSPECT: _inspects,
    Printout.CAUSES: lambda: [
        CausesPrintout(),
        CausesPrintout("fsdp-hook"),
        CausesPrintout(cudagraphs=True),
    ],
    Printout.REPORT: _results,
}


def test_every_printout_has_records_to_render() -> None:
    assert set(RECORDS) == set(Printout) == set(RENDERERS)


@pytest.mark.parametrize(
    ("printout", "fmt"),
    [(p, f) for p in Printout for f in formats_of(p)],
    ids=lambda v: str(v),
)
def test_every_format_of_every_printout_renders(printout: Printout, fmt: OutputFormat) -> None:
    for record in RECORDS[printout]():
        for options in (RenderOptions(), RenderOptions(details=False, width=80)):
            text = render(printout, fmt, record, options)
            assert text.strip(), (printout, fmt, record)
            assert "\x1b" not in text  # plain text: no terminal escapes in a file
            if fmt == OutputFormat.JSON:
                assert isinstance(json.loads(text), dict)
            elif fmt == OutputFormat.JUNIT:
                assert ET.fromstring(text).tag == "testsuites"
            elif fmt == OutputFormat.HTML:
                assert text.lstrip().lower().startswith("<!doctype html>")


def test_json_renders_the_stored_goldens_byte_for_byte() -> None:
    """The registry's JSON renderers write what ``scan`` and ``diff`` stored as goldens (those
    of the current schema: an older one is stored to check its reader)."""
    for path in _golden("scan"):
        stored = path.read_text(encoding="utf-8")
        if json.loads(stored)["schema_version"] != SCAN_SCHEMA_VERSION:
            continue
        assert render(Printout.SCAN, "json", load_document(path).record) == stored, path
    for path in _golden("diff"):
        stored = path.read_text(encoding="utf-8")
        printout = GatePrintout(load_document(path).record, title="gbdoctor diff")
        assert render(Printout.GATE, "json", printout) == stored, path


def test_an_unknown_format_is_bad_input_naming_the_valid_ones() -> None:
    for printout in Printout:
        with pytest.raises(SpecError, match="unknown format 'yaml'") as err:
            render(printout, "yaml", None)
        assert err.value.hint == f"valid formats: {', '.join(formats_of(printout))}"
    # A format another printout has is still unknown to this one.
    with pytest.raises(SpecError, match="unknown --format 'junit'"):
        check_format(Printout.RUN, "junit", named="--format")
    assert check_format(Printout.RUN, "markdown") is OutputFormat.MARKDOWN


COMMAND_PRINTS = {
    "scan": Printout.SCAN,
    "price": Printout.PRICE,
    "plan": Printout.PLAN,
    "run": Printout.RUN,
    "gate": Printout.GATE,
    "diff": Printout.GATE,
    "timeline": Printout.TIMELINE,
    "inspect": Printout.INSPECT,
    "causes": Printout.CAUSES,
}


def test_every_commands_format_option_comes_from_the_registry() -> None:
    import typer.main

    from gbdoctor.cli.root import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    with_format = {
        name
        for name, command in commands.items()
        if any(param.name == "format" for param in command.params)
    }
    assert with_format == set(COMMAND_PRINTS)
    for name, printout in COMMAND_PRINTS.items():
        (option,) = [p for p in commands[name].params if p.name == "format"]
        assert option.help == format_help(printout), name
        assert option.default in formats_of(printout), name


@pytest.mark.parametrize(("command", "printout"), sorted(COMMAND_PRINTS.items()))
def test_preflight_checks_the_format_against_the_commands_printout(
    command: str, printout: Printout
) -> None:
    from gbdoctor.cli.output import preflight

    for fmt in formats_of(printout):
        preflight(fmt, printout)
    for fmt in set(OutputFormat) - set(formats_of(printout)):
        with pytest.raises(SpecError, match=f"unknown --format '{fmt}'"):
            preflight(fmt, printout)
