"""The one frozen-record decorator every record of gbdoctor uses.

A record is a frozen, keyword-only, slotted dataclass: immutable once built (safe to share
between formatters and to send to spawned ranks), built by name (field order is free to grow),
and serialized field by field by :mod:`gbdoctor.records.io`. Field names are the JSON contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


# dataclass_transform tells type checkers what the decorator makes of a class (keyword-only,
# frozen fields), so that building or changing a record is checked field by field.
@dataclass_transform(frozen_default=True, kw_only_default=True)
def record(cls: type[T]) -> type[T]:
    """``@record``: ``dataclass(frozen=True, kw_only=True, slots=True)``."""
    return dataclass(frozen=True, kw_only=True, slots=True)(cls)
