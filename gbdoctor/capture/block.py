"""Block driving: run one block the way a training step does, with its real recorded inputs.

The scan's warm-up step records each block's real (args, kwargs) with forward pre-hooks; each
capture replays a fresh leaf copy of them through the block's real wrappers, forward and
backward, and puts FSDP back to idle if a block crashed mid-forward.
"""

from __future__ import annotations

import contextlib
import copy
import re
import traceback
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.nn as nn

from gbdoctor.capture.locate import portable_path
from gbdoctor.causes import is_torch_file
from gbdoctor.errors import first_line


def run_block(outer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Forward and backward of one block, the way a training step drives it."""
    out = outer(*args, **kwargs)
    tensors = [t for t in _flatten(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if tensors:
        # A tensor, not sum's start value 0: ``tensors`` is not empty.
        loss = cast(torch.Tensor, sum(t.float().square().mean() for t in tensors))
        loss.backward()


def _flatten(obj: Any) -> Iterator[Any]:
    if isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _flatten(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _flatten(item)
    else:
        yield obj


def describe_error(exc: BaseException, root: str | None = None) -> str:
    """One line for a block that could not be traced at all.

    Dynamo and the backend wrap the real exception (``BackendCompilerFailed: backend=... raised``,
    ``InternalTorchDynamoError``); the line names the innermost one, where in the user's code
    tracing stood, and whether it was raised inside PyTorch itself (a PyTorch bug that training
    compiling the same block would hit too) or by the model's own code. The site is relative to
    ``root`` (the spec's repository), as every other location.
    """
    inner = _innermost(exc)
    message = first_line(inner)
    where = _user_site(exc, root) or _user_site(inner, root)
    owner = "raised inside PyTorch" if _raised_in_torch(inner) else "raised by the model's code"
    site = f" at {where}" if where else ""
    wrapped = f"; wrapped in {type(exc).__name__}" if inner is not exc else ""
    return (
        f"{type(inner).__name__}: {message}{site} ({owner}{wrapped}; a training step that "
        "compiles this block fails the same way)"
    )[:500]


def _innermost(exc: BaseException) -> BaseException:
    """Follow the chain Dynamo builds (``inner_exception``, ``__cause__``) to the original error."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = getattr(exc, "inner_exception", None) or exc.__cause__
        if not isinstance(nxt, BaseException) or not str(nxt).strip():
            break
        exc = nxt
    return exc


# Dynamo appends 'from user code:' and the user frames, outermost first, to errors it re-raises.
_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _user_site(exc: BaseException, root: str | None) -> str | None:
    """The innermost non-torch frame of Dynamo's 'from user code:' section, as file:line."""
    text = str(exc)
    if "from user code:" not in text:
        return None
    frames = _USER_FRAME.findall(text.split("from user code:", 1)[1])
    user = [(file, line) for file, line in frames if not is_torch_file(file)]
    if not user:
        return None
    file, line = user[-1]
    return f"{portable_path(file, root)}:{line}"


def _raised_in_torch(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and is_torch_file(frames[-1].filename)


def error_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


@contextlib.contextmanager
def eager_stance() -> Iterator[None]:
    """Run compiled regions eagerly (warm-up steps that must not compile)."""
    with torch.compiler.set_stance("force_eager"):
        yield


def collect_block_inputs(
    model: nn.Module, outers: dict[str, nn.Module]
) -> tuple[dict[str, Any], Any]:
    """Install pre-hooks that record each block's real (args, kwargs); returns (store, remover)."""
    store: dict[str, Any] = {}
    handles = []
    for fqn, outer in outers.items():

        def hook(mod: nn.Module, args: Any, kwargs: Any, fqn: str = fqn) -> None:
            if fqn not in store:
                store[fqn] = (_detach(args), _detach(kwargs))

        handles.append(outer.register_forward_pre_hook(hook, with_kwargs=True, prepend=True))

    def remove() -> None:
        for h in handles:
            h.remove()

    return store, remove


def _detach(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        leaf = obj.detach().clone()
        if obj.requires_grad and leaf.is_floating_point():
            leaf.requires_grad_(True)
        return leaf
    if isinstance(obj, tuple):
        return tuple(_detach(x) for x in obj)
    if isinstance(obj, list):
        return [_detach(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _detach(v) for k, v in obj.items()}
    if obj is None or isinstance(
        obj, (bool, int, float, str, torch.dtype, torch.device, nn.Module)
    ):
        return obj
    return _snapshot(obj)


def _snapshot(obj: Any) -> Any:
    """A copy of a stateful argument as it was when the block was called.

    Hugging Face decoders pass a KV cache object (``past_key_values``) that every layer appends
    to: replaying a block with the live object would see the other layers' (and its own
    earlier) entries, whose autograd graphs are already freed. Tensors inside become detached
    copies, modules stay shared; an object that cannot be copied is passed as it is.
    """
    memo: dict[int, Any] = {}
    keep: list[Any] = []  # the originals stay alive while their ids key the memo
    for found in _reachable(obj, depth=5):
        keep.append(found)
        memo[id(found)] = _detach(found) if isinstance(found, torch.Tensor) else found
    try:
        return copy.deepcopy(obj, memo)
    except Exception:  # noqa: BLE001 - an uncopyable argument is replayed as is
        return obj


def _reachable(obj: Any, depth: int) -> Iterator[Any]:
    """Tensors and modules reachable from ``obj`` through attributes and containers."""
    if isinstance(obj, (torch.Tensor, nn.Module)):
        yield obj
        return
    if depth == 0 or obj is None or isinstance(obj, (bool, int, float, str, bytes, type)):
        return
    if isinstance(obj, dict):
        children: Any = obj.values()
    elif isinstance(obj, (tuple, list, set, frozenset)):
        children = obj
    else:
        children = getattr(obj, "__dict__", {}).values()
    for child in list(children):
        yield from _reachable(child, depth - 1)


def fresh_inputs(saved: Any) -> Any:
    """A new leaf copy of recorded inputs for one more replay (grads must not accumulate)."""
    return _detach(saved)


def reset_fsdp_state(model: nn.Module) -> None:
    """Best effort after a block crashed mid-forward: put FSDP modules back to idle, resharded."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
    except ImportError:  # pragma: no cover - other torch versions
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            state._training_state = TrainingState.IDLE
            # torch 2.13 FSDP2 keeps one group per parameter mesh (torchtitan 0.3's EP shards
            # experts on their own mesh within the block's unit); the singular accessor
            # asserts there is at most one.
            for group in getattr(state, "_fsdp_param_groups", None) or (
                [state._fsdp_param_group] if state._fsdp_param_group else []
            ):
                group._training_state = TrainingState.IDLE
            with contextlib.suppress(Exception):
                module.reshard()


def tokens_dynamic(compiled: Any, *, arg: int) -> Any:
    """``compiled`` with dimension 0 (the tokens) of positional argument ``arg`` marked dynamic
    before each call (torchtitan v0.2.2's ``_run_experts_grouped_mm_dynamic`` wrapper under EP),
    so that a new token count does not recompile."""
    import torch._dynamo

    def call(*args: Any, **kwargs: Any) -> Any:
        torch._dynamo.mark_dynamic(args[arg], 0)
        return compiled(*args, **kwargs)

    return call
