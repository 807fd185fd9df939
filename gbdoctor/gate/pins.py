"""The Dynamo settings a baseline pins, applied to every gate scan against it."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from gbdoctor.torch_compat import dynamo_config

PINNED_DYNAMO = ("nested_graph_breaks",)
"""Dynamo settings a baseline pins: their defaults move between torch releases and change
where and how often Dynamo breaks (``nested_graph_breaks`` turns a break in a nested call into
breaks in every enclosing frame or none), so counts are only comparable under the same value."""

PINS_ENV = "GBDOCTOR_DYNAMO_PINS"
"""JSON object of pinned Dynamo settings, inherited by spawned ranks
(``setup.rank_protocol.apply_dynamo_pins``)."""


def current_pins() -> tuple[tuple[str, Any], ...]:
    """This torch's values of the pinned settings it knows."""
    config = dynamo_config()
    return tuple(sorted((k, getattr(config, k)) for k in PINNED_DYNAMO if hasattr(config, k)))


@contextlib.contextmanager
def pinned_dynamo(pins: tuple[tuple[str, Any], ...]) -> Iterator[tuple[str, ...]]:
    """Scan under the baseline's pinned settings (here and in spawned ranks); yields the pinned
    names this torch does not know (the counts may then differ for that reason)."""
    config = dynamo_config()
    known = {k: v for k, v in pins if hasattr(config, k)}
    unknown = tuple(k for k, _ in pins if k not in known)
    old_env = os.environ.get(PINS_ENV)
    os.environ[PINS_ENV] = json.dumps(known, sort_keys=True)
    try:
        with config.patch(**known):
            yield unknown
    finally:
        if old_env is None:
            os.environ.pop(PINS_ENV, None)
        else:
            os.environ[PINS_ENV] = old_env
