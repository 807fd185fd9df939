"""Dynamo's graph-break log (the ``graph_breaks`` logging artifact) as plain messages: what a
plain ``torch.compile`` says about breaks, for checks that compare with it (``scan/oracle.py``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

GB_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
"""The logger Dynamo writes each graph break's message to."""


class LoggedMessages(logging.Handler):
    """Every message of the graph-break log, in log order."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def graph_break_log() -> Iterator[LoggedMessages]:
    """The graph-break log on, kept off the user's stderr, its messages collected; torch's
    logging settings reset on exit."""
    import torch._logging

    handler = LoggedMessages()
    logger = logging.getLogger(GB_LOGGER)
    propagate = logger.propagate
    torch._logging.set_logs(graph_breaks=True)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        torch._logging.set_logs()
