"""The GPU validation steps (started by validate.sh after the offline install; docs/gpu.md).

    python benchmarks/gpu/validate.py [--dry-run] [--out DIR] [--steps N] [--rounds N]

Every step before the first CUDA call runs anywhere: the environment (torch, nccl, inductor's
triton), the specs to run (each one loaded and checked), the commands of every step. Then, with
no CUDA device, one line "no CUDA device" and exit 2. On CUDA, per spec that fits (one GPU: the
bundled debug specs; >= 2 GPUs: also the 2-rank EP spec):

1. ``gbdoctor scan SPEC`` (JSON): breaks and predicted CUDA-graph readiness per block kind;
2. ``gbdoctor plan SPEC`` (JSON): the plan, verified by its own re-scan;
3. ``gbdoctor run SPEC`` with eager, the torchtitan baselines, the plan and ``cudagraphs`` (the
   plan under mode=reduce-overhead), inductor, measured steps and rounds;
4. the readiness comparison: the kinds predicted ready run under CUDA graphs (the ``cudagraphs``
   mode) with no inductor skip and no re-recording on a moved static input; with none predicted
   ready the mode is unavailable and nothing is compared.

The Accelerate spec (``benchmarks/specs/accelerate_llama.toml``, Hugging Face Accelerate's FSDP2
path) goes first, through the same steps with its own run modes; it needs the accelerate extra
(prepare.sh fetches it) and is left out, saying so, without it. Then the shape streams
(``--shapes``, docs/shapes.md): per stream, ``timeline --shapes S --predict`` (Dynamo's
decisions, eager) against ``timeline --shapes S`` training every step with inductor on CUDA:
the same compiles, recompiles, limit hits and eager steps per step, and the same graphs with the
same dynamic dims and distinct shapes. The packed stream runs FlexAttention, whose backward
inductor compiles on CUDA only.

Writes ``OUT/<gpu>-torch<version>.json`` (every number, the GPU name) plus each command's own
JSON, and prints a summary. Exit 0: every step passed and every prediction held; 1: a
prediction disagreed with inductor; 2: no CUDA device; 3: a step failed (loudly: its command and
the tail of its output), never skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ACCELERATE_SPECS = ("benchmarks/specs/accelerate_llama.toml",)
ONE_GPU_SPECS = (
    *ACCELERATE_SPECS,
    "fixtures/llama3_debug.toml",
    "fixtures/llama4_debug.toml",
    "fixtures/deepseek_v3_debug.toml",
)
TWO_GPU_SPECS = ("fixtures/llama4_debug_ep2.toml",)
# ``--price``: one-GPU specs whose blocks have graph breaks (the bundled debug specs have none on
# one rank): a model with two breaks of very different eager cost, and Hugging Face's DBRX.
PRICE_SPECS = ("benchmarks/specs/priced.toml", "benchmarks/specs/hf_dbrx.toml")
RUN_MODES = "eager,titan-v0.2.0,titan-v0.2.2,plan,cudagraphs"
ACCELERATE_RUN_MODES = "eager,accelerate,plan"  # its run modes have no cudagraphs
SHAPE_STREAMS = (
    # 12 distinct lengths under automatic dynamic shapes: one recompile, then a dynamic graph.
    ("fixtures/shapes/varlen_tiny.toml", "varlen:steps=30,min=8,max=56,multiple=4"),
    # Packed rows, a document-masked BlockMask per batch: FlexAttention forward and backward.
    ("fixtures/shapes/packed_flex.toml", "packed:steps=12,seq=64,mean=16"),
)


class StepFailed(Exception):
    pass


def say(text: str) -> None:
    print(f"validate: {text}", flush=True)


def environment() -> dict:
    """What the image has; imports torch but makes no CUDA call."""
    import torch
    import torch.distributed as dist

    env = {"python": sys.version.split()[0], "torch": torch.__version__}
    env["torch_cuda"] = torch.version.cuda
    env["nccl"] = bool(dist.is_available() and dist.is_nccl_available())
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    from gbdoctor import __version__
    from gbdoctor.torch_compat import is_supported

    env["gbdoctor"] = __version__
    env["torch_supported"] = is_supported()
    return env


def check_specs(specs: list[str]) -> None:
    """Load every spec the way the commands will (a bad spec fails here, before any GPU work)."""
    from gbdoctor.spec import load_spec

    for spec in specs:
        load_spec(REPO / spec, ["gbdoctor.device=cuda"])


def run_modes(spec: str, args: argparse.Namespace) -> str:
    if args.modes:
        return args.modes
    return ACCELERATE_RUN_MODES if spec in ACCELERATE_SPECS else RUN_MODES


def commands(spec: str, out: Path, args: argparse.Namespace, nproc: int) -> dict[str, list[str]]:
    stem = Path(spec).stem
    gb = [sys.executable, "-m", "gbdoctor"]
    device = ["--set", "gbdoctor.device=cuda"]
    return {
        "scan": [*gb, "scan", spec, *device, "--format", "json", "-o", str(out / f"scan-{stem}.json")],
        "plan": [
            *gb, "plan", spec, *device, "--emit-config", "json", "-o", str(out / f"plan-{stem}.json"),
        ],
        "run": [
            *gb, "run", spec, *device, "--modes", run_modes(spec, args), "--backend", "inductor",
            "--plan", str(out / f"plan-{stem}.json"), "--steps", str(args.steps),
            "--warmup", "2", "--rounds", str(args.rounds), "--nproc", str(nproc),
            "--format", "json", "-o", str(out / f"run-{stem}.json"),
        ],
    }  # fmt: skip


def step(name: str, cmd: list[str]) -> float:
    say(f"[{name}] {' '.join(cmd[2:])}")
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    took = time.monotonic() - start
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise StepFailed(f"{name} exited {proc.returncode} after {took:.0f} s:\n{tail}")
    return took


def price_command(spec: str, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable, str(REPO / "benchmarks" / "price_bench.py"), spec, "--strategy",
        "titan-v0.2.0", "--set", "gbdoctor.device=cuda", "--set",
        "activation_checkpoint.mode=none", "--rounds", str(args.rounds), "--steps",
        str(args.steps), "--out", str(args.out),
    ]  # fmt: skip


PRICE_KEYS = (
    "device", "scan_s", "price_s", "price_over_scan", "warm_price_s", "warm_price_over_scan",
    "price_kinds_ms", "warm_price_kinds_ms", "break_prices_ms", "price_sum_ms",
    "run_step_diff_ms", "run_step_diff_rounds_ms", "sum_over_run_diff", "run_price_check",
)  # fmt: skip


def price_step(spec: str, args: argparse.Namespace) -> dict:
    """``benchmarks/price_bench.py`` on CUDA: plain scan, price (cold and warm cache) and ``run
    --price`` of the same plan, in wall time (CUDA synchronized before each clock read)."""
    cmd = price_command(spec, args)
    took = step(f"{Path(spec).stem} price", [cmd[0], "-u", *cmd[1:]])
    out = args.out / f"price_{Path(spec).stem}_cuda_wall.json"
    summary = json.loads(out.read_text())
    entry = {k: summary.get(k) for k in PRICE_KEYS} | {"seconds": round(took)}
    check = summary["run_price_check"]
    say(
        f"[price] {Path(spec).stem}: kinds {summary['price_kinds_ms']}, breaks "
        f"{summary['break_prices_ms']}; run measured {check['measured_ms']} ms "
        f"{check['measured_spread_ms']} vs predicted {check['predicted_ms']}: "
        f"{'consistent' if check['consistent'] else 'NOT consistent'}; price "
        f"{summary['price_over_scan']}x a scan cold, {summary['warm_price_over_scan']}x warm"
    )
    return entry


def readiness(scan: dict, run: dict) -> dict:
    """The scan's predicted CUDA-graph readiness per block kind next to what inductor did in the
    run's ``cudagraphs`` mode, which compiles the kinds predicted ready with
    mode="reduce-overhead": they must run with no "skipping cudagraphs due to ..." and no
    re-recording on a moved static input ("static input data pointer changed"). With no kind
    predicted ready the mode is unavailable and there is nothing to compare."""
    mode = next((m for m in run["modes"] if m["mode"] == "cudagraphs"), None)
    skips = list(mode["cudagraph_skips"]) if mode else []
    rerecords = list(mode.get("cudagraph_rerecords", [])) if mode else []
    moved = [r for r in rerecords if "pointer" in r]
    kinds = [
        {
            "kind": b["kind"],
            "predicted": b["cudagraphs"]["status"],
            "why": b["cudagraphs"]["summary"],
        }
        for b in scan["blocks"]
        if not b.get("same_as") and b.get("cudagraphs")
    ]
    ready = [k for k in kinds if k["predicted"] == "ready"]
    if not ready:
        agrees: bool | None = None  # nothing ran under CUDA graphs
    elif mode is None or mode["status"] != "ok":
        agrees = False
    else:
        agrees = not skips and not moved
    return {
        "kinds": kinds,
        "inductor_skips": skips,
        "rerecords": len(rerecords),
        "moved_static_input_rerecords": len(moved),
        "agrees": agrees,
    }


def blocked_only_by_released(scan: dict) -> list[str]:
    """Block kinds the scan calls CUDA-graph blocked by ``released-static-input`` alone (FSDP2's
    freed unsharded parameters): the prediction a counterfactual run can check."""
    kinds = []
    for b in scan["blocks"]:
        cg = b.get("cudagraphs")
        if b.get("same_as") or not cg or cg["status"] != "blocked":
            continue
        blockers = {f["kind"] for f in cg["findings"] if f["effect"] == "blocks"}
        if blockers == {"released-static-input"}:
            kinds.append(b["kind"])
    return kinds


def counterfactual(spec: str, kinds: list[str], args: argparse.Namespace, nproc: int) -> dict:
    """The plan with ``kinds`` forced CUDA-graph ready, trained under mode=reduce-overhead: the
    prediction "blocked by released-static-input" holds when inductor re-records those blocks on a
    moved static input (or skips them); it is wrong when they replay with neither."""
    stem = Path(spec).stem
    plan = json.loads((args.out / f"plan-{stem}.json").read_text())
    for k in plan["kinds"]:
        if k["kind"] in kinds:
            k["cudagraph_ready"] = True
    forced = args.out / f"plan-{stem}-forced-cudagraphs.json"
    forced.write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
    out = args.out / f"run-{stem}-forced-cudagraphs.json"
    cmd = [
        sys.executable, "-m", "gbdoctor", "run", spec, "--set",
        "gbdoctor.device=cuda", "--modes", "cudagraphs", "--backend", "inductor", "--plan",
        str(forced), "--steps", str(args.steps), "--warmup", "2", "--rounds", "1", "--nproc",
        str(nproc), "--format", "json", "-o", str(out),
    ]  # fmt: skip
    took = step(f"{stem} cudagraphs forced on {','.join(kinds)}", cmd)
    mode = next(m for m in json.loads(out.read_text())["modes"] if m["mode"] == "cudagraphs")
    rerecords = list(mode.get("cudagraph_rerecords", []))
    moved = [r for r in rerecords if "pointer" in r]
    skips = list(mode.get("cudagraph_skips", []))
    return {
        "forced_kinds": kinds,
        "status": mode["status"],
        "tokens_per_s": mode.get("tokens_per_s"),
        "rerecords": len(rerecords),
        "moved_static_input_rerecords": len(moved),
        "rerecord_examples": sorted(set(moved))[:3],
        "inductor_skips": skips[:3],
        "agrees": mode["status"] == "ok" and bool(moved or skips),
        "seconds": round(took),
    }


def timeline_record(path: Path) -> Any:
    """A ``timeline --format json`` result as gbdoctor's own record."""
    from gbdoctor.records.io import load_record
    from gbdoctor.records.timeline import TimelineReport

    return load_record(TimelineReport, json.loads(path.read_text()), str(path))


