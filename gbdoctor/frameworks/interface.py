"""The public seam every training framework implements: a narrow core (:class:`Framework`) and
optional capabilities, each a ``runtime_checkable`` Protocol that callers test with
``isinstance`` (never ``getattr``).

A framework turns a spec into a model set up for training the way that framework does it, and
answers everything the stages above ask that differs between frameworks. scan, plan, run,
inspect, spec loading and the CLI call only this interface (``registry.framework_for(spec)``),
never a framework by name. Frameworks are found through the ``gbdoctor.frameworks`` entry-point
group (``registry``; ``docs/plugins.md``), and declare the :data:`PLUGIN_API_VERSION` they were
written for.

The core (:class:`Framework`): its spec section, ``build``, ``set_up`` and the training step.
The capabilities a framework may add:

- :class:`Planner`: ``plan`` proposes and applies plans of it;
- :class:`HasEmitters`: ``plan --emit-config`` formats of its own;
- :class:`HasRunModes`: what ``run`` measures for it;
- :class:`Simulation`: a spec too large for local ranks may be simulated (fake process group);
- :class:`MetaModelBuilder`: it builds its own models, on meta too (memory estimates);
- :class:`RegistryRuns`: it names runs by its own config registry, on the command line;
- :class:`EngineStepFramework`: its scans capture whole engine steps;
- :class:`GradientAccumulation`: ``timeline`` reads its accumulation boundaries;
- :class:`OwnHookLibrary`: its library's hooks, where a break is the ``zero-hook`` cause;
- :class:`ZeroStages`: the ZeRO stage a spec sets up, for the setup record;
- :class:`CauseContributor`: what it adds to the cause taxonomy (causes, precedents of fixes,
  upstream bugs its setups hit).

How a scan captures a step (:class:`CaptureStyle`):

- ``per-block``: one fresh capture per block kind, replaying the block's recorded inputs
  (``scan.rank``); real, spawned or simulated ranks (the torchtitan v0.2 mirror);
- ``engine-steps``: whole training steps through the framework's engine inside one capture,
  split per block afterwards (``scan.engine_steps``); real local ranks only, each rank a fresh
  process (DeepSpeed: its hooks depend on the engine's step bookkeeping).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar, NoReturn, Protocol, runtime_checkable

from gbdoctor.causes.contributions import CauseKnowledge
from gbdoctor.causes.hooks import FrameworkHooks
from gbdoctor.records import Plan, ScanReport, SetupInfo, Spec

if TYPE_CHECKING:  # spec loading reads framework objects and must not import torch
    import torch
    import torch.nn as nn

    from gbdoctor.setup.apply import CompileFn, Setup
    from gbdoctor.setup.mesh import Meshes

PLUGIN_API_VERSION = 1
"""The version of this interface. A plug-in declares the one it was written for
(``Framework.api_version``); gbdoctor refuses to load one written for another (exit 2). Raised
when a change to this module would break a plug-in written against the previous one."""

ScanFn = Callable[..., ScanReport]
"""``scan(spec, *, strategy=..., strict=..., recompiles=...)`` as the planner calls it."""
Progress = Callable[[str, int, int], None]
"""(message, done, total) callback for progress bars."""
Emitter = Callable[[Plan], str]
"""A plan as text a user merges into their training code (``plan --emit-config NAME``)."""
TomlTable = Mapping[str, object]
"""A spec file's TOML, as read (section -> table)."""
Backend = str | Callable[..., object]
"""A ``torch.compile`` backend: its registered name, or the backend callable itself."""
Sync = Callable[[], None]
"""Called before each clock read so a phase's time includes its device work
(``torch.cuda.synchronize``)."""


class CaptureStyle(StrEnum):
    """How a scan captures a framework's training step (see the module docstring)."""

    PER_BLOCK = "per-block"
    ENGINE_STEPS = "engine-steps"


