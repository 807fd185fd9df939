"""Every vocabulary that appears in gbdoctor's JSON, as a ``StrEnum``.

Values are the exact strings the JSON has always carried (kebab-case ids, plus the
snake_case event kinds and compile-mode names that predate this module), so a ``StrEnum``
member serializes, compares and hashes as its value: records may hold either a member or the
plain string and the JSON bytes do not change.
"""

from __future__ import annotations

from enum import StrEnum


class CauseId(StrEnum):
    """Cause ids of the taxonomy, the frameworks' causes included (``Break.cause``;
    ``frameworks.registry.cause_taxonomy``)."""

    ZERO_HOOK = "zero-hook"
    FSDP_HOOK = "fsdp-hook"
    EP_DISPATCH = "ep-dispatch"
    BACKWARD_HOOK = "backward-hook"
    INPLACE_IN_SAC = "inplace-in-sac"
    TENSOR_PARALLEL = "tensor-parallel"
    MOE_LOAD_BALANCING = "moe-load-balancing"
    DATA_DEPENDENT = "data-dependent"
    COLLECTIVE = "collective"
    COMPILER_DISABLED = "compiler-disabled"
    EXPLICIT = "explicit"
    PYTHON_SIDE_EFFECT = "python-side-effect"
    ERROR = "error"
    UNSUPPORTED = "unsupported"


class Component(StrEnum):
    """Who installed the code that broke (``Break.component``, ``HookInfo.installer``).

    A hook the setup did not install is ``user-hook`` when it is where a break happened (a
    break's component) and ``user`` when listed by ``inspect`` (a hook's installer): both
    spellings are in stored scans and baselines, so both stay; :meth:`of_user_hook` names
    the one choice in one place.
    """

    MODEL = "model"
    FSDP = "fsdp"
    ZERO = "zero"
    """DeepSpeed ZeRO (its parameter gather/release and pre-backward hooks)."""
    DEEPSPEED = "deepspeed"
    """The rest of DeepSpeed: the engine's own module hooks (``runtime/engine.py``)."""
    EP = "ep"
    TP = "tp"
    LOAD_BALANCING = "load-balancing"
    USER_HOOK = "user-hook"
    USER = "user"
    TORCH = "torch"


class BlockerKind(StrEnum):
    """What in a compiled graph stands between it and a CUDA graph (``capture/cudagraphs.py``)."""

    MUTATED_INPUT = "mutated-input"
    INPUT_COPY = "input-copy"
    """A non-static input: copied into the recorded buffer on every replay."""
    SYMINT_INPUT = "symint-input"
    RNG_STATE = "rng-state"
    HOST_SYNC = "host-sync"
    CPU_TENSOR = "cpu-tensor"
    COLLECTIVE = "collective"
    DYNAMIC_SHAPE = "dynamic-shape"
    RELEASED_STATIC_INPUT = "released-static-input"
    """A static input (a parameter) whose memory the training setup frees after the step (FSDP2
    reshards the unsharded parameter): re-gathered at another address, so
    inductor's cudagraph trees re-record (pytorch/pytorch#183451)."""


class BlockerEffect(StrEnum):
    """What a CUDA-graph finding costs."""

    BLOCKS = "blocks"
    """Inductor would skip cudagraphs for the graph."""
    COPY = "copy"
    """A copy per replay."""
    RERECORD = "re-record"
    """A new recording per distinct value or shape."""
    ALLOWED = "allowed"
    """Capturable, with the caveat in the detail."""


class Readiness(StrEnum):
    """``CudaGraphReadiness.status``."""

    READY = "ready"
    BLOCKED = "blocked"
    EAGER = "eager"
    """Nothing compiled to graph: a break sent the region to eager (a break inside its
    activation-checkpoint region, a frame Dynamo abandoned); the summary names the break to fix
    first."""
    UNKNOWN = "unknown"
    """Nothing compiled was captured, and no break says why."""


class EventKind(StrEnum):
    """``Event.kind``."""

    REGION_EAGER = "region_eager"
    """An AC/SAC region fell back to eager."""
    FRAME_SKIPPED = "frame_skipped"
    """A whole frame ran eager."""
    RANK_DIVERGENCE = "rank_divergence"
    """Ranks captured different graphs or breaks."""
    RECOMPILE_LIMIT = "recompile_limit"
    """Dynamo hit ``recompile_limit`` on some code, which runs eagerly from then on."""
    PIPELINE_CRASH = "pipeline_crash"
    """A pipeline schedule's real training step crashed with this block compiled (a PP scan runs
    the schedule on its ranks): the detail names the error, the workaround and the issue."""
    DIVERGENCE = "divergence"
    """Not a block's event: the gate's count, per kind, of the breaks some ranks meet and others
    do not (``ScanReport.divergence``), kept with the events in a baseline; a rise fails."""


