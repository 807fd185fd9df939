"""Which eager time belongs to which graph break: Dynamo's break log + the profiler's regions.

Two pieces, both reading Dynamo's own records (this is ``capture/``, the only stage that does):

* :func:`watch_break_frames` records, for every graph break Dynamo logs, the frame id of the
  compile it ended (``[F/C]`` in Dynamo's logs) and the user traceback. A frame compile ends at
  its first break (Dynamo compiles the graph so far and a resume function for the rest), so a
  frame id names exactly one break of the code.
* :func:`eager_us_by_frame` reads a profiled step: every ``Torch-Compiled Region: F/C`` event
  spans the frame's whole evaluation, and what runs inside it but outside a compiled graph
  (``CompiledFunction``, ``## Call CompiledFxGraph``) and outside a nested region is the break:
  the statement Dynamo could not trace, run eagerly (a hooked module's FSDP all-gather, EP's
  ``.tolist()`` and all-to-all, a whole checkpoint region that fell back), plus what the break
  adds around it (the resume function's guard check, a second graph call's bookkeeping).
  Measured on torch 2.13: the resume function's region is nested in the region of the frame
  whose break it resumes.
* The backward of that eager work: every op run eagerly in a break's region records the
  autograd sequence number of the node it created, and the autograd engine's
  ``autograd::engine::evaluate_function: <Node>`` event of that node carries the same number
  (what ``torch.profiler`` links forward and backward ops with), so its time is charged to the
  same break. Compiled graphs' backward (``CompiledFunctionBackward``) is not eager and is left
  out, as their forward is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gbdoctor.causes import parse_graph_break_log
from gbdoctor.records import Location

GRAPH_BREAKS_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
_ARTIFACT = "graph_breaks"
KINETO_LOG_LEVEL = "KINETO_LOG_LEVEL"
QUIET_KINETO = "6"
"""Kineto's log level above its USDT/STAGE lines (measured on torch 2.13: 5 still prints them)."""
_REGION = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)$")
_COMPILED_GRAPH = ("CompiledFunction", "## Call CompiledFxGraph")
_BACKWARD_NODE = "autograd::engine::evaluate_function: "
_COMPILED_BACKWARD = _BACKWARD_NODE + "CompiledFunctionBackward"


