"""The DeepSpeed setup (behind ``frameworks.deepspeed.DeepSpeed``, the seam's second
implementation): ``deepspeed.initialize`` (ZeRO 0-3) on the real process group (gloo on CPU,
nccl on CUDA), then the compile call users write. A model and a spec in, a
:class:`~gbdoctor.setup.apply.Setup` out (blocks, compiled regions, the engine that runs the
training step), so scan, plan, run and inspect drive both frameworks the same way.

Compile strategies (``[gbdoctor] strategy``):

- ``engine``: ``engine.compile()``, which is ``nn.Module.compile`` on the whole model, so ZeRO-3's
  parameter gather/release and pre-backward hooks on every sub-module sit inside the region;
- ``block``: ``block.compile()`` in place on every block after ``initialize`` (the block's own
  ZeRO hooks and those of its children are inside each region);
- ``none``: eager;
- ``forward`` (what ``gbdoctor plan`` proposes under ZeRO-3): every block is a ZeRO-3 *leaf
  module* (``zero_optimization.leaf_module``: DeepSpeed gathers the whole block's parameters in
  the block's own hooks and installs none on its children), and the block's ``forward`` is
  compiled, so the compiled region sits between the block's pre- and post-forward hooks.

``torch.compile(block)`` wrappers are not offered: under ZeRO-3 they fail in the engine's
forward prologue (the OptimizedModule forwards ``setattr(_parameters)`` to the wrapped module;
reference/deepspeed-cpu-probe.md, experiment 3).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gbdoctor.errors import SetupError, SpecError
from gbdoctor.frameworks.deepspeed import ROOT_REGION

DEFAULT_LR = 8e-4


@dataclass(frozen=True, kw_only=True, slots=True)
class DeepSpeedStrategy:
    name: str
    mode: str
    """``engine``, ``block``, ``forward`` or ``none``."""
    fullgraph: bool = False
    leaf_blocks: bool = False
    """Make every block a ZeRO-3 leaf module (hooks on the block only, none on its children)."""
    flags: tuple[tuple[str, Any], ...] = ()
    summary: str = ""
    plan: str | None = None
    """Identity of the plan file this strategy applies (``plan.json sha256:...``)."""


DS_STRATEGIES: dict[str, DeepSpeedStrategy] = {
    s.name: s
    for s in (
        DeepSpeedStrategy(
            name="engine",
            mode="engine",
            summary="engine.compile(): the whole model, ZeRO hooks inside the region",
        ),
        DeepSpeedStrategy(
            name="block",
            mode="block",
            summary="block.compile() in place on every block after deepspeed.initialize",
        ),
        DeepSpeedStrategy(name="none", mode="none", summary="no compile (eager)"),
    )
}


def forward_strategy(
    *,
    leaf_blocks: bool,
    fullgraph: bool,
    flags: tuple[tuple[str, Any], ...] = (),
    name: str = "plan",
) -> DeepSpeedStrategy:
    return DeepSpeedStrategy(
        name=name,
        mode="forward",
        fullgraph=fullgraph,
        leaf_blocks=leaf_blocks,
        flags=flags,
        summary="blocks as ZeRO-3 leaf modules, each block's forward compiled between its hooks"
        if leaf_blocks
        else "each block's forward compiled",
    )


# --------------------------------------------------------------------------- config


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@contextlib.contextmanager
def quiet_deepspeed() -> Iterator[None]:
    """DeepSpeed logs every config it parses at INFO and the accelerator choice at WARNING;
    gbdoctor's stdout is the report, so only errors get through while it works."""
    if not _cuda_available():
        # Without it DeepSpeed probes for accelerators and warns on stdout that it chose CPU.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    logger = logging.getLogger("DeepSpeed")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def fill_config(raw: dict[str, Any], *, micro_batch: int) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The config DeepSpeed will receive: the user's, plus what gbdoctor must fill in to run it
    (a micro-batch size when no batch key is given; a torch AdamW when no optimizer is, which
    needs no JIT build on CPU). Returns (config, filled keys)."""
    cfg = copy.deepcopy(raw)
    filled = []
    if not any(k in cfg for k in _BATCH_KEYS):
        cfg["train_micro_batch_size_per_gpu"] = micro_batch
        filled.append(f"train_micro_batch_size_per_gpu={micro_batch}")
    if "optimizer" not in cfg:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": DEFAULT_LR, "torch_adam": True}}
        filled.append("optimizer=AdamW(torch_adam)")
    return cfg, tuple(filled)


def validate_config(cfg: dict[str, Any], *, world_size: int, where: str) -> int:
    """Validate ``cfg`` with DeepSpeed's own config classes (``DeepSpeedConfig``: every section's
    pydantic model forbids unknown keys). Returns the ZeRO stage. SpecError (exit 2) with
    DeepSpeed's message when DeepSpeed rejects it."""
    try:
        import pydantic

        with quiet_deepspeed():
            from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        raise SpecError(
            f"{where}: framework = 'deepspeed' needs the deepspeed package",
            hint='pip install "gbdoctor[deepspeed]"',
        ) from None
    check = copy.deepcopy(cfg)
    # Off the process group DeepSpeedConfig assumes one rank: give it this spec's batch per rank.
    if isinstance(check.get("train_batch_size"), int) and world_size > 1:
        if check["train_batch_size"] % world_size:
            raise SpecError(
                f"{where}: train_batch_size = {check['train_batch_size']} is not a multiple of "
                f"the world size {world_size}",
                hint="train_batch_size = micro batch x gradient accumulation x world size",
            )
        check["train_batch_size"] //= world_size
    try:
        with quiet_deepspeed():
            parsed = DeepSpeedConfig(check)
    except pydantic.ValidationError as exc:
        raise SpecError(
            f"{where}: DeepSpeed rejects the config: {_one_line(exc)}",
            hint="fix or remove the key DeepSpeed names (DeepSpeed's config docs list the valid ones)",
        ) from None
    except (AssertionError, ValueError, KeyError, TypeError) as exc:
        raise SpecError(
            f"{where}: DeepSpeed rejects the config: {type(exc).__name__}: {_one_line(exc)}",
            hint="fix the value DeepSpeed names",
        ) from None
    return int(parsed.zero_optimization_stage)


