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
    from commsim.cli.options import setup_from_flags
    from commsim.files import check_output, write_atomic
    from commsim.traces.kernels import fit_kernels, gpu_yaml
    from commsim.traces.kineto import read_traces

    with terminal.user_errors():
        check_output(gpu_out, "--gpu-out")
        read = read_traces(traces)
        setup = setup_from_flags(
            scenario,
            check=False,
            model=model,
            cluster=cluster,
            gpus=max(t.world for t in read),
            micro_batch=micro_batch,
            seq_len=seq_len,
            tp=tp,
            pp=pp,
            recompute=recompute,
            precision=precision,
            flash_attention=flash_attention,
            sequence_parallel=sequence_parallel,
        )
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
    if gpu_out:
        terminal.console.print(f"GPU with the fitted efficiencies written to {gpu_out}")