class DivergenceCause(StrEnum):
    """``RankDivergence.cause``: why a rank compiles a block differently from another."""

    RANK_CONDITIONAL = "rank-conditional"
    """Code that runs on some ranks only (``if rank == 0: print(...)``, a rank-0 metric): a
    break that the other ranks never meet, at a statement they never run."""
    PER_RANK_DATA = "per-rank-data"
    """Every rank meets the same data-dependent break (``.item()``, a branch on a tensor),
    then the ranks' data sends them down different code with different breaks."""
    PER_RANK_SHAPE = "per-rank-shape"
    """The ranks' inputs have different shapes, so their graphs are guarded (or broken) on
    different sizes."""


class CollectiveHazard(StrEnum):
    """``RankDivergence.hazard``: can this divergence desynchronize collectives in training?"""

    CAN_DESYNC = "can-desync"
    """Collectives run inside the block's compiled regions (tensor or expert parallel), or the
    differing break is a collective: a rank that breaks or recompiles there where another does
    not issues them from other graphs, in another order or count, and the job can hang."""
    CANNOT_DESYNC = "cannot-desync"
    """The block's collectives run outside its compiled regions (FSDP's all-gather and
    reduce-scatter in its hooks): the extra break only splits one rank's graph between
    collectives, which run the same on every rank."""


class DedupeProof(StrEnum):
    """``BlockReport.dedupe``: how a layer came to share another's capture, or why not."""

    GUARDS_PASS = "guards-pass"
    """Shares the capture: the representative's compiled code runs on this layer unchanged
    (every Dynamo guard of every frame passes on this layer's module and inputs)."""
    RETRACED_SAME = "retraced-same"
    """Shares the capture: a guard failed (a per-layer attribute, a run-time value stored on
    the module or handed across a break: ``___stack0 == 8``), and re-tracing the frames whose
    guards failed met exactly the breaks the representative met in those frames."""
    GUARDS_FAIL = "guards-fail"
    """Captured on its own: a guard of the representative's code fails on this layer, and
    re-traced, it breaks differently (it branches on a per-layer attribute)."""
    UNPROVABLE = "unprovable"
    """No proof possible: Dynamo abandoned a frame of the representative (skipped code has no
    guards to check), so this layer was captured on its own; or the representative did not
    trace at all, so this layer shares its error record, unproven (``same_as`` set)."""


class Severity(StrEnum):
    """Gate finding severities, most severe first."""

    REGRESSION = "regression"
    WARNING = "warning"
    IMPROVEMENT = "improvement"
    INFO = "info"


class ModeStatus(StrEnum):
    """``ModeResult.status``."""

    OK = "ok"
    FAILED = "failed"
    UNAVAILABLE = "unavailable"
    """The mode cannot run here (``cudagraphs`` without a CUDA device): not run, not faked."""


class ModeFailure(StrEnum):
    """``ModeResult.error_kind``: why a mode failed."""

    GRAPH_BREAK = "graph-break"
    """A fullgraph compile hit a break: a finding about the mode, not a failure of the run."""
    RECOMPILE_LIMIT = "recompile-limit"
    """A fullgraph region hit ``recompile_limit``."""
    COMPILE = "compile"
    """Another Dynamo or backend error."""
    RUNTIME = "runtime"
    """The training step raised."""
    SETUP = "setup"
    TIMEOUT = "timeout"
    """A rank did not finish within the job's limit."""
    CRASH = "crash"
    """A rank died (killed, out of memory, exited without a result)."""


ENVIRONMENT_FAILURES = frozenset({ModeFailure.TIMEOUT, ModeFailure.CRASH})
"""Mode failures that say nothing about the mode: the run itself failed (``run`` exits 3)."""


class Verdict(StrEnum):
    """``ModeResult.verdict_vs_*``: a ratio judged by its per-round spread."""

    FASTER = "faster"
    """Every round's ratio is above 1."""
    SLOWER = "slower"
    """Every round's ratio is below 1."""
    WITHIN_NOISE = "within noise"
    """The spread contains 1: not a speedup."""
    NO_SPREAD = "no spread"
    """A single round: no spread, so no verdict."""


class CompileMode(StrEnum):
    """How a block kind is compiled (``BlockRecipe.mode``, ``KindPlan.mode``)."""

    BLOCK = "block"
    """The whole block is one compiled region."""
    CHILDREN = "children"
    """The block's children are compiled; listed ones stay eager."""
    NONE = "none"
    """Nothing in the block is compiled."""


