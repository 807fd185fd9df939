"""``--format junit``: JUnit XML for CI test reporters.

One ``testsuite`` per spec, one ``testcase`` per block (name = FQN, classname = kind) and one
``failure`` per break, event or trace error, carrying the cause, gb_type, location and fix hint.
Attributes are set in a fixed order and nothing time-dependent is written, so output is stable.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gbdoctor.records import BlockReport, Break, Event, ScanReport
from gbdoctor.report.layout import ac_label, dynamo_label, one_line
from gbdoctor.summary import fix_hint

__all__ = ["JunitFormat", "element", "render_junit", "testsuite", "xml_safe", "xml_text"]


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_safe(value: object) -> str:
    """``str(value)`` without the control characters XML 1.0 cannot carry."""
    return _NOT_XML.sub("?", str(value))


def xml_text(root: ET.Element) -> str:
    """Indented XML with a declaration and a trailing newline."""
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def element(tag: str, *pairs: tuple[str, object]) -> ET.Element:
    """An element whose attributes keep the given order (ElementTree writes insertion order)."""
    el = ET.Element(tag)
    for name, value in pairs:
        el.set(name, xml_safe(value))
    return el


def _lines(*pairs: tuple[str, str]) -> str:
    return xml_safe("\n".join(f"{name}: {value}" for name, value in pairs if value))


def _break_failure(brk: Break) -> ET.Element:
    where = str(brk.location) if brk.location else "unknown location"
    el = element(
        "failure",
        ("type", brk.cause),
        ("message", f"{brk.cause}: {one_line(brk.gb_type)} at {where}"),
    )
    el.text = _lines(
        ("cause", brk.cause),
        ("gb_type", one_line(brk.gb_type)),
        ("gb_id", brk.gb_id or ""),
        ("location", where),
        ("module", brk.module),
        ("in_checkpoint", str(brk.in_checkpoint).lower()),
        ("count", str(brk.count)),
        ("fix", fix_hint(brk.cause)),
    )
    return el


def _event_failure(event: Event) -> ET.Element:
    where = str(event.location) if event.location else ""
    el = element(
        "failure",
        ("type", event.kind),
        ("message", f"{event.kind} in {event.module}" + (f" at {where}" if where else "")),
    )
    el.text = _lines(
        ("event", event.kind),
        ("module", event.module),
        ("gb_type", one_line(event.gb_type)),
        ("location", where),
        ("detail", one_line(event.detail)),
    )
    return el


def _error_failure(error: str) -> ET.Element:
    el = element("failure", ("type", "error"), ("message", f"error: {one_line(error)}"))
    el.text = _lines(("cause", "error"), ("detail", error), ("fix", fix_hint("error")))
    return el


def _testcase(block: BlockReport) -> ET.Element:
    case = element("testcase", ("name", block.fqn), ("classname", block.kind))
    for brk in block.breaks:
        case.append(_break_failure(brk))
    for event in block.events:
        case.append(_event_failure(event))
    if block.error is not None:
        case.append(_error_failure(block.error))
    if block.cudagraphs is not None:
        # Readiness is advice, not a failure: a property of the test case.
        props = ET.SubElement(case, "properties")
        props.append(
            element("property", ("name", "cudagraphs"), ("value", block.cudagraphs.summary))
        )
    return case


def testsuite(report: ScanReport) -> ET.Element:
    """The ``testsuite`` element of one scan."""
    cases = [_testcase(block) for block in report.blocks]
    failing = sum(1 for case in cases if any(child.tag != "properties" for child in case))
    suite = element(
        "testsuite",
        ("name", report.spec),
        ("tests", len(cases)),
        ("failures", failing),
        ("errors", 0),
        ("skipped", 0),
    )
    props = ET.SubElement(suite, "properties")
    s = report.setup
    for name, value in (
        ("model", report.model),
        ("torch_version", report.torch_version),
        ("strategy", s.strategy),
        ("world_size", s.world_size),
        ("ep_degree", s.ep_degree),
        ("ac", ac_label(report)),
        ("dynamo", dynamo_label(report)),
    ):
        props.append(element("property", ("name", name), ("value", value)))
    suite.extend(cases)
    return suite


def render_junit(report: ScanReport) -> str:
    """JUnit XML of one scan (a ``testsuites`` root holding one ``testsuite``)."""
    suite = testsuite(report)
    root = element(
        "testsuites",
        ("name", "gbdoctor scan"),
        ("tests", suite.get("tests")),
        ("failures", suite.get("failures")),
        ("errors", 0),
    )
    root.append(suite)
    return xml_text(root)


class JunitFormat:
    """Formatter for ``--format junit``."""

    def render(self, report: ScanReport) -> str:
        return render_junit(report)