@dataclass
class BreakFrames(logging.Handler):
    """Frame id -> the user traceback (outermost first) of the break that ended that frame."""

    frames: dict[int, tuple[Location, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        logging.Handler.__init__(self, logging.DEBUG)

    def __hash__(self) -> int:  # logging keeps handlers in sets
        return id(self)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from torch._guards import CompileContext

            compile_id = CompileContext.current_compile_id()
            parsed = parse_graph_break_log(record.getMessage())
        except Exception:  # noqa: BLE001 - a malformed record never breaks training
            return
        if compile_id is None or parsed is None or compile_id.frame_id is None or not parsed[1]:
            return
        # A frame's recompiles log its break again, some without the user traceback (measured
        # on torch 2.13): the first record that has one holds.
        self.frames.setdefault(int(compile_id.frame_id), parsed[1])

    def frames_at(self, location: Location) -> tuple[int, ...]:
        """Frame ids whose break passed through ``location`` (a scan break's innermost user
        frame: its file is a path suffix, so scans' portable paths match absolute ones)."""
        return tuple(
            sorted(
                frame
                for frame, stack in self.frames.items()
                if any(
                    loc.line == location.line and _same_file(loc.file, location.file)
                    for loc in stack
                )
            )
        )


def _same_file(absolute: str, portable: str) -> bool:
    absolute, portable = absolute.replace("\\", "/"), portable.replace("\\", "/")
    return absolute == portable or absolute.endswith("/" + portable.lstrip("/"))


@contextlib.contextmanager
def watch_break_frames() -> Iterator[BreakFrames]:
    """Record the frame of every graph break logged inside the block (keeps them off stderr)."""
    from torch._logging._internal import log_state

    watch = BreakFrames()
    logger = logging.getLogger(GRAPH_BREAKS_LOGGER)
    was_enabled = log_state.is_artifact_enabled(_ARTIFACT)
    old_level, old_propagate = logger.level, logger.propagate
    log_state.enable_artifact(_ARTIFACT)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(watch)
    try:
        yield watch
    finally:
        logger.removeHandler(watch)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
        if not was_enabled:
            log_state.artifact_names.discard(_ARTIFACT)


def eager_us_by_frame(
    events: Any, break_frames: set[int], *, backward: bool = True
) -> dict[int, float]:
    """Break frame id -> microseconds run inside compiled regions outside any compiled graph
    (see the module doc), summed over the step, from ``torch.profiler.profile(...).events()``,
    plus (``backward``) the backward of that eager work. Python time counts too (a region's wall
    time is what is subtracted from), so a break's eager Python work is seen without a stack
    tracer.

    A region whose frame ended at no break of its own (a resume function, or a module's forward
    that runs as a frame of its own because a break in its caller sent the call eager) is
    charged to the nearest enclosing region whose frame did: the break that made it run that
    way. Regions with no such ancestor are left out."""
    totals: dict[int, float] = {}
    frame_of_node: dict[int, int] = {}  # autograd sequence number of an eager node -> frame
    for event in events:
        region = _REGION.match(event.name)
        if region is None:
            continue
        frame = _charged_frame(event, break_frames)
        if frame is None:
            continue
        eager = float(event.time_range.elapsed_us()) - _inner_us(event)
        totals[frame] = totals.get(frame, 0.0) + max(0.0, eager)
        for number in _eager_sequence_numbers(event):
            frame_of_node[number] = frame
    if backward:
        for event in events:
            frame = frame_of_node.get(getattr(event, "sequence_nr", -1))
            if (
                frame is not None
                and event.name.startswith(_BACKWARD_NODE)
                and not event.name.startswith(_COMPILED_BACKWARD)
                and not _inside_backward_node(event)
            ):
                totals[frame] = totals.get(frame, 0.0) + float(event.time_range.elapsed_us())
    return totals


def _eager_sequence_numbers(event: Any) -> set[int]:
    """Autograd sequence numbers of the ops run directly (not in a compiled graph or a nested
    region) below a region event."""
    numbers: set[int] = set()
    for child in event.cpu_children:
        if _REGION.match(child.name) or child.name.startswith(_COMPILED_GRAPH):
            continue
        if getattr(child, "sequence_nr", -1) >= 0:
            numbers.add(int(child.sequence_nr))
        numbers |= _eager_sequence_numbers(child)
    return numbers


def _inside_backward_node(event: Any) -> bool:
    """Whether an enclosing event is a backward node too (its time already holds this one)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(_BACKWARD_NODE):
            return True
        parent = parent.cpu_parent
    return False


def _charged_frame(region: Any, break_frames: set[int]) -> int | None:
    event = region
    while event is not None:
        match = _REGION.match(event.name)
        if match is not None and int(match.group(1)) in break_frames:
            return int(match.group(1))
        event = event.cpu_parent
    return None


def _inner_us(event: Any) -> float:
    """Time of the compiled graphs and nested regions below ``event`` (outermost only)."""
    total = 0.0
    for child in event.cpu_children:
        if _REGION.match(child.name) or child.name.startswith(_COMPILED_GRAPH):
            total += float(child.time_range.elapsed_us())
        else:
            total += _inner_us(child)
    return total


def eager_us_of(step: Any, device: str, break_frames: set[int]) -> dict[int, float]:
    """Run ``step()`` once under the profiler and return :func:`eager_us_by_frame` of it. On
    CUDA the regions' times are host times (what the break keeps the CPU busy with); the
    device timeline is not read."""
    from torch.profiler import ProfilerActivity, profile

    # Kineto (torch 2.13) prints "USDT: ... profiler_start/profiler_stop" on stderr for every
    # profiled step at its default log level; 6 keeps it quiet unless the user set a level.
    os.environ.setdefault(KINETO_LOG_LEVEL, QUIET_KINETO)
    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    # One cycle, so keeping events across cycles changes nothing; without it torch (2.12, 2.13)
    # warns once per process that "Profiler clears events at the end of each cycle", which every
    # rank of a price printed.
    with profile(activities=activities, acc_events=True) as prof:
        step()
    return eager_us_by_frame(prof.events(), break_frames)