PREDICTIONS = {"eager": ["--predict"], "same": ["--predict", "--predict-backend", "same"]}
"""``timeline --predict`` with Dynamo's decisions alone (the default), and with the timeline's own
backend (inductor on CUDA here), which sees the shape guards inductor adds while compiling."""


def shape_stream_check(spec: str, stream: str, out: Path) -> dict:
    """``timeline --shapes`` trained on CUDA with inductor against each ``--predict``."""
    stem = Path(spec).stem
    reports = {}
    seconds = {}
    runs = {f"predicted-{name}": extra for name, extra in PREDICTIONS.items()} | {"trained": []}
    for name, extra in runs.items():
        target = out / f"timeline-{stem}-{name}.json"
        cmd = [
            sys.executable, "-m", "gbdoctor", "timeline", spec, "--set", "gbdoctor.device=cuda",
            "--backend", "inductor", "--shapes", stream, *extra, "--format", "json",
            "-o", str(target),
        ]  # fmt: skip
        seconds[name] = round(step(f"{stem} timeline {name}", cmd))
        reports[name] = timeline_record(target)
    # What a prediction promises (the comparison tests/timeline/test_shapes.py makes on CPU).
    from gbdoctor.report.timeline import step_mark
    from gbdoctor.timeline.predict import events

    trained = events(reports["trained"])
    predictions = {}
    for name in PREDICTIONS:
        predicted = events(reports[f"predicted-{name}"])
        pairs = zip(predicted["steps"], trained["steps"])
        differing = [i for i, (p, t) in enumerate(pairs) if p != t]
        predictions[name] = {
            "agrees": predicted == trained,
            "graphs_agree": predicted["graphs"] == trained["graphs"],
            "steps_differing": differing,
            # The events themselves: the device machine returns a few files only, and the
            # summary is the one that must say what differed.
            "differences": [
                {"step": i, "predicted": predicted["steps"][i], "trained": trained["steps"][i]}
                for i in differing[:6]
            ],
            "graphs": predicted["graphs"],
        }
    return {
        "stream": stream,
        "trained_strip": "".join(step_mark(s) for s in reports["trained"].steps),
        "trained_graphs": trained["graphs"],
        "predictions": predictions,
        "agrees": all(p["agrees"] for p in predictions.values()),
        "trained_step_s": [round(s.time_s, 4) for s in reports["trained"].steps],
        "seconds": seconds,
    }


