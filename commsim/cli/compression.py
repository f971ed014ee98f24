"""`commsim compression`: what gradient compressors cost and what they lose."""

from __future__ import annotations

from typing import Annotated

import typer

from commsim.report import terminal

compression_app = typer.Typer(no_args_is_help=True, help="Gradient compressors: measure them.")

BENCH_COMPRESSORS = (
    "none,fp16,bf16,int8,topk:0.05,topk:0.01,topk:0.05+int8,randomk:0.05,powersgd:4,sign"
)
# One transformer block's weight gradients at hidden 1024 (QKV, proj, MLP up, MLP down),
# flattened into one DDP bucket: 12.6 M fp32 values, 50 MB.
BLOCK_SHAPES = ((3072, 1024), (1024, 1024), (4096, 1024), (1024, 4096))


def _compressor_list(text: str) -> list[str]:
    """The --compressors spellings, each parsed; an unknown one or none at all is a
    SpecError naming the flag."""
    from commsim.compression import parse_compressor
    from commsim.specs import SpecError

    try:
        specs = [parse_compressor(c).spec for c in text.split(",") if c.strip()]
    except ValueError as e:
        raise SpecError("--compressors", "", str(e)) from None
    if not specs:
        raise SpecError(f"--compressors {text!r}", "", "names no compressor")
    return specs


@compression_app.command("bench")
def compression_bench(
    compressors: Annotated[str, typer.Option(help="Comma-separated spellings.")] = (
        BENCH_COMPRESSORS
    ),
    repeats: Annotated[int, typer.Option(help="Timing repeats (the median is kept).")] = 5,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Wire ratio, fidelity delta and encode/decode time per MB of each compressor, on
    synthetic heavy-tailed gradients of a transformer block and on a real MLP's gradients."""
    import numpy as np

    from commsim.compression import measure, synthetic_gradients
    from commsim.convergence import mlp_gradients
    from commsim.report import tables

    with terminal.user_errors():
        if repeats < 1:
            raise ValueError(f"--repeats {repeats}: time each compressor at least once")
        specs = _compressor_list(compressors)
        sources = {
            "synthetic block": np.concatenate(
                [g.ravel() for g in synthetic_gradients(BLOCK_SHAPES)]
            ),
            "digits MLP": np.concatenate([g.ravel() for g in mlp_gradients()]),
        }
        rows = []
        with terminal.progress(len(specs) * len(sources), "measuring") as bar:
            for source, g in sources.items():
                for spec in specs:
                    rows.append(
                        measure(spec, g, repeats) | {"gradients": source, "elements": g.size}
                    )
                    bar.advance(0)
    if json_out:
        terminal.print_json({"rows": rows})
        return
    terminal.console.print(tables.compression_table(rows))


@compression_app.command("convergence")
def compression_convergence(
    compressors: Annotated[str, typer.Option(help="Comma-separated spellings.")] = (
        "none,fp16,int8,topk:0.05,topk:0.05+int8"
    ),
    error_feedback: Annotated[
        str, typer.Option(help="both, on or off: run each compressor with/without it.")
    ] = "both",
    steps: Annotated[int, typer.Option(help="SGD steps.")] = 300,
    workers: Annotated[int, typer.Option(help="Simulated data-parallel workers.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed for data split, init and sampling.")] = 0,
    plot: Annotated[str | None, typer.Option(help="Write the loss curves to this PNG.")] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Train a small MLP on scikit-learn's bundled digits with simulated workers whose
    gradients pass through each compressor; accuracy and loss against uncompressed."""
    from commsim import convergence
    from commsim.files import check_output
    from commsim.report import tables

    with terminal.user_errors():
        modes = {"both": "both", "on": True, "off": False}
        if error_feedback not in modes:
            raise ValueError(f"--error-feedback must be both, on or off, not {error_feedback!r}")
        for flag, value, least in (
            ("--steps", steps, 1),
            ("--workers", workers, 1),
            ("--seed", seed, 0),
        ):
            if value < least:
                raise ValueError(f"{flag} {value}: must be at least {least}")
        if workers > convergence.BATCH:
            raise ValueError(
                f"--workers {workers}: at most {convergence.BATCH}, the samples of one step "
                "(each worker needs one at least)"
            )
        check_output(plot, "--plot", image=True)
        specs = _compressor_list(compressors)
        results = convergence.run(specs, modes[error_feedback], steps, workers, seed)
        if plot:
            convergence.plot_curves(results, plot)
    rows = [
        {
            "compressor": r.compressor,
            "error_feedback": r.error_feedback,
            "test_accuracy": r.test_accuracy,
            "accuracy_retained": r.accuracy_retained,
            "test_loss": r.test_loss,
            "final_train_loss": float(r.losses[-1]),
            "wire_bytes_per_step": r.wire_bytes_per_step,
        }
        for r in results
    ]
    if json_out:
        terminal.print_json({"steps": steps, "workers": workers, "seed": seed, "rows": rows})
        return
    terminal.console.print(tables.convergence_table(rows, steps, workers))
    if plot:
        terminal.console.print(f"loss curves written to {plot}")
