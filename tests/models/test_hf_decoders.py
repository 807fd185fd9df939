"""Real third-party decoders: Hugging Face ``transformers`` models built offline from tiny configs
(``fixtures/models/hf/*.py``: plain factories with no gbdoctor code in them), scanned like any
user's model, and checked against the oracle a user would trust: plain ``torch.compile`` of the
same model with the graph-break log (``torch._logging.set_logs(graph_breaks=True)``).

Per layer, every (gb_type, line) the log shows must be in gbdoctor's report (a break, or the
``frame_skipped`` event of a "graph break in loop"), and every extra gb_type gbdoctor reports must
be the underlying reason of such a frame skip (the log only says "graph break in loop" there).
MoE-ness is read from each model's own config, never from gbdoctor.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import re
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch._logging
import transformers  # noqa: F401 - the test extra installs it; a missing package must fail
from repo_paths import FIXTURES

from gbdoctor.report.oracle import render_oracle
from gbdoctor.scan import scan
from gbdoctor.scan.oracle import oracle_check
from gbdoctor.spec import load_spec

HF = FIXTURES / "models" / "hf"
_GB_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
_NEXT = "*** While handling this graph break, another graph break occurred: ***"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in ')
_TORCH_DIR = str(Path(torch.__file__).parent)


def _expected_moe(config, index: int) -> bool:
    """Whether layer ``index`` is an MoE layer, from the model's own config."""
    name = type(config).__name__
    if name == "LlamaConfig":
        return False
    if name == "DeepseekV3Config":
        return index >= config.first_k_dense_replace
    if name == "JambaConfig":
        return index % config.expert_layer_period == config.expert_layer_offset
    if name == "Qwen2MoeConfig":
        return (index + 1) % config.decoder_sparse_step == 0 and index not in config.mlp_only_layers
    return True  # Mixtral, OLMoE, DBRX: every layer


CASES = [
    ("llama.py", "causal"),
    ("llama.py", "base+gc"),
    ("mixtral.py", "causal+gc"),
    ("qwen2_moe.py", "base"),
    ("deepseek_v3.py", "causal"),
    ("dbrx.py", "base"),
    ("olmoe.py", "causal"),
    ("jamba.py", "causal"),
]


def _spec(tmp_path: Path, factory: str, flavor: str):
    path = tmp_path / "hf.toml"
    path.write_text(
        f'[model]\nname = "custom"\nflavor = "{flavor}"\nfactory = "{HF / factory}:build"\n'
        # fp32 parameters so that plain torch.compile (the oracle) sees the same model.
        '[training]\nlocal_batch_size = 2\nseq_len = 16\nmixed_precision_param = "float32"\n'
        '[activation_checkpoint]\nmode = "none"\n'
    )
    return load_spec(path)


def _load(factory: str):
    spec = importlib.util.spec_from_file_location(f"hf_factory_{Path(factory).stem}", HF / factory)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gb_types(reason: str) -> list[str]:
    """Every gb_type in a log record's reason (a chained record holds two)."""
    out = []
    for chunk in reason.split(_NEXT):
        for line in chunk.splitlines():
            line = line.strip()
            if line and not line.endswith(":"):
                out.append(line)
                break
    return out


