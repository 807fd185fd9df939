"""``gbdoctor timeline``: train N steps in one mode and explain the step-time pattern
(``gbdoctor.timeline.train.run_timeline``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gbdoctor.cli.bounds import check_options, check_timeline
from gbdoctor.cli.inputs import load_spec_options
from gbdoctor.cli.options import (
    DetailsOpt,
    OutputOpt,
    SetOpt,
    ShapesOpt,
    SpecArg,
    StrictOpt,
    TimelineFormatOpt,
    WorldSizeOpt,
    load_shapes,
)
from gbdoctor.cli.output import emit, preflight, print_err, spare_model_code
from gbdoctor.errors import ExitCode, SpecError
from gbdoctor.records.bounds import Range
from gbdoctor.records.shapes import ShapeStream


def _pairs(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    out = []
    for text in values or []:
        name, sep, value = text.partition("=")
        if not sep or not name.strip():
            raise SpecError(
                f"--dynamo-config {text!r} is not NAME=VALUE",
                hint="e.g. --dynamo-config recompile_limit=16",
            )
        out.append((name.strip(), value.strip()))
    return tuple(out)


def _lengths(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SpecError(
            f"--seq-lens {text!r} is not a comma-separated list of lengths",
            hint="e.g. --seq-lens 64,64,96 (the steps cycle through them)",
        ) from None


def padded_shapes(text: str | None, pad_buckets: int | None) -> ShapeStream | None:
    """``--shapes`` (``options.load_shapes``), padded to ``--pad-buckets`` N buckets when asked
    (the padding cost goes to stderr)."""
    from gbdoctor.records.shape_presets import pad_to_buckets

    stream = load_shapes(text)
    if stream is None:
        if pad_buckets is not None:
            raise SpecError("--pad-buckets pads a --shapes stream", hint="add --shapes")
        return None
    if pad_buckets is None:
        return stream
    padded, buckets, extra = pad_to_buckets(stream, pad_buckets)
    share = 100.0 * extra / max(1, stream.tokens())
    print_err(
        f"shapes padded to {len(buckets)} buckets {'/'.join(map(str, buckets))}: "
        f"+{extra} padding tokens ({share:.1f}% of {stream.tokens()})"
    )
    return padded


def timeline(
    spec: SpecArg,
    set_: SetOpt = None,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            help="as-is (the spec's own compile strategy), eager, or plan (with --plan FILE)",
        ),
    ] = "as-is",
    steps: Annotated[int, typer.Option("--steps", help="Training steps to record")] = 24,
    seq_lens: Annotated[
        str | None,
        typer.Option(
            "--seq-lens",
            help="Sequence lengths the steps cycle through, e.g. 64,64,96 (default: the "
            "spec's capture length)",
        ),
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="Local batch (default: the spec's)")
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="inductor or aot_eager (traces only: quick runs); default: the spec's [compile] "
            "backend when it names one, else inductor",
        ),
    ] = None,
    plan_file: Annotated[
        Path | None, typer.Option("--plan", help="Plan JSON for --mode plan")
    ] = None,
    dynamo_config: Annotated[
        list[str] | None,
        typer.Option(
            "--dynamo-config",
            help="Set torch._dynamo.config NAME=VALUE for the run (repeatable)",
        ),
    ] = None,
    fix: Annotated[
        bool,
        typer.Option("--fix", help="Apply the proposed fixes, run again and compare"),
    ] = False,
    fix_with: Annotated[
        str,
        typer.Option(
            "--fix-with",
            help="With --fix: config (the Dynamo settings the findings propose) or shapes-spec "
            "(torch.compile(shapes_spec=...) over the dims that changed size; torch >= 2.13)",
        ),
    ] = "config",
    shapes: ShapesOpt = None,
    predict: Annotated[
        bool,
        typer.Option(
            "--predict",
            help="With --shapes: predict the timeline from forwards at its distinct shapes "
            "instead of training every step",
        ),
    ] = False,
    predict_backend: Annotated[
        str,
        typer.Option(
            "--predict-backend",
            help="What --predict compiles with: eager (Dynamo's decisions only, the default) or "
            "same (the timeline's backend, with any shape guards it adds)",
        ),
    ] = "eager",
    pad_buckets: Annotated[
        int | None,
        typer.Option("--pad-buckets", help="Pad the --shapes stream to N bucket lengths"),
    ] = None,
    save_shapes: Annotated[
        Path | None,
        typer.Option("--save-shapes", help="Also write the --shapes stream (as used) as JSON"),
    ] = None,
    format: TimelineFormatOpt = "table",
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Also write the step times as an SVG plot")
    ] = None,
    output: OutputOpt = None,
    details: DetailsOpt = False,
    strict: StrictOpt = False,
    world_size: WorldSizeOpt = None,
) -> None:
    """Train N steps in one mode on the spec's setup and explain the step-time pattern: per
    step its phases, compile time, recompiles with the failed guard in plain words, frames
    past recompile_limit running eagerly; warm-up vs steady state, periods, causes, fixes.

    Exit 1 with --strict when a problem (recompile or eager fallback) is found."""
    from gbdoctor.report.formats import Printout, RenderOptions, render
    from gbdoctor.report.timeline import render_svg
    from gbdoctor.run.settings import Shape, run_settings
    from gbdoctor.timeline.dynamo_settings import typed_dynamo_settings
    from gbdoctor.timeline.train import run_timeline

    preflight(
        format, Printout.TIMELINE, output, plot, save_shapes, inputs=(spec, plan_file, shapes)
    )
    lengths = _lengths(seq_lens)
    check_timeline(steps, batch_size, lengths)
    if pad_buckets is not None:
        check_options((("--pad-buckets", pad_buckets, Range(1, 1_000, "buckets")),))
    stream = padded_shapes(shapes, pad_buckets)
    if stream is None and (predict or save_shapes is not None):
        raise SpecError("--predict and --save-shapes need --shapes", hint="add --shapes FILE")
    if predict_backend not in ("eager", "same"):
        raise SpecError(f"--predict-backend {predict_backend[:40]!r}", hint="valid: eager, same")
    if stream is not None and lengths:
        raise SpecError("--shapes and --seq-lens both set the shapes", hint="drop one")
    settings = _pairs(dynamo_config)
    typed_dynamo_settings(settings)  # imports torch: seconds, but before any rank or model
    loaded = load_spec_options(spec, set_, world_size=world_size)
    spare_model_code(loaded, output, plot)
    # Built once, before the stream: with --shapes the stream replaces the steps and shapes
    # (``timeline.calls.with_stream``), the device, backend and ranks stay these.
    training = run_settings(
        loaded,
        steps=steps,
        seq_lens=lengths,
        batch_size=batch_size,
        backend=backend,
        shape=Shape.CAPTURE,
    )
    if save_shapes is not None and stream is not None:
        from gbdoctor.records.atomic_write import write_atomic
        from gbdoctor.records.io import dumps

        write_atomic(save_shapes, dumps(stream))
        print_err(f"wrote {save_shapes}")
    plan_path = str(plan_file) if plan_file else None
    if predict and stream is not None:
        from gbdoctor.timeline.predict import predict_timeline

        print_err(f"timeline: predicting {len(stream.steps)} steps ({mode}) from their shapes")
        report = predict_timeline(
            loaded,
            stream,
            training,
            mode=mode,
            plan_path=plan_path,
            dynamo_config=settings,
            fix=fix,
            compile_with=predict_backend,
            fix_with=fix_with,
        )
    else:
        n = len(stream.steps) if stream is not None else steps
        print_err(f"timeline: training {n} steps ({mode}); this takes a while on CPU")
        report = run_timeline(
            loaded,
            training,
            mode=mode,
            plan_path=plan_path,
            dynamo_config=settings,
            fix=fix,
            shapes=stream,
            fix_with=fix_with,
        )
    emit(render(Printout.TIMELINE, format, report, RenderOptions(details=details)), output)
    if plot is not None:
        from gbdoctor.records.atomic_write import write_atomic

        write_atomic(plot, render_svg(report))
        print_err(f"wrote {plot}")
    if strict and any(f.problem for f in report.findings):
        raise typer.Exit(int(ExitCode.FINDINGS))
