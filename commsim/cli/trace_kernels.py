"""`commsim trace kernels`: the traced compute per kernel class against commsim's roofline
for the model and layout traced, and the GPU efficiencies fitted from it (traces.kernels)."""

from __future__ import annotations

from typing import Annotated

import typer

from commsim.cli.options import (
    ClusterOpt,
    FlashOpt,
    MicroBatchOpt,
    ModelOpt,
    PpOpt,
    PrecisionOpt,
    RecomputeOpt,
    SeqLenOpt,
    SequenceParallelOpt,
    TpOpt,
)
from commsim.report import terminal

Traces = Annotated[list[str], typer.Argument(help="One torch.profiler trace (JSON) per rank.")]
GpuOutOpt = Annotated[
    str | None, typer.Option(help="Write the cluster's GPU with the fitted efficiencies (YAML).")
]


# the scenario fields kernels_cmd takes flags for (cli.given's names)
KERNEL_FLAGS = (
    *("model", "cluster", "micro_batch", "seq_len", "tp", "pp", "recompute", "precision"),
    *("flash_attention", "sequence_parallel"),
)


def kernels_cmd(
    traces: Traces,
    scenario: Annotated[str | None, typer.Option(help="Scenario of the run traced.")] = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    micro_batch: MicroBatchOpt = None,
    seq_len: SeqLenOpt = None,
    tp: TpOpt = None,
    pp: PpOpt = None,
    recompute: RecomputeOpt = None,
    precision: PrecisionOpt = None,
    flash_attention: FlashOpt = None,
    sequence_parallel: SequenceParallelOpt = None,
    gpu_out: GpuOutOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Traced GEMM, attention and element-wise seconds per micro-batch beside the roofline's
    for the model and layout traced (the scenario's, with these flags), and the efficiencies
    (gemm_efficiency, attention_efficiency) that make them agree."""
    args = locals()  # the flags as given
    from commsim.cli.given import blame_flags, pick
    from commsim.cli.options import setup_from_flags
    from commsim.files import check_output, write_atomic
    from commsim.traces.kernels import fit_kernels, gpu_yaml
    from commsim.traces.kineto import read_traces
    from commsim.traces.retarget import check_layout

    flags = pick(args, KERNEL_FLAGS)
    with terminal.user_errors(), blame_flags(scenario, flags):
        check_output(gpu_out, "--gpu-out")
        read = read_traces(traces)
        world = read[0].world
        setup = setup_from_flags(scenario, check=False, gpus=world, **flags)
        strategy = setup.scenario.strategy
        check_layout(world, world, strategy.tp, strategy.pp)  # the traced ranks hold tp x pp
        fit = fit_kernels(setup, read, setup.scenario.micro_batch)
        doc = {"gpu": setup.gpu.name, "steps": fit.steps, "classes": fit.rows()}
        if gpu_out:
            text = gpu_yaml(fit.fitted_gpu())
            write_atomic(gpu_out, text)
            doc["gpu_out"] = gpu_out
    if json_out:
        terminal.print_json(doc)
        return
    from rich.table import Table

    from commsim.units import fmt_time

    table = Table(title=f"compute per micro-batch by kernel class ({doc['gpu']}, roofline)")
    for col in ("class", "traced", "roofline", "of it write", "figure", "catalog", "fitted"):
        table.add_column(col, justify="left" if col in ("class", "figure") else "right")
    for r in doc["classes"]:
        table.add_row(
            r["class"],
            fmt_time(r["traced_s"]),
            fmt_time(r["roofline_s"]),
            fmt_time(r["write_s"]) if r["write_s"] else "-",
            r["field"],
            "-" if r["catalog"] is None else f"{r['catalog']:.3g}",
            "-" if r["fitted"] is None else f"{r['fitted']:.3g}",
        )
    terminal.console.print(table)
    held = sum(r["bf16_held_s"] for r in doc["classes"])
    if held:
        terminal.console.print(
            f"of the GEMMs' roofline, {fmt_time(held)} is BF16 math under FP8 (LM head, "
            "router), held at the catalog's gemm_efficiency: fp8_gemm_efficiency is fitted to "
            "the rest"
        )
    if gpu_out:
        terminal.console.print(f"GPU with the fitted efficiencies written to {gpu_out}")