class CompileStrategy(Protocol):
    """What every framework's compile strategy is: a frozen dataclass of its own (``plan``
    applies a plan file by ``dataclasses.replace(strategy, plan=identity)``); the fields below
    are what the stages above read, the rest is the framework's."""

    __dataclass_fields__: ClassVar[dict[str, Field[object]]]

    @property
    def name(self) -> str:
        """The name ``[gbdoctor] strategy`` and ``--strategy`` accept."""
        ...

    @property
    def summary(self) -> str:
        """One line for notes and reports."""
        ...

    @property
    def plan(self) -> str | None:
        """The identity of the plan file this strategy applies (None: not from a plan)."""
        ...


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


@runtime_checkable
class Framework(Protocol):
    """The core every framework implements: one training framework's spec section, build, set
    up and training step.

    ``isinstance`` against a Protocol reads every member on Python 3.11, properties included:
    the registry checks the core with ``registry.core_members`` statically instead, so that a
    lazy property (``strategies``, which imports torch) stays lazy."""

    api_version: int
    """The :data:`PLUGIN_API_VERSION` this framework was written for (checked on load)."""
    name: str
    """``[gbdoctor] framework`` value (and ``Plan.framework``, ``SetupInfo.framework``)."""
    title: str
    """How messages name it ("DeepSpeed")."""
    capture_style: CaptureStyle
    spec_sections: tuple[str, ...]
    """TOML sections this framework owns besides the common ones (``[deepspeed]``)."""

    # ---------------------------------------------------------------- strategies and spec

    @property
    def strategies(self) -> Mapping[str, CompileStrategy]:
        """Strategy name -> strategy (the names ``[gbdoctor] strategy`` and ``--strategy``
        accept, in the order messages list them)."""
        ...

    strategy_names: tuple[str, ...]
    """The names of :attr:`strategies`, without importing torch (spec loading)."""
    default_strategy: str

    def check_spec(
        self, spec: Spec, data: TomlTable, strategy_set: bool, spec_dir: str, ctx: SpecContext
    ) -> Spec:
        """The loaded spec completed and checked for this framework (its own sections read,
        what it cannot set up refused with ``ctx.fail``). ``strategy_set``: the spec names a
        strategy (else the framework's default applies)."""
        ...

    def check_foreign_spec(self, spec: Spec, data: TomlTable, ctx: SpecContext) -> None:
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
        strategy: CompileStrategy,
        compile_fn: CompileFn | None = None,
        backend: Backend | None = None,
        build_optimizer: bool | None = None,
        backend_for: Callable[[str], Backend] | None = None,
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
        self, setup: Setup, tokens: torch.Tensor, labels: torch.Tensor, sync: Sync | None = None
    ) -> tuple[float, tuple[float, float, float]]:
        """``train_step`` split into (forward, backward, optimizer) seconds."""
        ...

    def prepare_ranks(self, device: str) -> None:
        """Before ranks start (in the main process): what would otherwise hang every rank."""
        ...

    def release_rank(self) -> None:
        """On each rank after its last step: what the framework leaves behind."""
        ...


# -------------------------------------------------------------------- optional capabilities


@runtime_checkable
class Planner(Protocol):
    """``plan`` proposes plans of this framework and applies them (``scan --plan``, ``run``)."""

    def propose_plan(self, spec: Spec, *, scan_fn: ScanFn, progress: Progress | None) -> Plan:
        """Scan, propose, verify by re-scanning with ``scan_fn``; the plan."""
        ...

    def plan_strategy(self, plan: Plan) -> CompileStrategy:
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


@runtime_checkable
class HasEmitters(Protocol):
    """``plan --emit-config`` formats this framework adds (beside ``json`` and ``python``)."""

    @property
    def emitters(self) -> Mapping[str, Emitter]: ...


@runtime_checkable
class HasRunModes(Protocol):
    """What ``run`` measures for this framework."""

    run_modes: RunModes


@runtime_checkable
class Simulation(Protocol):
    """Whether a spec too large for local ranks may be simulated (fake process group and
    tensors: ``build(meta=True)`` and ``set_up`` work on a fake process group). A framework
    without it, or with ``simulates`` False, is refused with the shrink hint
    (``scan.estimate.require_real``)."""

    simulates: bool


