"""User-supplied models: ``[model] name = "custom"`` with ``factory = "file.py:build"`` or
``"package.module:build"``; gbdoctor calls ``build(flavor)``.

Every way this can go wrong is a ``SpecError`` (exit 2) naming the factory and the problem, because
a broken factory is bad input, not a gbdoctor failure. The returned model must look enough like a
decoder for the per-block machinery: a ModuleList/ModuleDict of blocks anywhere in the tree (found
by structure, ``structure.find_blocks``, or named by ``[gbdoctor] blocks``) and an ``nn.Embedding``
(its ``num_embeddings`` is the vocabulary used for synthetic tokens).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path

from torch import nn

from ..errors import SpecError, exception_line
from ..usercode import OWN_CODE_HINT, defined_in, foreign_factory
from .structure import find_blocks

_FORMAT_HINT = "write the factory as 'path/to/file.py:build' or 'package.module:build'"


def _split(ref: str) -> tuple[str, str]:
    target, sep, attr = ref.strip().rpartition(":")
    if not sep or not target or not attr or not attr.isidentifier():
        raise SpecError(
            f"model factory {ref!r} is not of the form 'target:function'", hint=_FORMAT_HINT
        )
    return target, attr


def _is_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


def _import_file(target: str, ref: str):
    path = Path(target).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    if not path.is_file():
        raise SpecError(
            f"model factory {ref!r}: file {str(path)!r} does not exist",
            hint="relative factory paths are resolved against the spec file's directory",
        )
    _refuse_foreign(str(path), ref, is_path=True)
    # A unique, stable module name: two factories called model.py in different folders must not
    # collide. Reports name it without the digest (``portable_module_names``).
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    name = f"gbdoctor_factory_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SpecError(
            f"model factory {ref!r}: {str(path)!r} is not an importable Python file",
            hint=_FORMAT_HINT,
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    parent = str(path.parent)
    sys.path.insert(0, parent)  # let the file import its siblings
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise SpecError(
            f"model factory {ref!r}: importing {path.name} failed with {exception_line(exc, 240)}",
            hint=f"run 'python {path}' to see the full traceback",
        ) from exc
    finally:
        try:
            sys.path.remove(parent)
        except ValueError:
            pass
    return module


def _refuse_foreign(target: str, ref: str, *, is_path: bool) -> None:
    """The spec loader refuses these already (``frameworks.common.sections``); checked again
    here for factories given to the library directly."""
    foreign = foreign_factory(target, is_path=is_path)
    if foreign is not None:
        raise SpecError(f"model factory {ref!r} {foreign[0]}", hint=foreign[1])


_FACTORY_MODULE = re.compile(r"\bgbdoctor_factory_(\w+?)_[0-9a-f]{10}\b")


def portable_module_names(text: str) -> str:
    """``text`` with a factory file's module named by its file (``model``), not by the name it
    was imported under, which holds a digest of its absolute path (Dynamo's guards quote it:
    ``type=<class 'gbdoctor_factory_model_1a2b3c4d5e.Block'>``)."""
    return _FACTORY_MODULE.sub(r"\1", text) if "gbdoctor_factory_" in text else text


def _import_module(target: str, ref: str):
    _refuse_foreign(target, ref, is_path=False)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (target == exc.name or target.startswith(exc.name + ".")):
            raise SpecError(
                f"model factory {ref!r}: module {target!r} not found",
                hint="install the package, add it to PYTHONPATH, or give a path ending in .py",
            ) from exc
        raise SpecError(
            f"model factory {ref!r}: importing {target} failed with {exception_line(exc, 240)}",
            hint=f"run 'python -c \"import {target}\"' to see the full traceback",
        ) from exc
    except Exception as exc:
        raise SpecError(
            f"model factory {ref!r}: importing {target} failed with {exception_line(exc, 240)}",
            hint=f"run 'python -c \"import {target}\"' to see the full traceback",
        ) from exc


def validate_model(model: object, ref: str) -> nn.Module:
    """Check that ``model`` has what the per-block setup needs; return it."""
    if not isinstance(model, nn.Module):
        raise SpecError(
            f"model factory {ref!r} returned {type(model).__name__}, not a torch.nn.Module",
            hint="make build(flavor) return the model instance",
        )
    try:
        find_blocks(model)
    except SpecError as exc:
        # A Sequential can hold the blocks only when the spec names it ([gbdoctor] blocks);
        # the setup checks that path later.
        sequentials = [m for m in model.modules() if isinstance(m, nn.Sequential)]
        if not any(
            sum(1 for e in m if any(True for _ in e.parameters())) >= 2 for m in sequentials
        ):
            raise SpecError(f"model from factory {ref!r}: {exc.message}", hint=exc.hint) from None
    if not any(isinstance(m, nn.Embedding) for m in model.modules()):
        raise SpecError(
            f"model from factory {ref!r} has no nn.Embedding",
            hint="gbdoctor feeds token ids sized by the first nn.Embedding; the model must take tokens",
        )
    return model


def load_factory(ref: str, flavor: str) -> nn.Module:
    """Import ``ref``'s target, call ``function(flavor)``, validate and return the model.

    File paths are resolved against the current directory (the spec loader passes them already
    resolved against the spec file). Builds on the caller's default device.
    """
    target, attr = _split(ref)
    module = _import_file(target, ref) if _is_path(target) else _import_module(target, ref)
    factory = getattr(module, attr, None)
    if factory is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        shown = ", ".join(public[:8]) + (", ..." if len(public) > 8 else "")
        raise SpecError(
            f"model factory {ref!r}: {target} has no attribute {attr!r}",
            hint=f"callables defined there: {shown}"
            if shown
            else "define build(flavor) in that module",
        )
    if not callable(factory):
        raise SpecError(
            f"model factory {ref!r}: {attr!r} is a {type(factory).__name__}, not a function",
            hint="point the factory at a function build(flavor) -> nn.Module",
        )
    if not defined_in(factory, module.__name__):
        owner = getattr(factory, "__module__", None) or "an unknown module"
        raise SpecError(
            f"model factory {ref!r}: {attr!r} is defined in {owner}, not in {target}",
            hint=OWN_CODE_HINT,
        )
    try:
        model = factory(flavor)
    except Exception as exc:
        raise SpecError(
            f"model factory {ref!r} raised {exception_line(exc, 240)} for flavor {flavor!r}",
            hint="run the factory by hand to see the full traceback",
        ) from exc
    return validate_model(model, ref)
