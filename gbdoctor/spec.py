"""Spec files: torchtitan v0.2.x TOML train configs (plus a ``[gbdoctor]`` section) -> ``Spec``.

The generic loader: read the TOML, apply ``--set`` overrides, refuse unknown sections and keys
(with "did you mean"), then read the sections every spec has (``frameworks.common.sections``,
torchtitan v0.2.2's ``JobConfig`` schema) and let the spec's framework read its own
(``Framework.check_spec``; ``[deepspeed]``) while the others refuse theirs. Unknown sections and
unknown keys in the sections gbdoctor reads are errors, never silently ignored.

No torch import here; the model registry (``gbdoctor.models``) is imported lazily.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from gbdoctor.errors import SpecError, exception_line
from gbdoctor.frameworks.common.schema import (
    AC_MODES,
    COMPILE_COMPONENTS,
    DEVICES,
    IGNORED_SECTIONS,
    VALID_KEYS,
)
from gbdoctor.frameworks.common.sections import (
    FROM_FRAMEWORK_SECTION,
    missing_model,
    read_sections,
    spec_notes,
)
from gbdoctor.frameworks.common.specfile import SpecContext, did_you_mean, type_word
from gbdoctor.frameworks.registry import all_frameworks
from gbdoctor.records import Spec
from gbdoctor.records.bounds import MAX_INT, shown_number

__all__ = [
    "AC_MODES",
    "COMPILE_COMPONENTS",
    "DEVICES",
    "IGNORED_SECTIONS",
    "VALID_KEYS",
    "load_spec",
    "parse_override",
    "spec_notes",
]

# --------------------------------------------------------------------------- overrides


def parse_override(text: str) -> tuple[str, str, object]:
    """``section.key=value`` -> ``(section, key, value)``.

    The value is read as a TOML value when it is one (``true``, ``2``, ``"op"``, ``["model"]``),
    else taken as a bare string (``op``, ``titan-v0.2.2``). ``key`` may be dotted for nested
    tables (``training.dataloader.num_workers=2``).
    """
    name, sep, raw = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not section or not key.strip():
        raise SpecError(
            f"override {text!r} is not section.key=value",
            "write e.g. --set parallelism.expert_parallel_degree=2",
        )
    try:
        value = _parse_value(raw.strip())
    except ValueError:  # an integer past int_max_str_digits (4300 digits)
        raise SpecError(
            f"--set {section}.{key.strip()}: a {len(raw.strip())}-character integer is out of "
            f"range (at most {MAX_INT})",
            "give a value that fits in 64 bits",
        ) from None
    return section, key.strip(), value


def with_overrides(spec: Spec, overrides: Sequence[str]) -> Spec:
    """``spec`` with trusted ``section.key=value`` overrides applied to the loaded record (a known
    issue's workaround; user input goes through :func:`load_spec`, which validates it)."""
    for text in overrides:
        section, key, value = parse_override(text)
        table = getattr(spec, section)
        spec = dataclasses.replace(spec, **{section: dataclasses.replace(table, **{key: value})})
    return spec


def _parse_value(raw: str) -> object:
    try:
        parsed = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        return raw
    # "1\nx = 2" would parse into two keys: not one value, so keep the text as it is.
    return parsed["v"] if list(parsed) == ["v"] else raw


# --------------------------------------------------------------------------- loading


def load_spec(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Spec:
    """Read, override, check and type a spec file. Every problem is a one-line ``SpecError``."""
    shown = os.fspath(path)
    _check_file_name(shown)
    data = _read_toml(shown)
    ctx = SpecContext(path=shown, origins={})
    for text in overrides:
        _apply_override(data, text, ctx)
    _check_sections(data, ctx)
    _check_integers(data, ctx)
    _launch_size_from_launcher(data)

    spec, strategy_set = read_sections(data, shown, stable_root(shown), ctx)
    spec_dir = os.path.dirname(os.path.abspath(shown))
    # The framework completes and checks its own part; the others refuse their sections.
    for framework in all_frameworks():
        if framework.name == spec.gbdoctor.framework:
            spec = framework.check_spec(spec, data, strategy_set, spec_dir, ctx)
        else:
            framework.check_foreign_spec(spec, data, ctx)
    if spec.model is FROM_FRAMEWORK_SECTION:
        missing_model(ctx)
    return spec


def _launch_size_from_launcher(data: dict[str, Any]) -> None:
    """Under a launcher (torchrun, deepspeed, srun), a spec whose ``data_parallel_shard_degree``
    is -1 takes the launcher's world size as its launch size, as torchtitan does (it reads
    ``WORLD_SIZE``); a stated ``[gbdoctor] world_size`` (or ``--world-size``) still wins, and a
    spec with fixed degrees keeps them (a mismatch is then ``setup.launched.check_world``'s
    error)."""
    from gbdoctor.launcher import detect

    launched = detect()
    if launched is None:
        return
    parallelism = data.get("parallelism", {})
    tool = data.setdefault("gbdoctor", {})
    if parallelism.get("data_parallel_shard_degree", -1) == -1 and "world_size" not in tool:
        tool["world_size"] = launched.world_size


def _check_file_name(shown: str) -> None:
    """A spec name reports and baselines can hold: valid UTF-8 (issue 45: a name with a stray
    byte failed only when the scan's JSON was written, after the whole scan)."""
    try:
        shown.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError(
            f"{ascii(shown)}: the spec file name is not valid UTF-8",
            "rename the spec file (reports and baselines name it)",
        ) from None


def _check_integers(data: Mapping[str, Any], ctx: SpecContext) -> None:
    """Every integer of the spec (file or ``--set``) within int64, named by its key: a larger one
    is no degree, size or count, and torch cannot hold it."""

    def walk(value: Any, section: str, key: str, rest: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, section, key or str(k), f"{rest}.{k}" if key else "")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, section, key, f"{rest}[{i}]")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            ctx.fail(
                f"{ctx.where(section, key)}{rest} = {shown_number(value)} is out of range "
                f"(at most {MAX_INT})",
                "give a value that fits in 64 bits",
            )

    for section, table in data.items():
        walk(table, str(section), "", "")


def stable_root(path: str) -> str:
    """The directory report paths are relative to (``Spec.root``): the nearest ancestor of the
    spec file holding ``.git`` (a directory, or a file in a git worktree), else the spec file's
    directory. Never the working directory (issue #18: keys must not depend on it)."""
    here = os.path.dirname(os.path.abspath(path))
    parent = here
    while True:
        if os.path.exists(os.path.join(parent, ".git")):
            return parent
        up = os.path.dirname(parent)
        if up == parent:
            return here
        parent = up


def _read_toml(path: str) -> dict[str, Any]:
    from gbdoctor.records.io import read_regular_file

    data = read_regular_file(
        path,
        "spec",
        "pass the path of a TOML spec, e.g. fixtures/llama3_debug.toml",
        error=SpecError,
    )
    try:
        # A UTF-8 byte-order mark (some Windows editors write one) is not TOML, but it is
        # harmless: drop it instead of calling the whole file invalid.
        return tomllib.loads(data.decode("utf-8").removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: invalid TOML: {e}", "fix the TOML syntax at that line") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: invalid TOML: not UTF-8 text ({e.reason})") from None
    except RecursionError:
        raise SpecError(
            f"{path}: invalid TOML: nested too deeply to read", "flatten the nested tables"
        ) from None
    except ValueError as e:  # an integer past int_max_str_digits (4300 digits)
        raise SpecError(f"{path}: invalid TOML: {exception_line(e, 120)}") from None


def _apply_override(data: dict[str, Any], text: str, ctx: SpecContext) -> None:
    section, key, value = parse_override(text)
    raw = text.partition("=")[2].strip()
    _check_section_name(section, ctx, f" (from --set {text})")
    if section in IGNORED_SECTIONS and section != "debug":
        return
    head, *rest = key.split(".")
    if section in VALID_KEYS:
        _check_key(section, head, ctx, f" (from --set {text})")
    table = data.setdefault(section, {})
    if not isinstance(table, dict):
        ctx.fail(
            f"[{section}] must be a table, got {type_word(table)}",
            f"write the keys under a [{section}] header",
        )
    for part in [head, *rest][:-1]:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            ctx.fail(f"--set {text}: {section}.{part} is not a table")
    table[([head, *rest])[-1]] = value
    ctx.origins[(section, head)] = (text, raw if not rest else None)


def _check_sections(data: Mapping[str, Any], ctx: SpecContext) -> None:
    for section, table in data.items():
        _check_section_name(section, ctx)
        if not isinstance(table, dict):
            ctx.fail(
                f"[{section}] must be a table, got {section} = {table!r}",
                f"write the keys under a [{section}] header",
            )
        if section in VALID_KEYS:
            for key in table:
                _check_key(section, key, ctx)


def _check_section_name(section: str, ctx: SpecContext, origin: str = "") -> None:
    owned = [s for framework in all_frameworks() for s in framework.spec_sections]
    if section in VALID_KEYS or section in IGNORED_SECTIONS or section in owned:
        return
    known = sorted(VALID_KEYS) + owned + sorted(IGNORED_SECTIONS)
    ctx.fail(
        f"unknown section [{section}]{origin}{did_you_mean(section, known)}; "
        f"known sections: {', '.join(known)}",
        "sections follow torchtitan v0.2.2's JobConfig plus [gbdoctor]; fix the spelling",
    )


def _check_key(section: str, key: str, ctx: SpecContext, origin: str = "") -> None:
    valid = VALID_KEYS[section]
    if key in valid:
        return
    ctx.fail(
        f"[{section}] unknown key '{key}'{origin}{did_you_mean(key, valid)}; "
        f"valid keys: {', '.join(sorted(valid))}",
        f"fix the spelling or remove the key from [{section}]",
    )
