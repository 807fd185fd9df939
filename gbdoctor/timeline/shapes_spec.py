"""``torch.compile(shapes_spec=...)`` as a fix (``timeline --fix --fix-with shapes-spec``).

torch 2.13 lets a compile say up front which input dims vary (``torch.fx.experimental.
dynamic_spec``: ``ShapesSpec({"x": TensorSpec([None, ShapeVar("seq"), None])})``): those dims
are compiled as unbacked symbols from the first compile, so no size change recompiles, and
every dim the spec does not name stays static. The fix names exactly the dims the run made
dynamic (the graphs' ``L['x'] dim 1``, or in a static run the recompiles' failed size guards),
with one ``ShapeVar`` per distinct size at the first call, given to every argument dim of that
size (the RoPE table's length follows the tokens': unbacked symbols that merely happen to be
equal cannot be proven equal, so they must be one).

How it is applied: the setup compiles each block with ``torch.compile(block)``; what
``shapes_spec=`` does is set Dynamo's ``_shapes_spec`` setting while that callable compiles.
A forward pre-hook on each compiled block (outside Dynamo) builds the spec from the block's
first actual arguments, bound to its ``forward`` signature (the tensors' ranks are needed),
and sets the setting for the run: only the blocks are compiled frames under per-block compile.
A dim the spec cannot name (inside a BlockMask's mask function, a closure) is refused with the
reason, before any rank starts.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Iterator
from typing import Any

from gbdoctor.errors import SpecError
from gbdoctor.records.timeline import TimelineReport

FIX_WITH = ("config", "shapes-spec")
"""``--fix-with``: Dynamo settings (the default) or ``torch.compile(shapes_spec=...)``."""

_TOP = re.compile(r"^L\['(?P<name>[A-Za-z_]\w*)'\] dim (?P<dim>\d+)$")
_GUARD = re.compile(r"tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)")


def unsupported_reason() -> str | None:
    """Why the installed torch cannot take ``shapes_spec`` (None: it can)."""
    import torch

    if "shapes_spec" not in inspect.signature(torch.compile).parameters:
        return f"torch {torch.__version__} has no torch.compile(shapes_spec=...) (torch 2.13 has)"
    try:
        import torch.fx.experimental.dynamic_spec  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no torch.fx.experimental.dynamic_spec"
    return None


def spec_dims(report: TimelineReport) -> tuple[tuple[str, int], ...]:
    """(argument, dim) of every input dim the run compiled as a symbol; SpecError (exit 2)
    naming the first one a ShapesSpec cannot express or when none became dynamic."""
    dims: dict[tuple[str, int], None] = {}
    texts = [(g.frame, t) for g in report.graphs for t in g.dynamic]
    # A static run names the first tensor whose size failed its guard, in its recompiles.
    texts += [
        (c.frame, f"L['{found['name']}'] dim {found['dim']}")
        for step in report.steps
        for c in step.compiles
        if (found := _GUARD.search(c.guard)) is not None
    ]
    for frame, text in texts:
        found = _TOP.match(text)
        if found is None:
            raise SpecError(
                f"--fix-with shapes-spec: {frame}'s dynamic {text[:120]} is not a "
                "top-level argument, which a ShapesSpec cannot name",
                hint="use --fix-with config (assume_static_by_default=False) for this model",
            )
        dims[(found["name"], int(found["dim"]))] = None
    if not dims:
        raise SpecError(
            "--fix-with shapes-spec: no input dim changed size in this run",
            hint="nothing for a ShapesSpec to mark; run without --fix-with",
        )
    return tuple(dims)


def describe(dims: tuple[tuple[str, int], ...]) -> tuple[tuple[str, str], ...]:
    """The fix as the report's ``applied`` pairs."""
    return (("shapes_spec", ", ".join(f"{name} dim {dim}" for name, dim in dims)),)


def build_spec(forward: Any, args: tuple, kwargs: dict, dims: tuple[tuple[str, int], ...]) -> Any:
    """The ShapesSpec of ``dims`` for a call of ``forward`` with these arguments."""
    from torch.fx.experimental.dynamic_spec import ShapesSpec, ShapeVar, TensorSpec

    bound = inspect.signature(forward).bind(*args, **kwargs).arguments
    tensors = {n: v for n, v in bound.items() if hasattr(v, "shape") and hasattr(v, "dim")}
    # One ShapeVar per size the named dims have at this call; every tensor argument's dim of
    # that size gets it too, as Dynamo's duck sizing gives equal sizes one symbol (a guard
    # names only the first tensor that failed: the RoPE table's length follows the tokens').
    by_size: dict[int, Any] = {}
    for name, dim in dims:
        if name in tensors and dim < tensors[name].dim():
            size = int(tensors[name].shape[dim])
            by_size.setdefault(size, ShapeVar(f"s{len(by_size)}"))
    params: dict[str, Any] = {}
    for name, value in tensors.items():
        shape = [by_size.get(int(size)) for size in value.shape]
        if any(v is not None for v in shape):
            params[name] = TensorSpec(shape)
    return ShapesSpec(params)


@contextlib.contextmanager
def shapes_spec_fix(model: Any, dims: tuple[tuple[str, int], ...]) -> Iterator[None]:
    """For the block: the compiled blocks of ``model`` compile with the ShapesSpec of ``dims``
    (module docstring); a no-op without dims."""
    if not dims:
        yield
        return
    from gbdoctor.torch_compat import dynamo_config

    config = dynamo_config()
    # Dynamo's setting behind torch.compile(shapes_spec=...), declared in its config module.
    saved = getattr(config, "_shapes_spec")  # noqa: B009 - not a public name of the module
    compiled = [m for m in model.modules() if hasattr(m, "_orig_mod")]
    if not compiled:
        raise SpecError(
            "--fix-with shapes-spec: the setup compiled no module (torch.compile(module))",
            hint="use --fix-with config, or a strategy that compiles blocks",
        )

    def first_call(module: Any, args: tuple, kwargs: dict) -> None:
        if getattr(config, "_shapes_spec") is None:  # noqa: B009
            spec = build_spec(module._orig_mod.forward, args, kwargs, dims)
            setattr(config, "_shapes_spec", spec)  # noqa: B010

    handles = [m.register_forward_pre_hook(first_call, with_kwargs=True) for m in compiled]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        setattr(config, "_shapes_spec", saved)  # noqa: B010
