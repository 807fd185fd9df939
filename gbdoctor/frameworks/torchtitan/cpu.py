"""What torchtitan (>= 0.3) needs on a CPU machine, provided without changing where breaks happen:
a ``triton`` stand-in while torchtitan's modules load, "cpu" as its device type, FlexAttention's
CPU-backward guard lifted, FlexAttention regions left out of inductor on CPU. Each is a context
manager that undoes itself.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch


class _Anything:
    """Any attribute, any call: enough for module-level ``@triton.jit`` and ``tl.constexpr``."""

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Anything()


def _stand_in_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def attr(key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)  # inspect/importlib probe dunders: behave like a module
        return _Anything()

    module.__getattr__ = attr  # type: ignore[method-assign]
    return module


# torch modules that probe triton while they load or cache the answer: imported before the
# stand-in exists so that torch itself never sees it.
_TORCH_TRITON_PROBES = (
    "torch._inductor.compile_fx",
    "torch._inductor.codecache",
    "torch._inductor.runtime.triton_compat",
    "torch._functorch.partitioners",
    "torch.distributed.tensor",
    "torch.distributed.checkpoint",
    "torch.nn.attention.flex_attention",
    "torch.utils._triton",
)


@contextlib.contextmanager
def triton_stand_in() -> Iterator[None]:
    """torchtitan 0.3 imports triton unconditionally (``distributed/minimal_async_ep/kernels.py``,
    reached from every MoE model) for GPU kernels a CPU run never calls."""
    for name in _TORCH_TRITON_PROBES:
        importlib.import_module(name)
    if importlib.util.find_spec("triton") is not None:
        yield
        return
    triton, language = _stand_in_module("triton"), _stand_in_module("triton.language")
    triton.language = language  # type: ignore[attr-defined]
    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    try:
        yield
    finally:
        del sys.modules["triton"], sys.modules["triton.language"]


@contextlib.contextmanager
def _cpu_device_type() -> Iterator[None]:
    """torchtitan picks its device from CUDA ("cuda" when none is visible); its modules copy
    ``device_type``/``device_module`` at import, so each copy is pointed at the CPU."""
    patched: list[tuple[Any, str, Any]] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("torchtitan") or module is None:
            continue
        for attr, value in (("device_type", "cpu"), ("device_module", torch.cpu)):
            if attr in vars(module) and isinstance(vars(module)[attr], (str, types.ModuleType)):
                patched.append((module, attr, vars(module)[attr]))
                setattr(module, attr, value)
    try:
        yield
    finally:
        for module, attr, value in reversed(patched):
            setattr(module, attr, value)


@contextlib.contextmanager
def _flex_cpu_backward() -> Iterator[None]:
    """torch 2.13's ``flex_attention`` refuses CPU inputs that require grad before it does
    anything (``_validate_device``); the math implementation underneath runs forward and
    backward on CPU. The check passes silently on CUDA, so lifting it for CPU tensors traces
    the same code a GPU run traces."""
    import torch.nn.attention.flex_attention as flex

    original = flex._validate_device

    def validate(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type != "cpu":
            original(query, key, value)

    flex._validate_device = validate
    # torchtitan compiles flex_attention once, at class level, with inductor, whose CPU
    # FlexAttention kernel has no backward on torch 2.13 (IndexError in the lowering): outside
    # a compiled block (eager training, run's eager mode) it runs through aot_eager instead,
    # the same math. Inside a compiled block it is traced into the block's graph either way.
    attention = sys.modules.get("torchtitan.models.common.attention")
    holder: Any = getattr(attention, "FlexAttention", None)
    compiled = getattr(holder, "_compiled_flex_attn", None)
    if compiled is not None:
        holder._compiled_flex_attn = torch.compile(flex.flex_attention, backend="aot_eager")
    try:
        yield
    finally:
        flex._validate_device = original
        if compiled is not None:
            holder._compiled_flex_attn = compiled


@contextlib.contextmanager
def _no_regional_inductor() -> Iterator[None]:
    """Under ``aot_eager`` torchtitan lowers FlexAttention regions with inductor all the same
    (``distributed/compile.py``, regional inductor); on CPU that lowering has no backward (the
    same ``IndexError``), so on CPU the flex region stays in ``aot_eager`` like the rest."""
    compile_module = sys.modules.get("torchtitan.distributed.compile")
    original = getattr(compile_module, "_maybe_regional_inductor_backend", None)
    if original is None:
        yield
        return
    compile_module._maybe_regional_inductor_backend = lambda model, backend: backend  # type: ignore[union-attr]
    try:
        yield
    finally:
        compile_module._maybe_regional_inductor_backend = original  # type: ignore[union-attr]


@contextlib.contextmanager
def cpu_stand_ins(device: str) -> Iterator[None]:
    """Everything torchtitan needs to run on a CPU machine, undone on exit."""
    if device != "cpu":
        yield
        return
    with _cpu_device_type(), _flex_cpu_backward(), _no_regional_inductor():
        yield