def _innermost_user_line(trace: str) -> tuple[str, int] | None:
    frames = [m for m in (_FRAME.match(line) for line in trace.splitlines()) if m]
    frames = [m for m in frames if not m["file"].startswith(_TORCH_DIR)]
    return (Path(frames[-1]["file"]).name, int(frames[-1]["line"])) if frames else None


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.current: list[str] = []
        self.by_layer: dict[str, set[tuple[str, str, int]]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Graph Break Reason:" not in message or not self.current:
            return
        reason = message.split("Graph Break Reason:", 1)[1]
        body, _, trace = reason.partition("User code traceback:")
        where = _innermost_user_line(trace)
        for gb_type in _gb_types(body):
            if where is not None:
                self.by_layer.setdefault(self.current[-1], set()).add((gb_type, *where))


def _oracle(factory: str, flavor: str, fqns: list[str], flags: dict) -> dict[str, set]:
    """Plain torch.compile of one block at a time in a fresh model, one training step each, with
    the graph-break log. One block per fresh Dynamo state: Dynamo caches (and skips) the code
    objects a block shares with the other layers, so a second compiled layer would log nothing
    while it still breaks in training."""
    torch.manual_seed(0)
    model = _load(factory).build(flavor)
    model.train()
    handler = _Records()
    logger = logging.getLogger(_GB_LOGGER)
    torch._logging.set_logs(graph_breaks=True)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for fqn in fqns:
            parent_path, _, key = fqn.rpartition(".")
            parent = model.get_submodule(parent_path)  # the report's FQNs are the model's own
            original = parent[int(key)]
            parent[int(key)] = torch.compile(original, backend="aot_eager")
            torch._dynamo.reset()
            handler.current[:] = [fqn]
            try:
                with torch._dynamo.config.patch(**flags):
                    out = model(torch.randint(0, 128, (2, 16)))
                    out[0].float().square().mean().backward()
            finally:
                parent[int(key)] = original
                model.zero_grad(set_to_none=True)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        torch._logging.set_logs()
        torch._dynamo.reset()
    return handler.by_layer


@pytest.mark.parametrize("factory, flavor", CASES, ids=[f"{f[:-3]}-{v}" for f, v in CASES])
def test_hf_decoder_matches_plain_compile(tmp_path, factory, flavor):
    spec = _spec(tmp_path, factory, flavor)
    report = scan(spec)
    blocks = report.blocks
    # gbdoctor's own oracle check (``scan --oracle``) agrees on every layer.
    checked = oracle_check(spec, report)
    assert len(checked.blocks) == len(blocks)
    assert checked.agreeing == len(blocks), render_oracle(checked)
    assert blocks and all(b.error is None for b in blocks), [b.error for b in blocks]

    # Blocks found by structure, under the model's own names; MoE layers labelled MoE.
    prefix = blocks[0].fqn.rpartition(".")[0]
    model = _load(factory).build(flavor)
    assert isinstance(model.get_submodule(prefix), torch.nn.ModuleList)  # the model's own path
    assert prefix in ("layers", "model.layers", "blocks", "transformer.blocks")
    config = model.config
    assert [b.fqn for b in blocks] == [f"{prefix}.{i}" for i in range(len(blocks))]
    moe = [str(b.kind).startswith("moe") for b in blocks]
    assert moe == [_expected_moe(config, i) for i in range(len(blocks))]

    # The loss the notes say was used: logits for a causal-LM head, the surrogate for a base model.
    loss_note = next(n for n in report.notes if n.startswith("training loss"))
    expected = "cross entropy" if flavor.startswith("causal") else "surrogate"
    assert expected in loss_note, loss_note

    flags = {
        k: ast.literal_eval(v)
        for k, v in report.setup.dynamo_config
        if hasattr(torch._dynamo.config, k)
    }
    oracle = _oracle(factory, flavor, [b.fqn for b in blocks], flags)
    for block in blocks:
        ours = {
            (b.gb_type, Path(b.location.file).name, b.location.line)
            for b in block.breaks
            if b.location
        }
        skips = {
            (e.gb_type, Path(e.location.file).name, e.location.line)
            for e in block.events
            if e.kind == "frame_skipped" and e.location
        }
        theirs = oracle.get(block.fqn, set())
        for gb_type, file, line in theirs:
            assert any(
                gb_type.startswith(t) and (f, n) == (file, line) for t, f, n in ours | skips
            ), (
                f"{block.fqn}: the graph-break log shows {gb_type!r} at {file}:{line}; gbdoctor: {ours | skips}"
            )
        for gb_type, file, line in ours:
            seen = any(t.startswith(gb_type) and (f, n) == (file, line) for t, f, n in theirs)
            underlying = any((f, n) == (file, line) for _, f, n in skips)
            assert seen or underlying, (
                f"{block.fqn}: gbdoctor reports {gb_type!r} at {file}:{line}; log: {theirs}"
            )
