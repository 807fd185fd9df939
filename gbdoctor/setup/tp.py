"""Tensor parallelism the way torchtitan v0.2.2 applies it (``apply_tp``/``apply_non_moe_tp`` and
the TP half of ``apply_moe_ep_tp``), first in the setup order: TP -> EP -> AC -> compile -> FSDP.

Plans are per module name, as torchtitan's are, on the decoder layout every built-in family
shares (``tok_embeddings``, ``layers.<i>.attention``/``feed_forward``/``moe``, ``norm``,
``output``); which plan a block gets is decided by its structure (an MLA attention has a
``wkv_a``; an MoE block has a ``moe`` child), never by a class name:

- root: the embedding is row-wise (output sharded on the sequence), the final norm is
  sequence-parallel, the output projection column-wise (logits sharded on the vocabulary and
  kept a DTensor under loss parallel, else replicated plain tensors).
- every block: both norms sequence-parallel; attention all-gathers its input (``Shard(1)`` ->
  ``Replicate``), q/k/v column-wise, ``wo`` row-wise back to ``Shard(1)``; a dense FFN the
  same way (``w1``/``w3`` column-wise, ``w2`` row-wise).
- MLA attention (deepseek_v3): the low-rank projections and their norms compute replicated
  (``ReplicateCompute``, torchtitan's ``NoParallel``) and, like ``wq``/``wkv_b``, keep DTensor
  outputs so the shared rotary key's gradient is reduced by autograd; ``inner_attention``
  turns the head-sharded q/k/v back into plain tensors for the kernel.
- MoE: the MoE module all-gathers its input and reduce-scatters its output (the routed and
  shared expert outputs are partial sums), the router gate computes replicated, the shared
  experts are column/row-wise with a ``Partial`` output, and the grouped experts are sharded on
  their hidden dimension (``ExpertsTensorParallel``, torchtitan's ``TensorParallel``).

Every style installs forward (pre-)hooks; these are what Dynamo meets inside a compiled block,
so they are returned as installed hooks of the ``tp`` component. Async TP and expert tensor
parallelism are refused by the spec loader (see ``spec.py``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch.nn as nn
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

TP_INSTALLER = "tp"


class ReplicateCompute(ParallelStyle):
    """Parameters replicated over the TP mesh, input made a replicated DTensor, output given back
    as a local tensor (or kept a DTensor): a module every TP rank computes whole. torchtitan
    needs this (``NoParallel``) so that all parameters live on the same mesh for gradient
    clipping and fused optimizers."""

    def __init__(self, *, use_local_output: bool = True) -> None:
        super().__init__()
        self.use_local_output = use_local_output

    @staticmethod
    def _to_replicated(module: nn.Module, inputs: tuple[Any, ...], mesh: Any) -> tuple[Any, ...]:
        first = inputs[0]
        if not isinstance(first, DTensor):
            first = DTensor.from_local(first, mesh, (Replicate(),), run_check=False)
        elif first.placements != (Replicate(),):
            first = first.redistribute(placements=(Replicate(),), async_op=True)
        return (first, *inputs[1:])

    @staticmethod
    def _from_replicated(use_local: bool, module: nn.Module, output: Any, mesh: Any) -> Any:
        if output.placements != (Replicate(),):
            output = output.redistribute(placements=(Replicate(),), async_op=True)
        return output.to_local() if use_local else output

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        # torch's stub types input_fn as returning None, but distribute_module installs it as a
        # forward pre-hook whose return value replaces the inputs (torch's own styles return them).
        return distribute_module(
            module,
            device_mesh,
            None,
            self._to_replicated,  # type: ignore[arg-type]
            partial(self._from_replicated, self.use_local_output),
        )


class ExpertsTensorParallel(ParallelStyle):
    """Grouped experts sharded on their hidden dimension: ``w1``/``w3`` ``(E, H, D)`` on dim 1
    (column-wise), ``w2`` ``(E, D, H)`` on dim 2 (row-wise). Every rank routes all tokens, so the
    experts' output is a partial sum that the MoE's output layout reduces. The experts compute
    on plain tensors; the input is re-wrapped so that its gradient is a ``Partial`` sum that
    autograd reduces (torchtitan's ``TensorParallel``)."""

    @staticmethod
    def _prepare_input(module: nn.Module, inputs: tuple[Any, ...], mesh: Any) -> tuple[Any, ...]:
        routed, *rest = inputs
        routed = DTensor.from_local(routed, mesh, (Replicate(),), run_check=False).to_local(
            grad_placements=(Partial(),)
        )
        return (routed, *rest)

    @staticmethod
    def _partition(name: str, module: nn.Module, mesh: Any) -> None:
        if name:  # only the experts module's own stacked weights
            return
        for pname, dim in (("w1", 1), ("w2", 2), ("w3", 1)):
            param = getattr(module, pname, None)
            if isinstance(param, nn.Parameter) and not isinstance(param, DTensor):
                module.register_parameter(
                    pname,
                    nn.Parameter(
                        distribute_tensor(param.data, mesh, [Shard(dim)]),
                        requires_grad=param.requires_grad,
                    ),
                )

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        # torch's stub types input_fn as returning None, but distribute_module installs it as a
        # forward pre-hook whose return value replaces the inputs (torch's own styles return them).
        return distribute_module(
            module,
            device_mesh,
            self._partition,
            self._prepare_input,  # type: ignore[arg-type]
        )


def root_plan(loss_parallel: bool) -> dict[str, ParallelStyle]:
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def block_plan(block: nn.Module) -> dict[str, ParallelStyle]:
    """torchtitan's per-block plan for this block's structure (attention kind, dense or MoE)."""
    plan: dict[str, ParallelStyle] = {
        "attention_norm": SequenceParallel(),
        "ffn_norm": SequenceParallel(),
    }
    if _has(block, "attention.wkv_a"):  # multi-head latent attention (deepseek_v3)
        plan.update(
            {
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), Replicate()),
                    desired_input_layouts=(Replicate(), Replicate()),
                ),
                "attention.wkv_a": ReplicateCompute(use_local_output=False),
                "attention.kv_norm": ReplicateCompute(use_local_output=False),
                "attention.wkv_b": ColwiseParallel(use_local_output=False),
                "attention.inner_attention": PrepareModuleInput(
                    input_layouts=(Shard(1), Shard(1), Shard(1)),
                    desired_input_layouts=(Shard(1), Shard(1), Shard(1)),
                    use_local_output=True,
                ),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            }
        )
        if _has(block, "attention.wq"):
            plan["attention.wq"] = ColwiseParallel(use_local_output=False)
        else:
            plan.update(
                {
                    "attention.wq_a": ReplicateCompute(use_local_output=False),
                    "attention.q_norm": ReplicateCompute(use_local_output=False),
                    "attention.wq_b": ColwiseParallel(use_local_output=False),
                }
            )
    else:
        plan.update(
            {
                # The rope table stays a plain tensor (torchtitan does not make freqs_cis a DTensor
                # for llama3/llama4).
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            }
        )
    if _has(block, "moe"):
        plan.update(
            {
                # all-gather in, reduce-scatter out: routed and shared outputs are partial sums
                "moe": PrepareModuleInputOutput(
                    input_layouts=(Shard(1),),
                    desired_input_layouts=(Replicate(),),
                    use_local_input=True,
                    output_layouts=(Partial(),),
                    desired_output_layouts=(Shard(1),),
                ),
                "moe.router.gate": ReplicateCompute(),
            }
        )
        if _has(block, "moe.shared_experts"):
            plan.update(
                {
                    "moe.shared_experts.w1": ColwiseParallel(),
                    "moe.shared_experts.w2": RowwiseParallel(output_layouts=Partial()),
                    "moe.shared_experts.w3": ColwiseParallel(),
                }
            )
        plan["moe.experts"] = ExpertsTensorParallel()
    elif _has(block, "feed_forward"):
        plan.update(
            {
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
            }
        )
    return plan