def check_streams(streams: list, out: Path, result: dict, target: Path) -> int:
    """Each shape stream's check into ``result``; 1 when a prediction disagreed."""
    status = 0
    for spec, stream in streams:
        result["shapes"][spec] = check = shape_stream_check(spec, stream, out)
        verdicts = "; ".join(
            f"--predict-backend {name} "
            + (
                "agrees"
                if p["agrees"]
                else f"DISAGREES at steps {p['steps_differing']}"
                + ("" if p["graphs_agree"] else " (graphs differ)")
            )
            for name, p in check["predictions"].items()
        )
        say(
            f"[shapes] {Path(spec).stem} {stream}: trained on CUDA (inductor) "
            f"{check['trained_strip']}; graphs {check['trained_graphs']}; {verdicts}"
        )
        if not check["agrees"]:
            status = 1
        target.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return status


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-").lower()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="stop before the first CUDA call")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "gpu")
    parser.add_argument("--steps", type=int, default=10, help="measured steps per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--modes",
        default=None,
        help=f"run's modes (default {RUN_MODES}; Accelerate: {ACCELERATE_RUN_MODES})",
    )
    parser.add_argument(
        "--shapes",
        default=None,
        help="comma-separated stems of the shape-stream specs to check (default: every one; "
        "'none': none)",
    )
    parser.add_argument(
        "--specs",
        default=None,
        help="comma-separated spec stems to scan, plan and run (default: every one that fits)",
    )
    parser.add_argument(
        "--price",
        nargs="?",
        const=True,
        default=None,
        help="first, benchmarks/price_bench.py on CUDA for each price spec (price vs run --price); "
        "--price=STEM,... only those",
    )
    args = parser.parse_args()

    env = environment()
    say(
        f"[env] python {env['python']}, torch {env['torch']} (CUDA {env['torch_cuda']}), "
        f"nccl {env['nccl']}, triton {env['triton']}, gbdoctor {env['gbdoctor']}"
    )
    if not env["torch_supported"]:
        say(f"FAILED: torch {env['torch']} is outside gbdoctor's supported range")
        return 3
    specs = [
        s
        for s in (*ONE_GPU_SPECS, *TWO_GPU_SPECS)
        if args.specs is None or Path(s).stem in args.specs.split(",")
    ]
    priced = [
        s for s in PRICE_SPECS if args.price and (args.price is True or Path(s).stem in args.price)
    ]
    streams = [
        (s, stream)
        for s, stream in SHAPE_STREAMS
        if args.shapes is None or Path(s).stem in args.shapes.split(",")
    ]
    if ACCELERATE_SPECS[0] in specs and importlib.util.find_spec("accelerate") is None:
        say("[specs] accelerate is not installed (prepare.sh's extra): its spec is left out")
        specs.remove(ACCELERATE_SPECS[0])
    check_specs(specs + priced + [s for s, _ in streams])
    say(f"[specs] {len(specs)} loaded: {', '.join(Path(s).stem for s in specs)}")
    for spec in specs:
        for name, cmd in commands(spec, args.out, args, 2 if spec in TWO_GPU_SPECS else 1).items():
            say(f"[plan] {name}: {' '.join(cmd[2:])}")
    for spec in priced:
        say(f"[plan] price: {' '.join(price_command(spec, args)[1:])}")
    for spec, stream in streams:
        say(f"[plan] timeline {spec} --shapes {stream}, trained (inductor) and --predict")

    import torch  # the first CUDA call is below

    if args.dry_run or not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    env |= {"gpu": name, "gpus": gpus, "capability": list(torch.cuda.get_device_capability(0))}
    say(f"[cuda] {gpus} x {name}")
    if not env["nccl"] or not env["triton"]:
        say("FAILED: a CUDA machine without nccl or triton cannot run the steps (inductor, nccl)")
        return 3
    run_specs = [s for s in specs if gpus >= 2 or s not in TWO_GPU_SPECS]
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"environment": env, "specs": {}, "price": {}, "shapes": {}}
    target = args.out / f"{_slug(name)}-torch{env['torch'].split('+')[0]}.json"
    status = 0
    # Never measured on a GPU before 2026-11-28, so first: the Accelerate spec, the shape streams.
    first_titan_spec = next((s for s in run_specs if s not in ACCELERATE_SPECS), None)
    try:
        for spec in priced:
            result["price"][spec] = price_step(spec, args)
            target.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        for spec in run_specs:
            if spec == first_titan_spec:
                status |= check_streams(streams, args.out, result, target)
            nproc = 2 if spec in TWO_GPU_SPECS else 1
            cmds = commands(spec, args.out, args, nproc)
            entry: dict = {"seconds": {}}
            result["specs"][spec] = entry
            for step_name, cmd in cmds.items():
                entry["seconds"][step_name] = round(step(f"{Path(spec).stem} {step_name}", cmd))
            stem = Path(spec).stem
            scan = json.loads((args.out / f"scan-{stem}.json").read_text())
            run = json.loads((args.out / f"run-{stem}.json").read_text())
            entry["breaks"] = scan["totals"]["breaks"]
            entry["graphs"] = scan["totals"]["graphs"]
            entry["modes"] = {
                m["mode"]: {
                    k: m.get(k)
                    for k in ("status", "tokens_per_s", "speedup_vs_eager", "mfu", "error")
                }
                for m in run["modes"]
            }
            # cudagraphs is unavailable (not failed) when no kind is predicted CUDA-graph ready
            failed = [
                m
                for m, v in entry["modes"].items()
                if v["status"] != "ok" and not (m == "cudagraphs" and v["status"] == "unavailable")
            ]
            if failed:
                raise StepFailed(f"{stem} run: mode(s) {', '.join(failed)} did not run on CUDA")
            entry["readiness"] = cg = readiness(scan, run)
            verdict = {True: "agrees", False: "DISAGREES", None: "n/a"}[cg["agrees"]]
            predicted = "; ".join(f"{k['kind']}: {k['why']}" for k in cg["kinds"])
            say(
                f"[cudagraphs] {stem}: predicted {predicted or 'nothing compiled'}; inductor "
                f"skipped {len(cg['inductor_skips'])} time(s) {cg['inductor_skips'][:3]}, "
                f"re-recorded {cg['rerecords']} time(s) ({cg['moved_static_input_rerecords']} on a "
                f"moved static input): {verdict}"
            )
            if cg["agrees"] is False:
                status = 1
            forced = blocked_only_by_released(scan)
            if forced:
                entry["released_static_input_check"] = cf = counterfactual(
                    spec, forced, args, nproc
                )
                say(
                    f"[cudagraphs] {stem}: predicted blocked by released-static-input: "
                    f"{', '.join(forced)}; forced under reduce-overhead, inductor re-recorded "
                    f"{cf['rerecords']} time(s) ({cf['moved_static_input_rerecords']} on a moved "
                    f"static input), skipped {len(cf['inductor_skips'])}: "
                    f"{'agrees' if cf['agrees'] else 'DISAGREES'}"
                )
                if not cf["agrees"]:
                    status = 1
            tps = ", ".join(f"{m} {v['tokens_per_s'] or 0:.0f}" for m, v in entry["modes"].items())
            say(f"[result] {stem}: {entry['breaks']} breaks; tokens/s {tps}")
            target.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        if first_titan_spec is None:
            status |= check_streams(streams, args.out, result, target)
    except StepFailed as exc:
        result["failed"] = str(exc)
        target.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        say(f"FAILED: {exc}")
        return 3
    result["status"] = "predictions agree" if status == 0 else "a prediction disagreed"
    target.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    say(f"wrote {target.relative_to(REPO) if target.is_relative_to(REPO) else target}")
    return status


if __name__ == "__main__":
    sys.exit(main())
