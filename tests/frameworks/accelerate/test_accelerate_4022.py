"""The huggingface/accelerate#4022 class (compiled wrappers bypass FSDP2's hooks), checked on the
installed accelerate 1.15 and torch: it cannot be reached any more, with evidence.

- accelerate 1.15's FSDP2 path compiles regions in place (``compile_regions_fsdp2``:
  ``module.compile()`` keeps ``nn.Module._call_impl``, and so the hooks ``fully_shard`` adds
  later, on the call path), which the scans of ``test_accelerate_scan.py`` set up;
- and even the order of the releases before it, accelerate's own ``compile_regions`` (each block
  an ``OptimizedModule`` wrapper) before ``fsdp2_prepare_model``, runs every FSDP2 module's
  pre-forward hook on this torch: ``fully_shard`` on a wrapper makes it an
  ``FSDPOptimizedModule`` whose call goes through the hooks.

Measured by spying on FSDP2's own pre-forward (``FSDPState._pre_forward``) before sharding: a
module whose hooks a wrapper bypassed would be missing from the calls.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from oracle import Case, _accelerator
from repo_paths import FIXTURES

pytestmark = pytest.mark.extra("accelerate")

MODEL = FIXTURES / "accelerate" / "models" / "llama"


@pytest.mark.parametrize("order", ["compile_regions", "compile_regions_fsdp2"])
def test_every_fsdp2_pre_forward_runs_with_either_regional_compile(monkeypatch, order):
    import accelerate.utils.other as other
    import torch.distributed.fsdp._fully_shard._fsdp_state as fsdp_state
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from torch.distributed.fsdp import FSDPModule
    from transformers import AutoConfig, AutoModelForCausalLM

    ran: list[torch.nn.Module] = []
    pre_forward = fsdp_state.FSDPState._pre_forward

    def spy(self, module, args, kwargs):
        ran.append(module)
        return pre_forward(self, module, args, kwargs)

    # Before fully_shard: it registers the hook as a bound method of its state.
    monkeypatch.setattr(fsdp_state.FSDPState, "_pre_forward", spy)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(MODEL))
        accelerator = _accelerator(Case("", ac=False, regional=True), model)
        accelerator.state.fsdp_plugin.set_auto_wrap_policy(model)
        model = getattr(other, order)(model, backend="eager")
        model = fsdp2_prepare_model(accelerator, model)
        sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
        wrapped = [m for m in sharded if isinstance(m, torch._dynamo.eval_frame.OptimizedModule)]
        # The wrapper order really wraps: accelerate shards the embeddings' and head's wrappers.
        assert bool(wrapped) == (order == "compile_regions")
        model(torch.randint(0, 128, (2, 16)))
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    assert len(sharded) >= 4  # root, embeddings, 2 decoder layers (and the tail group)
    assert {id(m) for m in ran} == {id(m) for m in sharded}