class ACMode(StrEnum):
    """``[activation_checkpoint] mode`` (torchtitan's values)."""

    NONE = "none"
    FULL = "full"
    SELECTIVE = "selective"
    MEMORY_BUDGET = "memory_budget"


class OutputFormat(StrEnum):
    """``--format`` values, the only source of format names; each command accepts those its
    printout has renderers for (``report.formats.RENDERERS``)."""

    TABLE = "table"
    JSON = "json"
    MARKDOWN = "markdown"
    JUNIT = "junit"
    GITHUB = "github"
    HTML = "html"


class SlowCause(StrEnum):
    """What makes a training step of ``gbdoctor timeline`` slow (``TimelineFinding.cause``)."""

    RECOMPILE = "recompile"
    """A guard of a compiled frame failed and Dynamo compiled it again in this step."""
    EAGER_FALLBACK = "eager-fallback"
    """The frame hit ``recompile_limit``; calls that match no cache entry run eagerly."""
    ACCUMULATION_BOUNDARY = "accumulation-boundary"
    """Periodic by design: the gradient accumulation boundary (gradient reduction, the
    optimizer step) runs every k-th micro-step."""
    INPUT_SIZE = "input-size"
    """Periodic by design: the step has more tokens than the others."""


class GuardKind(StrEnum):
    """The kind of guard that failed (``TimelineFinding.guard_kind``)."""

    INT_ATTRIBUTE = "int-attribute"
    """An ``int`` attribute of a module (or object) specialised as a constant."""
    CONSTANT = "constant"
    """Another Python value (str, float, bool, ...) specialised as a constant."""
    TENSOR_SIZE = "tensor-size"
    """A tensor's size (or stride) differs from the compiled one."""
    LENGTH = "length"
    """The length of a list, tuple or dict changed."""
    IDENTITY = "identity"
    """A different object (id or type match)."""
    OTHER = "other"


class FixKind(StrEnum):
    """A fix ``gbdoctor timeline --fix`` can apply and verify (``TimelineFix.kind``)."""

    UNSPEC_INT = "unspec-int"
    """``torch._dynamo.config.allow_unspec_int_on_nn_module = True`` (or move the counter out
    of the module / into a tensor)."""
    DYNAMIC_SHAPES = "dynamic-shapes"
    """Compile the sizes as dynamic from the start (``mark_dynamic`` / ``dynamic=True``)."""
    WIDER_CACHE = "wider-cache"
    """A larger ``recompile_limit``: only where the variants are few and bounded."""
    NONE = "none"
    """Nothing to fix (periodic by design)."""


class Launcher(StrEnum):
    """What started the ranks of a scan (``SetupInfo.launcher``; ``launcher.detect``)."""

    SELF = "self"
    """gbdoctor spawned its own local ranks (or ran world size 1 itself)."""
    TORCHRUN = "torchrun"
    """torchrun / torch.distributed.run (torchelastic: ``TORCHELASTIC_RUN_ID`` is set)."""
    DEEPSPEED = "deepspeed"
    """The DeepSpeed launcher (``deepspeed``: env:// variables plus ``LOCAL_SIZE``/``CROSS_SIZE``)."""
    SLURM = "slurm"
    """Slurm's ``srun`` (``SLURM_PROCID``/``SLURM_NTASKS`` of a job step)."""
    ENV = "env"
    """Another launcher that sets torch's env:// variables (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``)."""


class Counterfactual(StrEnum):
    """``KindPrice.counterfactual``: the step a kind's price is measured against."""

    PLAN_FIX = "plan-fix"
    """The plan's verified recipe for the kind (its breaks removed)."""
    EAGER = "eager"
    """The plan has no verified fix for the kind: the kind left uncompiled, so the price says
    what compiling it with its breaks gains or loses against not compiling it."""


class Clock(StrEnum):
    """``PriceReport.clock``: which time a step is measured in."""

    WALL = "wall"
    """Elapsed time of the step (slowest rank): what training feels, and what another process
    on the machine inflates."""
    CPU = "cpu"
    """CPU time of each rank's process in the step (every thread; slowest rank): the work the
    step does, barely moved by other processes; blind to time spent waiting (an idle wait for a
    peer). CPU devices only."""


class PriceSplit(StrEnum):
    """``BreakPrice.split``: how a kind's price was divided among its distinct breaks."""

    WHOLE_KIND = "whole-kind"
    """The kind has one distinct break: it carries the whole price."""
    EAGER_TIME = "eager-time"
    """In proportion to the eager time the profiler saw in each break's frame."""
    EVEN = "even"
    """The profiler attributed no eager time to these breaks: divided evenly (a guess, labelled)."""
