"""The seam every training framework implements (:class:`Framework`).

A framework turns a spec into a model set up for training the way that framework does it, and
answers everything the stages above ask that differs between frameworks: which compile
strategies and run modes it has, how a spec of it is checked, how a scan captures its step, how
a plan is proposed and applied. scan, plan, run, inspect, spec loading and the CLI call only
this interface (``registry.framework_for(spec)``), never a framework by name.

How a scan captures a step (:class:`CaptureStyle`):

- ``per-block``: one fresh capture per block kind, replaying the block's recorded inputs
  (``scan.rank``); real, spawned or simulated ranks (the torchtitan v0.2 mirror);
- ``engine-steps``: whole training steps through the framework's engine inside one capture,
  split per block afterwards (``scan.engine_steps``); real local ranks only, each rank a fresh
  process (DeepSpeed: its hooks depend on the engine's step bookkeeping).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from gbdoctor.records import Plan, ScanReport, SetupInfo, Spec

if TYPE_CHECKING:  # spec loading reads framework objects and must not import torch
    import torch
    import torch.nn as nn

    from gbdoctor.setup.apply import CompileFn, Setup
    from gbdoctor.setup.mesh import Meshes

ScanFn = Callable[..., ScanReport]
"""``scan(spec, *, strategy=..., strict=..., recompiles=...)`` as the planner calls it."""
Progress = Callable[[str, int, int], None]
"""(message, done, total) callback for progress bars."""
Emitter = Callable[[Plan], str]
"""A plan as text a user merges into their training code (``plan --emit-config NAME``)."""


class CaptureStyle(StrEnum):
    """How a scan captures a framework's training step (see the module docstring)."""

    PER_BLOCK = "per-block"
    ENGINE_STEPS = "engine-steps"


class SpecContext(Protocol):
    """What a framework's spec check may use of the loader's context (``frameworks.common.specfile.SpecContext``)."""

    path: str

    def where(self, section: str, key: str) -> str:
        """``section.key``, plus ``(from --set ...)`` when an override set it."""
        ...

    def fail(self, message: str, hint: str | None = None) -> NoReturn:
        """Raise the one-line SpecError (exit 2) for this spec file."""
        ...


class RunModes(Protocol):
    """``run``'s modes of a framework."""

    strategies: Mapping[str, str]
    """Mode -> strategy name (``Framework.strategies``); modes made from a plan are not here."""
    modes: tuple[str, ...]
    """Every mode, in the order ``run`` lists them."""
    baselines: tuple[str, ...]
    """Modes that compete for "best baseline"."""