def _hook_snapshot(model: nn.Module) -> set[tuple[int, str, int]]:
    return {
        (id(m), attr, key)
        for m in model.modules()
        for attr in ("_forward_pre_hooks", "_forward_hooks")
        for key in getattr(m, attr)
    }


def apply_tp(
    model: nn.Module, blocks: list[tuple[str, nn.Module]], tp_mesh: Any, *, loss_parallel: bool
) -> list[tuple[str, str, Any]]:
    """Parallelize ``model`` in place over ``tp_mesh``; returns the hooks the styles installed as
    (module fqn, hook kind, callable), for the hook registry and the locator."""
    before = _hook_snapshot(model)
    present = {k: v for k, v in root_plan(loss_parallel).items() if _has(model, k)}
    parallelize_module(model, tp_mesh, present)
    for _, block in blocks:
        parallelize_module(block, tp_mesh, block_plan(block))
    installed: list[tuple[str, str, Any]] = []
    for name, module in model.named_modules():
        for attr, kind in (("_forward_pre_hooks", "forward_pre"), ("_forward_hooks", "forward")):
            for key, fn in getattr(module, attr).items():
                if (id(module), attr, key) not in before:
                    installed.append((name, kind, fn))
    return installed


def check_divisible(model: nn.Module, tp: int) -> list[str]:
    """Sizes TP must split evenly: heads (query and key/value) and every column-wise hidden size."""
    problems = []
    for name, module in model.named_modules():
        for attr in ("n_heads", "n_kv_heads"):
            value = getattr(module, attr, None)
            if isinstance(value, int) and value % tp:
                problems.append(f"{name}.{attr} = {value}")
    for name, param in model.named_parameters():
        if name.endswith("experts.w1"):
            hidden = param.shape[1]  # (E, H, D)
        elif name.endswith((".w1.weight", ".wq.weight", ".wkv_b.weight", ".wq_b.weight")):
            hidden = param.shape[0]  # nn.Linear (out, in)
        else:
            continue
        if hidden % tp:
            problems.append(f"{name} ({hidden} rows)")
    return problems