@runtime_checkable
class OwnPipeline(Protocol):
    """Whether pipeline parallelism runs through the framework's own pipeline code on the scan's
    ranks: the scan then trains no schedule of gbdoctor's and runs no recompile probe (its steps
    would run the framework's schedule on one rank at a time). The setup it returns says the
    same per spec (``Setup.own_pipeline``)."""

    own_pipeline: bool


@runtime_checkable
class MetaModelBuilder(Protocol):
    """A framework that builds its own models (not ``models.build_model``) builds them on meta
    for memory estimates."""

    def meta_model(self, spec: Spec) -> nn.Module: ...


@runtime_checkable
class RegistryRuns(Protocol):
    """A framework that names runs by its own config registry instead of a spec file: its
    ``flag`` (``--torchtitan``) on a command, with the framework's own overrides, becomes a
    ``Spec`` whose ``registry_run`` holds the name (``registry.spec_for_run``)."""

    title: str
    """How messages name the framework (the core's ``title``)."""
    flag: str
    """The command-line option that names a run (``MODULE:CONFIG``)."""
    flag_help: str
    """The option's help: what it sets up, what it takes and what follows it."""

    def spec_for_run(
        self,
        name: str,
        args: Sequence[str],
        overrides: Sequence[str] = (),
        *,
        simulate: bool = False,
        world_size: int | None = None,
    ) -> Spec:
        """The spec of the run ``name`` with the framework's own overrides (``args``), ``--set``
        capture settings (``overrides``) and ``simulate``/``world_size`` (which it may refuse)."""
        ...


@runtime_checkable
class EngineStepFramework(Framework, Protocol):
    """A framework whose scans capture whole engine steps (``CaptureStyle.ENGINE_STEPS``)."""

    root_region: str
    """Report row (and whole-model region) for everything outside the blocks."""
    set_up_words: str
    """How progress names the setup call ("deepspeed.initialize")."""

    def engine_setup_info(
        self, spec: Spec, strategy: CompileStrategy, device: str, setup: Setup, steps: int
    ) -> SetupInfo:
        """The setup record of a whole-step capture on this rank."""
        ...

    def engine_notes(
        self, spec: Spec, strategy: CompileStrategy, steps: int, losses: list[float]
    ) -> tuple[str, ...]:
        """What a whole-step capture's report says about the setup it captured."""
        ...


@runtime_checkable
class OwnHookLibrary(Protocol):
    """A framework whose own library hooks the model's modules (DeepSpeed's ZeRO gathers and
    releases parameters in hooks): a break inside them is the ``zero-hook`` cause."""

    hook_library: FrameworkHooks


@runtime_checkable
class CauseContributor(Protocol):
    """A framework that adds to the cause taxonomy: causes only its setups meet (DeepSpeed's
    ``zero-hook``), precedents of generic fixes (torchtitan's order: compile, then FSDP) and the
    upstream bugs its setups hit. ``registry.cause_taxonomy`` combines every framework's with
    the generic taxonomy (``causes.contributions``), which names no framework."""

    cause_knowledge: CauseKnowledge


@runtime_checkable
class ZeroStages(Protocol):
    """A framework that shards by ZeRO stage (DeepSpeed): the stage a spec sets up, recorded in
    the setup record of its scans and inspections (``SetupInfo.zero_stage``)."""

    def zero_stage(self, spec: Spec) -> int | None:
        """The ZeRO stage ``spec`` sets up (None: the spec sets none)."""
        ...


@runtime_checkable
class GradientAccumulation(Protocol):
    """A framework that accumulates gradients over micro-steps (``timeline`` marks the steps
    that end at a boundary)."""

    def accumulation(self, setup: Setup) -> tuple[int, bool]:
        """(gradient_accumulation_steps, whether the next micro-step ends at the accumulation
        boundary)."""
        ...