def _one_line(exc: BaseException) -> str:
    """pydantic's multi-line message as one line: ``2 validation errors for CompileConfig:
    enabled: Extra inputs are not permitted; backend: ...``."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("For further information")]
    if not lines:
        return type(exc).__name__
    head, rest = lines[0], lines[1:]
    pairs = []
    i = 0
    while i < len(rest):
        field_line = rest[i]
        detail = rest[i + 1] if i + 1 < len(rest) else ""
        pairs.append(f"{field_line}: {detail.split(' [type=')[0]}" if detail else field_line)
        i += 2
    return head + (": " + "; ".join(pairs) if pairs else "")


def load_config_file(path: str, where: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SpecError(
            f"{where}: DeepSpeed config {path} not found",
            hint="deepspeed_config is a path relative to the spec file",
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{where}: DeepSpeed config {path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{where}: DeepSpeed config {path} must be a JSON object")
    return data


# --------------------------------------------------------------------------- setup


def qualified_class(module: Any) -> str:
    """How ``zero_optimization.leaf_module.classes`` names a block class: ``package.module.Cls``,
    or the bare class name (DeepSpeed matches either) for a model file loaded by path, whose
    module name exists only inside gbdoctor."""
    import sys

    cls = type(module)
    importable = (
        cls.__module__ in sys.modules
        and getattr(sys.modules[cls.__module__], "__spec__", None) is not None
        and not cls.__module__.startswith("gbdoctor_factory_")
    )
    return f"{cls.__module__}.{cls.__qualname__}" if importable else cls.__name__


def apply_deepspeed(
    model: Any,
    spec: Any,
    *,
    strategy: DeepSpeedStrategy,
    backend_for: Callable[[str], Any],
    device: str,
) -> Any:
    """``deepspeed.initialize`` on the current process group, then ``strategy``'s compile.

    ``backend_for(region_fqn)`` gives the Dynamo backend of a region (a name, or a recording
    backend for scans). Returns a :class:`Setup` whose ``engine`` runs the training step."""
    import torch

    from gbdoctor.models.structure import find_moe_layers, hidden_size
    from gbdoctor.setup.apply import BlockSlot, Setup, block_slots

    if spec.deepspeed is None:
        raise SetupError(
            "the spec has no DeepSpeed config", hint='set [gbdoctor] framework = "deepspeed"'
        )
    cfg = json.loads(spec.deepspeed.config_json)
    if cfg.get("compile", {}).get("deepcompile") and device != "cuda":
        raise SetupError(
            "DeepCompile (compile.deepcompile = true) needs CUDA: its C++ extension does not build "
            "without cuda.h",
            hint="drop compile.deepcompile on CPU, or run on a GPU",
        )
    raw = block_slots(model, spec.gbdoctor.blocks or None)
    # Found by structure before ZeRO-3 partitions the parameters (their shapes become empty).
    hidden = hidden_size(model)
    moe_blocks = {fqn for fqn, _, block in raw if find_moe_layers(block, hidden)}
    if strategy.leaf_blocks:
        zero = cfg.setdefault("zero_optimization", {})
        leaf = zero.setdefault("leaf_module", {})
        classes = list(leaf.get("classes", []))
        leaf["classes"] = classes + sorted({qualified_class(b) for _, _, b in raw} - set(classes))
    # DeepSpeed 0.19.8 calls collectives that torch 2.13 deprecates: one FutureWarning per call,
    # every step, on stderr. DeepSpeed ranks are processes of their own, so the filter is too.
    warnings.filterwarnings(
        "ignore", category=FutureWarning, message=r"`torch\.distributed\.\w+` is deprecated"
    )
    with quiet_deepspeed():
        import deepspeed
        import deepspeed.utils.nvtx

        # engine.compile() switches DeepSpeed's nvtx wrappers off process-wide; every setup
        # starts from what a fresh training process has.
        deepspeed.utils.nvtx.enable_nvtx = True
        try:
            engine, _, _, _ = deepspeed.initialize(
                model=model, model_parameters=model.parameters(), config=cfg
            )
        except Exception as exc:  # DeepSpeed raises many types for a bad setup
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise SetupError(
                f"deepspeed.initialize failed: {type(exc).__name__}: {first}",
                hint="check the DeepSpeed config (`gbdoctor --debug ...` for the traceback)",
            ) from exc
    module = engine.module
    slots = []
    # The blocks found before initialize: ZeRO-3 has emptied their parameters since, and the
    # engine wraps the same module objects.
    for fqn, key, block in raw:
        is_moe = fqn in moe_blocks
        regions: tuple[str, ...] = ()
        if strategy.mode == "block":
            block.compile(backend=backend_for(fqn), fullgraph=strategy.fullgraph)
            regions = (fqn,)
        elif strategy.mode == "forward":
            block.forward = torch.compile(
                block.forward, backend=backend_for(fqn), fullgraph=strategy.fullgraph
            )
            regions = (fqn,)
        slots.append(
            BlockSlot(
                fqn=fqn,
                key=key,
                block=block,
                outer=block,
                is_moe=is_moe,
                kind="moe" if is_moe else "dense",
                regions=regions,
                fullgraph_regions=regions if strategy.fullgraph else (),
            )
        )
    if strategy.mode == "engine":
        engine.compile(
            backend=backend_for(ROOT_REGION), compile_kwargs={"fullgraph": strategy.fullgraph}
        )
    elif strategy.mode not in ("block", "forward", "none"):
        raise SetupError(f"unknown DeepSpeed compile mode {strategy.mode!r}")
    return Setup(
        model=module,
        blocks=slots,
        optimizer=None,
        strategy=strategy,
        meshes=None,
        fsdp=False,
        engine=engine,
    )


def cleanup_shared_memory() -> list[str]:
    """Remove the ``/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>`` files of this
    job. DeepSpeed's CPU shm comm op creates them when every rank is local (``LOCAL_SIZE`` equals
    the world size, as the ``deepspeed`` launcher sets it) and never removes them (2 x 66 MB at
    world size 2, reference/deepspeed-cpu-probe.md). gbdoctor's ranks do not set LOCAL_SIZE, but
    a user's environment may."""
    removed: list[str] = []
    shm = "/dev/shm"
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not os.path.isdir(shm) or not addr or not port:
        return removed
    prefix = f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_"
    for name in sorted(os.listdir(shm)):
        if name.startswith(prefix):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(shm, name))
                removed.append(name)
    return removed


