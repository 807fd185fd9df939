"""DeepSpeed ZeRO 0-3 behind the framework seam (:class:`DeepSpeed`).

``setup``: ``deepspeed.initialize`` on the real process group, then the compile call users
write (its strategies); ``spec``: the ``[deepspeed]`` table or ``deepspeed_config`` JSON,
validated by DeepSpeed's own config classes; ``plan``: the DeepSpeed planner; ``emit``: the
``--emit-config deepspeed`` code. Scans capture whole engine steps (``CaptureStyle.ENGINE_STEPS``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gbdoctor.causes.hooks import FrameworkHooks
from gbdoctor.frameworks.common.base import FrameworkBase, SetUpOptions
from gbdoctor.frameworks.deepspeed.causes import DEEPSPEED_CAUSES
from gbdoctor.frameworks.interface import PLUGIN_API_VERSION, CaptureStyle
from gbdoctor.records.enums import Component

NAME = "deepspeed"
ROOT_REGION = "model"
"""Name of the whole-model region (``engine.compile()``) and of the report row for everything
outside the blocks (embeddings, final norm, output, the model's own forward). Here, not in
``setup.py``: this module stays free of torch (frameworks load when the command line is built)."""


@dataclass(frozen=True)
class DeepSpeedRunModes:
    strategies: Mapping[str, str] = field(
        default_factory=lambda: {"eager": "none", "engine": "engine", "block": "block"}
    )
    """Mode -> strategy, under the spec's ZeRO stage (``engine``: ``engine.compile()``;
    ``block``: ``block.compile()`` on every block)."""
    modes: tuple[str, ...] = ("eager", "engine", "block", "plan")
    baselines: tuple[str, ...] = ("engine", "block")


class DeepSpeed(FrameworkBase):
    """DeepSpeed ZeRO 0-3: the model zoo (or a custom factory) set up by ``deepspeed.initialize``
    with the spec's DeepSpeed config, then the strategy's compile (``engine.compile()``,
    ``block.compile()``, or each block's forward between its ZeRO hooks)."""

    api_version = PLUGIN_API_VERSION  # built in: always the current API
    name = NAME
    title = "DeepSpeed"
    capture_style = CaptureStyle.ENGINE_STEPS
    spec_sections = (NAME,)
    strategy_names = ("engine", "block", "none")
    """Strategies a spec may name (``forward`` is the plan's)."""
    default_strategy = "engine"
    root_region = ROOT_REGION
    set_up_words = "deepspeed.initialize"
    run_modes = DeepSpeedRunModes()
    plan_modes = ("engine", "forward", "none")
    plan_section = NAME
    hook_library = FrameworkHooks(
        files=("deepspeed/runtime/zero/",),  # ZeRO's parameter gather/release and its hooks
        components=(Component.ZERO, Component.DEEPSPEED),
    )
    cause_knowledge = DEEPSPEED_CAUSES

    # ---------------------------------------------------------------- strategies and spec

    @property
    def strategies(self) -> Mapping[str, Any]:
        from gbdoctor.frameworks.deepspeed.setup import DS_STRATEGIES

        return DS_STRATEGIES

    def check_spec(
        self, spec: Any, data: Mapping[str, Any], strategy_set: bool, spec_dir: str, ctx: Any
    ) -> Any:
        from gbdoctor.frameworks.deepspeed.spec import check_deepspeed_spec

        return check_deepspeed_spec(spec, data, strategy_set, spec_dir, ctx)

    def check_foreign_spec(self, spec: Any, data: Mapping[str, Any], ctx: Any) -> None:
        from gbdoctor.frameworks.deepspeed.spec import refuse_deepspeed_keys

        refuse_deepspeed_keys(spec, data, ctx)

    def compiles_per_compile_section(self) -> bool:
        # DeepSpeed specs compile as [gbdoctor] strategy says (engine.compile() by default),
        # not as torchtitan's [compile] section would.
        return False

    def zero_stage(self, spec: Any) -> int | None:
        """The spec's ZeRO stage (``ZeroStages``: the setup record of a scan or inspection)."""
        return spec.deepspeed.zero_stage if spec.deepspeed else None

    # ---------------------------------------------------------------- set up and step

    def build(
        self, spec: Any, device_type: str, *, meta: bool = False, max_seq_len: int | None = None
    ) -> tuple[Any, Any]:
        import torch
        import torch.distributed as dist

        from gbdoctor.models import build_model
        from gbdoctor.setup.mesh import Meshes

        torch.manual_seed(spec.training.seed)
        if device_type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device(device_type)
        # ZeRO shards over every rank of the default group: no device mesh of gbdoctor's own.
        meshes = Meshes(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            device=device,
            dp=None,
            ep=None,
            edp=None,
        )
        model = build_model(spec.model, device="meta" if meta else device, max_seq_len=max_seq_len)
        return model, meshes

    def set_up_model(
        self, model: Any, spec: Any, meshes: Any, strategy: Any, options: SetUpOptions
    ) -> Any:
        from gbdoctor.frameworks.deepspeed.setup import apply_deepspeed

        backend_for = options.backend_for
        if backend_for is None:
            chosen = options.backend or spec.compile.backend
            backend_for = lambda _fqn: chosen  # noqa: E731
        return apply_deepspeed(
            model, spec, strategy=strategy, backend_for=backend_for, device=meshes.device.type
        )

    def step_context(self, setup: Any) -> contextlib.AbstractContextManager[None]:
        from gbdoctor.setup.apply import recipe_context

        return recipe_context(setup.dynamo_flags, ac_enabled=False)

    def timed_train_step(
        self, setup: Any, tokens: Any, labels: Any, sync: Any = None
    ) -> tuple[float, tuple[float, float, float]]:
        from gbdoctor.frameworks.deepspeed.setup import timed_engine_step

        return timed_engine_step(setup.engine, tokens, labels, sync)

    def accumulation(self, setup: Any) -> tuple[int, bool]:
        """(gradient_accumulation_steps, whether the next micro-step ends at the accumulation
        boundary: its ``engine.step()`` reduces the gradients and steps the optimizer). An
        optional framework capability ``gbdoctor timeline`` reads when present."""
        engine = setup.engine
        return (
            int(engine.gradient_accumulation_steps()),
            bool(engine.is_gradient_accumulation_boundary()),
        )

    def prepare_ranks(self, device: str) -> None:
        from gbdoctor.frameworks.deepspeed.setup import check_jit_lock

        check_jit_lock(device)  # a stale JIT-build lock hangs every rank: exit 3 first

    def release_rank(self) -> None:
        from gbdoctor.frameworks.deepspeed.setup import cleanup_shared_memory

        cleanup_shared_memory()

    # ---------------------------------------------------------------- engine-step capture

    def engine_setup_info(
        self, spec: Any, strategy: Any, device: str, setup: Any, steps: int
    ) -> Any:
        import torch.distributed as dist

        from gbdoctor.records import SetupInfo
        from gbdoctor.setup.compile import shown_flags

        return SetupInfo(
            strategy=strategy.name,
            device=device,
            world_size=dist.get_world_size(),
            ep_degree=1,
            dp_shard=spec.parallelism.dp_shard,
            ac_mode="none",
            ac_option="",
            fsdp=False,
            dynamo_config=shown_flags(setup.dynamo_flags),
            batch_size=spec.capture_batch_size,
            seq_len=spec.capture_seq_len,
            framework=self.name,
            zero_stage=self.zero_stage(spec),
            steps=steps,
            plan=strategy.plan,
        )

    def engine_notes(
        self, spec: Any, strategy: Any, steps: int, losses: list[float]
    ) -> tuple[str, ...]:
        stage = self.zero_stage(spec)
        notes = [
            f"DeepSpeed ZeRO-{stage}, {strategy.summary}; {steps} training steps captured "
            f"through the engine on every rank (losses {', '.join(f'{x:.4f}' for x in losses)})"
        ]
        if spec.deepspeed and spec.deepspeed.filled:
            notes.append(
                "gbdoctor filled in DeepSpeed config keys the spec leaves out: "
                + ", ".join(spec.deepspeed.filled)
            )
        return tuple(notes)

    # ---------------------------------------------------------------- run and plan

    def propose_plan(self, spec: Any, *, scan_fn: Any, progress: Any) -> Any:
        from gbdoctor.frameworks.deepspeed.plan import propose_deepspeed_plan

        return propose_deepspeed_plan(spec, scan_fn=scan_fn, progress=progress)

    def plan_strategy(self, plan: Any) -> Any:
        from gbdoctor.frameworks.deepspeed.plan import deepspeed_plan_strategy

        return deepspeed_plan_strategy(plan)

    def check_plan(self, plan: Any, name: str, hint: str) -> None:
        from gbdoctor.errors import BaselineError

        if plan.deepspeed.mode not in ("engine", "forward"):
            raise BaselineError(
                f"{name}: $.deepspeed.mode: {plan.deepspeed.mode!r} is not one of engine, forward",
                hint=hint,
            )

    @property
    def emitters(self) -> Mapping[str, Any]:
        from gbdoctor.frameworks.deepspeed.emit import emit_deepspeed

        return {NAME: emit_deepspeed}
