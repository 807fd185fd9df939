"""Production configs as users run them: the unmodified torchtitan v0.2.2 configs, the one rule
that picks a real or a simulated environment before anything is materialized, and what the
reports say about how a config was read.

The memory rule is tested with injected available memory (``decide(available=...)`` and the
``GBDOCTOR_AVAILABLE_MEMORY_GIB`` override), never this machine's RAM. Full-size scans are
covered by one representative (llama3 8B, simulated, in ``test_full_size_scan_cli``); the
benchmark ``benchmarks/production_bench.py`` runs scan and inspect on all 8 configs.
"""

from __future__ import annotations

import json

import pytest
from repo_paths import FIXTURES
from typer.testing import CliRunner

from gbdoctor.cli import app
from gbdoctor.errors import BaselineError, SpecError
from gbdoctor.scan import cpu_capture_shape, estimate, memory_estimate, scan
from gbdoctor.scan.inspect import inspect_spec, simulate_inspect
from gbdoctor.spec import load_spec, spec_notes

CONFIGS = FIXTURES / "torchtitan_v0.2.2"
ALL_CONFIGS = sorted(p.name for p in CONFIGS.glob("*.toml"))
FULL_SIZE = ("deepseek_v3_16b.toml", "deepseek_v3_671b.toml", "llama3_8b.toml")
DEBUG = ("deepseek_v3_debug_model.toml", "llama3_debug_model.toml", "llama4_debug_model.toml")
GiB = memory_estimate.GiB

runner = CliRunner()


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)
    monkeypatch.delenv(memory_estimate.AVAILABLE_ENV, raising=False)


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("Error: ")]


# --------------------------------------------------------------------------- the rule


def test_every_config_loads_or_is_refused_in_one_line_and_the_rule_decides_each():
    assert len(ALL_CONFIGS) == 8
    decided = {}
    for name in ALL_CONFIGS:  # every one loads: pipeline parallelism (17bx128e) included
        spec = load_spec(CONFIGS / name)
        decided[name] = estimate.decide(spec, available=16 * GiB)
    # Every full-size config would need far more than 16 GiB: simulated, with the reason.
    for name in (*FULL_SIZE, "llama4_17bx16e.toml", "llama4_17bx128e.toml"):
        assert decided[name].simulate and decided[name].reason, name
    for name in ("llama3_8b.toml", "deepseek_v3_671b.toml"):
        assert decided[name].reason.startswith("a real scan needs about"), decided[name].reason
        assert decided[name].estimate.params > 16 * GiB
    # The debug flavors are scanned for real, at the smaller shape their CPU compute allows
    # (rule 5), and the memory is estimated at that shape.
    for name in DEBUG:
        assert not decided[name].simulate and decided[name].estimate.fits, name
        batch, seq = decided[name].capture_shape
        assert decided[name].estimate.tokens == batch * seq < 8 * 2048