SHM_OP = "deepspeed_shm_comm"
"""The one op DeepSpeed JIT-builds for a CPU run (its shm comm op, at ``deepspeed.initialize``)."""
JIT_LOCK_WAIT_S = 60.0
"""How long :func:`check_jit_lock` waits for another process's build to release the lock."""


def jit_build_dir(name: str = SHM_OP) -> str:
    """Where torch's ``cpp_extension.load`` builds DeepSpeed's op ``name``:
    ``$TORCH_EXTENSIONS_DIR/<name>``, else torch's per-user default."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        from torch.utils import cpp_extension

        try:
            return cpp_extension._get_build_directory(name, verbose=False)
        except Exception:  # noqa: BLE001 - a private torch helper: fall back to its documented root
            root = cpp_extension.get_default_build_root()
    return os.path.join(root, name)


def check_jit_lock(
    device: str, *, wait_s: float = JIT_LOCK_WAIT_S, poll_s: float = 0.5, name: str = SHM_OP
) -> None:
    """Before DeepSpeed ranks start on CPU: torch's JIT build lock of DeepSpeed's shm comm op
    must not be held. torch's ``FileBaton`` waits for a ``lock`` file forever, and a build that
    was killed (Ctrl-C, a rank timeout) leaves it behind: every later rank would hang at
    ``deepspeed.initialize`` until the rank timeout. A lock that another build holds goes away
    within ``wait_s``; one that stays is a SetupError (exit 3) naming the directory to delete."""
    if device != "cpu":
        return
    build_dir = jit_build_dir(name)
    lock = os.path.join(build_dir, "lock")
    waited = 0.0
    while os.path.exists(lock):
        if waited >= wait_s:
            try:
                age = f"{(time.time() - os.path.getmtime(lock)) / 60:.0f} min old"
            except OSError:
                return  # released just now
            raise SetupError(
                f"DeepSpeed's JIT build lock {lock} is still held ({age}): another DeepSpeed "
                "build is running, or a killed one left the lock and every rank would wait for "
                "it forever",
                hint=f"if no other DeepSpeed process is building, delete {build_dir} (the lock "
                "and the partial build) and re-run",
            )
        time.sleep(poll_s)
        waited += poll_s


def timed_engine_step(
    engine: Any, tokens: Any, labels: Any, sync: Any = None
) -> tuple[float, tuple[float, float, float]]:
    """The DeepSpeed step, timed per phase: ``engine(x)``, ``engine.backward``, ``engine.step``.
    DeepSpeed averages gradients over data-parallel ranks, so the local loss is the mean over
    this rank's tokens; the reported loss is the mean over ranks (the same global mean as the
    torchtitan step). ``sync`` (``torch.cuda.synchronize`` on GPU) runs before each clock read."""
    import torch.distributed as dist

    from gbdoctor.setup.train import forward_loss

    def now() -> float:
        if sync is not None:
            sync()
        return time.perf_counter()

    t0 = now()
    loss = forward_loss(engine, tokens, labels, 1)
    t1 = now()
    engine.backward(loss)
    t2 = now()
    engine.step()
    t3 = now()
    world = dist.get_world_size() if dist.is_initialized() else 1
    reported = loss.detach().clone()
    if world > 1:
        dist.all_reduce(reported, op=dist.ReduceOp.SUM)
    return float(reported) / world, (t1 - t0, t2 - t1, t3 - t2)
