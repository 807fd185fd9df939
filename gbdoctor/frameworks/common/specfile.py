"""The loader's context for one spec file and the helpers every section's check uses: where a
key came from (the file or ``--set``), the one-line SpecError (exit 2), "did you mean", and
TOML values checked against a record field's type."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from gbdoctor.errors import SpecError

TYPE_WORDS = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "a table",
}


@dataclasses.dataclass
class SpecContext:
    """One spec file being loaded (``frameworks.interface.SpecContext``)."""

    path: str
    origins: dict[tuple[str, str], tuple[str, str | None]]
    """(section, key) -> (override text, raw value text) for keys set with --set."""

    def where(self, section: str, key: str) -> str:
        origin = self.origins.get((section, key))
        return f"{section}.{key}" + (f" (from --set {origin[0]})" if origin else "")

    def fail(self, message: str, hint: str | None = None) -> typing.NoReturn:
        raise SpecError(f"{self.path}: {message}", hint)


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return f" (did you mean '{by_lower[close[0]]}'?)" if close else ""


def typed_value(value: Any, tp: Any, section: str, key: str, ctx: SpecContext) -> Any:
    if value is None:
        return None
    origin = ctx.origins.get((section, key))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if tp is str:
        if origin is not None and origin[1] is not None and not isinstance(value, str):
            return origin[1]  # --set model.flavor=8 means the string "8"
        if key == "selective_ac_option" and type(value) is int:
            return str(value)  # torchtitan reads it with int(); accept an unquoted number
        if isinstance(value, str):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if type(value) is int:
            return value
    elif tp is float:
        if type(value) in (int, float):
            return float(value)
    elif typing.get_origin(tp) is tuple:
        # --set compile.components=model,loss (bare words) is a list; a quoted TOML string
        # (--set 'compile.components="model"') is a string, as the TOML file would read it.
        bare = origin is not None and origin[1] is not None and origin[1][:1] not in "\"'"
        if bare and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        tp = list  # for the message: an array of strings
    else:  # pragma: no cover - a record field of a type this loader does not know
        raise TypeError(f"unsupported spec field type {tp!r} for {section}.{key}")
    want = "an array of strings" if tp is list else TYPE_WORDS[tp]
    ctx.fail(
        f"{ctx.where(section, key)} must be {want}, got {value!r} ({type_word(value)})",
        f"fix the value of {key} in [{section}]",
    )


def type_word(value: Any) -> str:
    return TYPE_WORDS.get(type(value), type(value).__name__)


CAPTURE_SETTINGS = ("batch_size", "seq_len", "timeout_s")
"""The ``--set gbdoctor.KEY=N`` settings a run named by a framework's own option (no SPEC.toml,
``RegistryRuns``) accepts: the capture's shape and deadline; the setup is the framework's."""


def capture_settings(overrides: typing.Sequence[str], run: str, own_keys: str) -> dict[str, float]:
    """``--set`` items of such a run as ``{setting: value}``; SpecError for anything else, saying
    that ``run`` (e.g. "a torchtitan run") takes only these and where its own keys go
    (``own_keys``)."""
    capture: dict[str, float] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        name = key.strip().removeprefix("gbdoctor.")
        try:
            number = float(value) if sep else 0.0
        except ValueError:
            number = 0.0
        if (
            name not in CAPTURE_SETTINGS
            or number <= 0
            or (name != "timeout_s" and not number.is_integer())
        ):
            raise SpecError(
                f"--set {item!r} is not a capture setting of {run}",
                hint="only --set gbdoctor.batch_size=N, gbdoctor.seq_len=N and "
                f"gbdoctor.timeout_s=S apply; {own_keys}",
            )
        capture[name] = number
    return capture