def test_a_spec_that_does_not_fit_is_simulated_with_the_notice():
    spec = load_spec("fixtures/llama3_debug.toml")
    fits = estimate.decide(spec, available=16 * GiB)
    assert not fits.simulate and fits.estimate.total < 16 * GiB
    tight = estimate.decide(spec, available=fits.estimate.total)  # 80% of it may be used
    assert tight.simulate and tight.reason.startswith("a real scan needs about")
    assert tight.estimate == memory_estimate.estimate_memory(
        spec, _meta_model(spec), available=fits.estimate.total
    )
    # Through the CLI, with the available memory injected: simulated, the notice first in the
    # report and (JSON on stdout) on stderr.
    result = runner.invoke(
        app,
        ["scan", "fixtures/llama3_debug.toml", "-f", "json"],
        env={memory_estimate.AVAILABLE_ENV: "0.5"},
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["setup"]["simulated"] is True
    assert data["notes"][0].startswith("notice: a real scan needs about")
    assert "0.4 GiB of the 0.5 GiB available may be used" in data["notes"][0]
    assert "notice: a real scan needs about" in result.stderr
    assert all(b["error"] is None for b in data["blocks"])


def _meta_model(spec):
    from gbdoctor.models import build_model

    return build_model(spec.model, device="meta", max_seq_len=spec.training.seq_len)


def test_estimate_follows_the_model_the_shards_and_the_step():
    small = load_spec(CONFIGS / "llama3_8b.toml")
    est = memory_estimate.estimate_memory(small, _meta_model(small), available=GiB)
    assert 7.5e9 * 4 < est.params < 8.5e9 * 4  # 8B parameters in fp32
    assert est.optimizer == 2 * est.grads and est.local_ranks == 1  # one rank holds it all
    sharded = load_spec(CONFIGS / "llama3_8b.toml", ["gbdoctor.world_size=8"])
    est8 = memory_estimate.estimate_memory(sharded, _meta_model(sharded), available=GiB)
    assert est8.grads == est.grads // 8 and est8.local_ranks == 8
    longer = load_spec(CONFIGS / "llama3_8b.toml", ["gbdoctor.seq_len=16384"])
    est2 = memory_estimate.estimate_memory(longer, _meta_model(longer), available=GiB)
    # Linear in the tokens, plus one layer's attention scores, quadratic in the sequence.
    assert 2 * est.activations < est2.activations < 4 * est.activations


def test_run_refuses_what_does_not_fit_with_the_estimate_and_a_set():
    result = runner.invoke(
        app, ["run", "fixtures/llama3_debug.toml"], env={memory_estimate.AVAILABLE_ENV: "0.5"}
    )
    assert result.exit_code == 2, result.stderr
    assert len(_error_lines(result.stderr)) == 1
    text = " ".join(result.stderr.split())  # the console may wrap long lines
    assert "cannot simulate: a real run needs about" in text
    assert "Hint: " in text and "--set gbdoctor.batch_size=" in text
    assert "Traceback" not in text
    big = runner.invoke(
        app, ["run", str(CONFIGS / "llama3_8b.toml")], env={memory_estimate.AVAILABLE_ENV: "16"}
    )
    assert big.exit_code == 2 and "--set model.flavor=debugmodel" in " ".join(big.stderr.split())


def test_flex_attention_flavors_are_refused_when_simulated_naming_the_flavor():
    spec = load_spec(
        "fixtures/llama3_debug.toml",
        ["model.flavor=debugmodel_flex_attn", "gbdoctor.simulate=true"],
    )
    with pytest.raises(SpecError) as info:
        estimate.decide(spec)
    assert "'debugmodel_flex_attn'" in info.value.message and "FlexAttention" in info.value.message
    assert "--set model.flavor=debugmodel " in info.value.hint
    real = load_spec("fixtures/llama3_debug.toml", ["model.flavor=debugmodel_flex_attn"])
    assert not estimate.decide(real, available=16 * GiB).simulate  # fits: scanned for real


# --------------------------------------------------------------------------- inspect


def test_inspect_simulated_equals_inspect_real():
    """The simulated inspect (meta + fake process group) describes the same setup as the real
    one: same blocks, wrappers, compiled regions, shards, hooks and (rank 0's) parameter counts."""
    spec = load_spec("fixtures/llama4_debug.toml")
    real = inspect_spec(spec)
    simulated = simulate_inspect(spec)
    assert not real.setup.simulated and simulated.setup.simulated
    assert simulated.blocks == real.blocks
    assert simulated.other_sharded == real.other_sharded
    assert simulated.other_hooks == real.other_hooks
    assert simulated.notes[0].startswith("simulated: rank 0 of 1")
    assert simulated.notes[1:] == real.notes == spec_notes(spec)


def test_inspect_cli_on_a_production_config_with_world_size():
    result = runner.invoke(
        app,
        ["inspect", str(CONFIGS / "deepseek_v3_16b.toml"), "--world-size", "16", "-f", "json"],
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    setup = data["setup"]
    assert setup["simulated"] is True and setup["world_size"] == 16
    assert (setup["dp_shard"], setup["ep_degree"], setup["dp_replicate"]) == (16, 8, 1)
    notes = "\n".join(data["notes"])
    assert "data_parallel_shard_degree = -1 resolved to 16" in notes
    assert 'lacks "model": training with this config would not compile the blocks' in notes
    assert len(data["blocks"]) == 27 and data["blocks"][1]["moe"] is True


# --------------------------------------------------------------------------- notes, world size


def test_compile_disabled_and_loss_only_configs_get_the_note():
    def note(name, *overrides):
        return [n for n in spec_notes(load_spec(CONFIGS / name, overrides)) if "[compile]" in n]

    assert note("llama3_debug_model.toml") == [
        "[compile] enable = false: training with this config would not compile the blocks; "
        "the scan shows what would happen if it did"
    ]
    [loss_only] = note("deepseek_v3_16b.toml")
    assert loss_only.startswith("[compile] components = ['loss'] lacks \"model\"")
    assert note("llama3_debug_model.toml", "compile.enable=true") == []


def test_world_size_resolves_minus_one_as_torchtitan_does():
    def parallel(name, *overrides):
        return load_spec(CONFIGS / name, overrides).parallelism

    default = parallel("deepseek_v3_16b.toml")  # EP 8 borrows from FSDP: the smallest world is 8
    assert (default.dp_shard, default.world_size) == (8, 8)
    launch = parallel("deepseek_v3_16b.toml", "gbdoctor.world_size=64")
    assert (launch.dp_shard, launch.world_size, launch.expert_parallel_degree) == (64, 64, 8)
    assert parallel("llama3_8b.toml", "gbdoctor.world_size=8").dp_shard == 8
    hsdp = parallel(
        "llama3_8b.toml", "gbdoctor.world_size=8", "parallelism.data_parallel_replicate_degree=2"
    )
    assert (hsdp.dp_shard, hsdp.world_size) == (4, 8)
    for overrides, needle in [
        (["gbdoctor.world_size=12"], "does not divide the 12 ranks"),  # EP 8
        (["gbdoctor.world_size=4", "parallelism.data_parallel_shard_degree=8"], "does not match"),
        (["gbdoctor.world_size=-2"], "must be a positive integer"),
    ]:
        with pytest.raises(SpecError) as info:
            load_spec(CONFIGS / "deepseek_v3_16b.toml", overrides)
        assert needle in info.value.message and "world_size" in info.value.message


def test_world_size_option_shows_the_resolved_degrees_in_the_scan_header():
    result = runner.invoke(
        app,
        # The resolution is a note of the setup: --details prints the notes.
        ["scan", "fixtures/llama3_debug.toml", "--simulate", "--world-size", "4", "--details"],
    )
    assert result.exit_code == 0, result.stderr
    assert "EP 1, FSDP dp_shard 4" in result.stdout
    assert (
        "data_parallel_shard_degree = -1 resolved to 4 (every rank of the stated launch size 4"
        in (" ".join(result.stdout.split()))
    )
    bad = runner.invoke(app, ["scan", "fixtures/llama3_debug.toml", "--world-size", "0"])
    assert bad.exit_code == 2


# --------------------------------------------------------------------------- gate


def test_gate_baseline_records_simulated_and_a_mismatch_is_an_error():
    from dataclasses import replace

    from gbdoctor.gate import (
        baseline_from_reports,
        check_gate,
        dump_baseline,
        merge_baselines,
        parse_baseline,
    )
    from gbdoctor.report.json import load_scan_json

    real = load_scan_json(FIXTURES / "scans" / "llama4_before.json")
    simulated = replace(real, setup=replace(real.setup, simulated=True))
    baseline = baseline_from_reports([simulated])
    text = dump_baseline(baseline)
    assert json.loads(text)["simulated"] == ["fixtures/llama4_debug_ep2.toml"]
    assert parse_baseline(text) == baseline
    assert check_gate([simulated], baseline).passed
    with pytest.raises(BaselineError) as info:
        check_gate([real], baseline)
    assert "recorded from a simulated scan, but this scan is real" in info.value.message
    assert "--update-baseline" in info.value.hint
    # Re-recording the spec from a real scan replaces the entry (and the mark).
    again = merge_baselines(baseline, baseline_from_reports([real]))
    assert again.simulated == () and check_gate([real], again).passed
    # A baseline written before the mark existed compares either way.
    legacy = parse_baseline(
        text.replace('"simulated": [\n    "fixtures/llama4_debug_ep2.toml"\n  ],\n', "")
    )
    assert legacy.simulated is None and check_gate([real], legacy).passed


# --------------------------------------------------------------------------- warm-up shortcut


def test_warm_up_computes_one_block_per_kind_and_the_records_do_not_change(monkeypatch):
    from gbdoctor.capture import eager_stance
    from gbdoctor.frameworks import framework_for
    from gbdoctor.scan import ScanJob, build_and_setup, rank, strategy_for
    from gbdoctor.scan.dedupe import shortcut_repeated_blocks
    from gbdoctor.setup.dist import single_process_group
    from gbdoctor.setup.train import forward_loss, synthetic_batch

    spec = load_spec("fixtures/llama4_debug.toml")  # 6 layers: dense and MoE alternate
    framework = framework_for(spec)
    job = ScanJob(
        spec=spec,
        framework=framework,
        strategy=strategy_for(framework, spec, None),
        device="cpu",
    )
    with single_process_group("cpu"):
        setup, _ = build_and_setup(job)
        computed = []
        for slot in setup.blocks:
            slot.block.register_forward_hook(lambda m, a, o, fqn=slot.fqn: computed.append(fqn))
        tokens, labels = synthetic_batch(
            seed=0,
            step=0,
            vocab=2048,
            local_batch=2,
            seq_len=16,
            rank=0,
            world_size=1,
            device="cpu",
        )
        restore = shortcut_repeated_blocks(setup)
        with eager_stance():  # as the warm-up runs (compiled regions run eagerly)
            forward_loss(setup.model, tokens, labels, 1)
            assert computed == ["layers.0", "layers.1"]
            restore()
            computed.clear()
            forward_loss(setup.model, tokens, labels, 1)
        assert computed == [f"layers.{i}" for i in range(6)]
    shortcut = scan(spec)
    monkeypatch.setattr(rank, "shortcut_repeated_blocks", lambda setup: lambda: None)
    assert scan(spec) == shortcut


# --------------------------------------------------------------------------- full size


def test_full_size_scan_cli():
    """The representative full-size config: llama3 8B, unmodified, no flags (simulated by the
    memory rule unless this machine has some 150 GiB to spare)."""
    result = runner.invoke(
        app,
        ["scan", str(CONFIGS / "llama3_8b.toml"), "-f", "json"],
        env={memory_estimate.AVAILABLE_ENV: "16"},
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["setup"]["simulated"] is True and data["model"] == "llama3/8B"
    assert len(data["blocks"]) == 32 and sum(b["same_as"] is None for b in data["blocks"]) == 1
    assert all(b["error"] is None and b["graph_count"] >= 1 for b in data["blocks"])
    assert data["notes"][0].startswith("notice: a real scan needs about")


def test_full_size_plan_cli_is_verified_by_simulated_rescans():
    """``plan`` on the unmodified llama3 8B config, no flags: every verification re-scan keeps
    the first decision (simulated, with its notice), and a simulation is never asked to probe
    recompiles (it runs no step)."""
    result = runner.invoke(
        app,
        ["plan", str(CONFIGS / "llama3_8b.toml"), "--emit-config", "json"],
        env={memory_estimate.AVAILABLE_ENV: "16"},
    )
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["simulated"] is True and plan["verified"] is True
    assert plan["notes"][0].startswith("notice: a real scan needs about")
    assert [k["kind"] for k in plan["kinds"]] == ["dense+sac"]


# --------------------------------------------------------------------------- capture shape


def test_slow_cpu_training_shapes_capture_smaller_with_a_notice_and_the_same_answer_twice():
    spec = load_spec(CONFIGS / "llama3_debug_model.toml")
    first, second = estimate.decide(spec), estimate.decide(spec)
    assert (first.capture_shape, first.notice) == (second.capture_shape, second.notice)
    assert not first.simulate
    batch, seq = first.capture_shape
    # Batch goes first, then the sequence, by halving from the training shape 8 x 2048.
    assert (
        batch == 1 and seq < 2048 and 2048 % seq == 0 and seq >= cpu_capture_shape.MIN_CAPTURE_SEQ
    )
    assert first.notice.startswith(f"notice: captured at batch 1 x seq {seq} instead of")
    assert "--set gbdoctor.batch_size=8 --set gbdoctor.seq_len=2048" in first.notice
    pinned = estimate.pin(spec, first)
    assert (pinned.capture_batch_size, pinned.capture_seq_len) == (1, seq)
    # The chosen shape fits the budget; the one before it did not.
    model = _meta_model(spec)
    rate = cpu_capture_shape.CPU_FLOPS["bfloat16"] / cpu_capture_shape.SCAN_STEP_EQUIVALENTS
    assert (
        cpu_capture_shape.step_flops(spec, model, 1, seq) / rate
        <= cpu_capture_shape.CAPTURE_TIME_BUDGET_S
    )
    assert (
        cpu_capture_shape.step_flops(spec, model, 1, seq * 2) / rate
        > cpu_capture_shape.CAPTURE_TIME_BUDGET_S
    )
    # A shape the user states is kept, however slow.
    stated = load_spec(CONFIGS / "llama3_debug_model.toml", ["gbdoctor.seq_len=2048"])
    assert estimate.decide(stated).capture_shape is None


def test_step_flops_follow_tokens_and_attention():
    spec = load_spec("fixtures/llama3_debug.toml")
    model = _meta_model(spec)
    one, two = (cpu_capture_shape.step_flops(spec, model, b, 64) for b in (1, 2))
    assert two == pytest.approx(2 * one)
    # Doubling the sequence more than doubles the cost: attention is quadratic in it.
    assert cpu_capture_shape.step_flops(spec, model, 1, 128) > 2 * one


def test_local_ranks_share_the_cores_so_a_larger_world_captures_smaller():
    one = estimate.decide(load_spec(CONFIGS / "llama3_debug_model.toml"))
    four = estimate.decide(
        load_spec(CONFIGS / "llama3_debug_model.toml", ["parallelism.data_parallel_shard_degree=4"])
    )
    assert (
        four.capture_shape[0] * four.capture_shape[1] < one.capture_shape[0] * one.capture_shape[1]
    )
