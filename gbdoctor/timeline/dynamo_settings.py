"""``--dynamo-config NAME=VALUE`` for a timeline: typed against ``torch._dynamo.config``'s own
settings before any rank starts, and applied around a rank's steps (``timeline.train``)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.records.bounds import MAX_INT


def _parse_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def typed_dynamo_settings(settings: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs typed against ``torch._dynamo.config``'s own settings: the name must
    be one of them (``__class__`` is an attribute, not a setting) and the value must have the
    type of its default. SpecError naming the setting otherwise, before any rank starts (issue
    45: ``recompile_limit=abc`` failed inside the ranks)."""
    from gbdoctor.torch_compat import dynamo_config

    defaults = dynamo_config().get_config_copy()
    values = {}
    for name, text in settings:
        if name not in defaults:
            raise SpecError(
                f"--dynamo-config {name[:60]}: not a torch._dynamo.config setting",
                hint='the settings are listed by `python -c "import torch._dynamo; '
                'print(sorted(torch._dynamo.config.get_config_copy()))"`',
            )
        values[name] = _typed_setting(name, text, defaults[name])
    return values


def _typed_setting(name: str, text: str, default: Any) -> Any:
    shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
    kind = type(default)
    low = text.strip().lower()
    if kind is bool:
        if low in ("true", "false", "1", "0"):
            return low in ("true", "1")
        raise SpecError(f"--dynamo-config {name}={shown}: expected true or false")
    if kind is int:
        try:
            value = int(text)
        except ValueError:
            raise SpecError(f"--dynamo-config {name}={shown}: expected an integer") from None
        if abs(value) > MAX_INT:
            raise SpecError(f"--dynamo-config {name}={shown}: out of range (at most {MAX_INT})")
        return value
    if kind is float:
        try:
            number = float(text)
        except ValueError:
            raise SpecError(f"--dynamo-config {name}={shown}: expected a number") from None
        if not math.isfinite(number):
            raise SpecError(f"--dynamo-config {name}={shown}: expected a finite number")
        return number
    if kind is str:
        return text
    if default is None:  # an optional setting: no type to hold it to
        return _parse_value(text)
    raise SpecError(
        f"--dynamo-config {name}: a {kind.__name__} setting, which a NAME=VALUE cannot spell",
        hint="set it in code (torch._dynamo.config) instead",
    )


@contextlib.contextmanager
def dynamo_settings(settings: tuple[tuple[str, str], ...]) -> Iterator[None]:
    """``torch._dynamo.config`` set to ``settings`` for the block (:func:`typed_dynamo_settings`)."""
    from gbdoctor.torch_compat import dynamo_config

    values = typed_dynamo_settings(settings)
    with dynamo_config().patch(**values) if values else contextlib.nullcontext():
        yield
