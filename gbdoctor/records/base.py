"""The one frozen-record decorator every record of gbdoctor uses.

A record is a frozen, keyword-only, slotted dataclass: immutable once built (safe to share
between formatters and to send to spawned ranks), built by name (field order is free to grow),
and serialized field by field by :mod:`gbdoctor.records.io`. Field names are the JSON contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def record(cls: type[T]) -> type[T]:
    """``@record``: ``dataclass(frozen=True, kw_only=True, slots=True)``."""
    return dataclass(frozen=True, kw_only=True, slots=True)(cls)