class Framework(Protocol):
    """One training framework's setup, step, capture style, planner and spec section."""

    name: str
    """``[gbdoctor] framework`` value (and ``Plan.framework``, ``SetupInfo.framework``)."""
    title: str
    """How messages name it ("DeepSpeed")."""
    capture_style: CaptureStyle
    simulates: bool
    """Whether a spec too large for local ranks may be simulated (fake process group and
    tensors). A framework that cannot is refused with the shrink hint (``require_real``)."""
    spec_sections: tuple[str, ...]
    """TOML sections this framework owns besides the common ones (``[deepspeed]``)."""

    # ---------------------------------------------------------------- strategies and spec

    @property
    def strategies(self) -> Mapping[str, Any]:
        """Strategy name -> strategy (the names ``[gbdoctor] strategy`` and ``--strategy``
        accept, in the order messages list them)."""
        ...

    strategy_names: tuple[str, ...]
    """The names of :attr:`strategies`, without importing torch (spec loading)."""
    default_strategy: str

    def check_spec(
        self, spec: Spec, data: Mapping[str, Any], strategy_set: bool, spec_dir: str, ctx: Any
    ) -> Spec:
        """The loaded spec completed and checked for this framework (its own sections read,
        what it cannot set up refused with ``ctx.fail``). ``strategy_set``: the spec names a
        strategy (else the framework's default applies)."""
        ...

    def check_foreign_spec(self, spec: Spec, data: Mapping[str, Any], ctx: Any) -> None:
        """Refuse this framework's own sections and keys in a spec of another framework."""
        ...

    def compiles_per_compile_section(self) -> bool:
        """Whether the spec's ``[compile]`` section decides what training compiles (so a spec
        that disables it gets the "would not compile the blocks" note)."""
        ...

    # ---------------------------------------------------------------- set up and step

    def build(
        self, spec: Spec, device_type: str, *, meta: bool = False, max_seq_len: int | None = None
    ) -> tuple[nn.Module, Meshes]:
        """The model (seeded from the spec, on the mesh device, or on ``meta``) and its meshes.
        The process group must be initialized."""
        ...

    def set_up(
        self,
        model: nn.Module,
        spec: Spec,
        meshes: Meshes,
        *,
        strategy: Any,
        compile_fn: CompileFn | None = None,
        backend: str | None = None,
        build_optimizer: bool | None = None,
        backend_for: Callable[[str], Any] | None = None,
    ) -> Setup:
        """Apply the framework's setup: compile regions with ``compile_fn`` (scans pass a
        recording backend) or ``torch.compile(backend=backend)`` (``None``: the spec's backend).
        Frameworks that compile in place (DeepSpeed's ``engine.compile()``) take the backend of
        a region from ``backend_for(region_fqn)`` instead (scans pass a recording backend)."""
        ...

    def step_context(self, setup: Setup) -> contextlib.AbstractContextManager[None]:
        """The Dynamo settings training steps (and captures) run under."""
        ...

    def train_step(self, setup: Setup, tokens: torch.Tensor, labels: torch.Tensor) -> float:
        """Forward, backward, optimizer step; returns the global loss."""
        ...

    def timed_train_step(
        self, setup: Setup, tokens: torch.Tensor, labels: torch.Tensor, sync: Any = None
    ) -> tuple[float, tuple[float, float, float]]:
        """``train_step`` split into (forward, backward, optimizer) seconds."""
        ...

    def prepare_ranks(self, device: str) -> None:
        """Before ranks start (in the main process): what would otherwise hang every rank."""
        ...

    def release_rank(self) -> None:
        """On each rank after its last step: what the framework leaves behind."""
        ...

    # ---------------------------------------------------------------- run and plan

    run_modes: RunModes

    def propose_plan(self, spec: Spec, *, scan_fn: ScanFn, progress: Progress | None) -> Plan:
        """Scan, propose, verify by re-scanning with ``scan_fn``; the plan."""
        ...

    def plan_strategy(self, plan: Plan) -> Any:
        """The strategy that applies ``plan`` (a plan of this framework)."""
        ...

    plan_modes: tuple[str, ...]
    """``KindPlan.mode`` values a plan file of this framework may hold."""

    def check_plan(self, plan: Plan, name: str, hint: str) -> None:
        """BaselineError (exit 2) when a plan file of this framework is impossible."""
        ...

    plan_section: str | None
    """The ``Plan`` field this framework's plans fill (``Plan.deepspeed``), if any: a plan has
    it exactly when it is this framework's."""

    emitters: Mapping[str, Emitter]
    """``plan --emit-config`` formats this framework adds."""


class EngineStepFramework(Framework, Protocol):
    """A framework whose scans capture whole engine steps (``CaptureStyle.ENGINE_STEPS``)."""

    root_region: str
    """Report row (and whole-model region) for everything outside the blocks."""
    set_up_words: str
    """How progress names the setup call ("deepspeed.initialize")."""

    def engine_setup_info(
        self, spec: Spec, strategy: Any, device: str, setup: Setup, steps: int
    ) -> SetupInfo:
        """The setup record of a whole-step capture on this rank."""
        ...

    def engine_notes(
        self, spec: Spec, strategy: Any, steps: int, losses: list[float]
    ) -> tuple[str, ...]:
        """What a whole-step capture's report says about the setup it captured."""
        ...
