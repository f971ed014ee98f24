"""`commsim plan`: search the strategies, or size the cluster (a range of GPU counts or
several fabrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from commsim.cli import plan_show
from commsim.cli.options import (
    ClusterOpt,
    CsvOpt,
    DeepSpeedOpt,
    ErrorFeedbackOpt,
    FirstLayersOpt,
    FsdpOpt,
    GlobalBatchOpt,
    HtmlOpt,
    LastLayersOpt,
    LayersPerVirtualOpt,
    MicroBatchOpt,
    ModelOpt,
    PriceOpt,
    ProfileOpt,
    ScenarioArg,
    SeqLenOpt,
    TokensOpt,
    blame_flags,
    setup_from_flags,
)
from commsim.cli.sizing import gpu_count, size_clusters_cmd
from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.planner.plan import PlanResult
    from commsim.planner.sweep import BandwidthSweep
    from commsim.scenario import Setup

# plan's own flags: what cluster sizing compares, and the search dimensions a flag pins
GpusOrRangeOpt = Annotated[
    str | None,
    typer.Option(help="GPU count, or LOW:HIGH to size the cluster (doubling from LOW)."),
]
FabricOpt = Annotated[
    str | None,
    typer.Option(help="Cluster sizing: comma-separated topologies to compare (templates)."),
]
GpuOpt = Annotated[
    str | None,
    typer.Option(help="Cluster sizing: GPU model to put in them (a name, or a GPU YAML file)."),
]
DeadlineOpt = Annotated[
    str | None,
    typer.Option(help="Cluster sizing: the smallest cluster that trains in this (30d)."),
]
BudgetOpt = Annotated[
    float | None, typer.Option(help="Cluster sizing: the most money (or GPU-hours) to spend.")
]
ObjectiveOpt = Annotated[
    str | None,
    typer.Option(
        help="Cluster sizing: what picks the row (default time-to-train): "
        "time-to-train, cost, throughput-per-dollar, step-time."
    ),
]
OnlyBucketOpt = Annotated[
    float | None, typer.Option(help="Search only this bucket cap (MiB) instead of 1..200.")
]
OnlyAlgorithmOpt = Annotated[
    str | None,
    typer.Option(
        help="Search only this all-reduce algorithm: auto, nccl, ring, tree, rhd, ps, hierarchical."
    ),
]
OnlyPlacementOpt = Annotated[
    str | None,
    typer.Option(help="Search only this placement: blocked, interleaved, topology-aware."),
]
OnlyOverlapOpt = Annotated[
    bool | None, typer.Option("--overlap/--no-overlap", help="Search only overlap on/off.")
]
OnlyCompressionOpt = Annotated[
    str | None, typer.Option(help="Search only this gradient compression instead of several.")
]
OnlyTpOpt = Annotated[
    int | None,
    typer.Option(
        "--tp", "--tensor-model-parallel-size", help="Search only this tensor-parallel degree."
    ),
]
OnlyPpOpt = Annotated[
    int | None,
    typer.Option("--pp", "--pipeline-model-parallel-size", help="Search only this pipeline depth."),
]
OnlyEpOpt = Annotated[
    int | None,
    typer.Option(
        "--ep",
        "--expert-model-parallel-size",
        help="Search only this expert-parallel degree (MoE).",
    ),
]
OnlyZeroOpt = Annotated[int | None, typer.Option("--zero", help="Search only this ZeRO stage.")]
OnlyRecomputeOpt = Annotated[
    str | None,
    typer.Option(
        "--recompute",
        "--recompute-granularity",
        help="Search only this recomputation: none, selective, full.",
    ),
]
OnlyInterleaveOpt = Annotated[
    int | None,
    typer.Option(
        "--interleave",
        "--num-virtual-stages-per-pipeline-rank",
        help="Search only this interleaving (virtual stages).",
    ),
]
TopOpt = Annotated[int, typer.Option(help="Rows to show (at least 1).")]
SweepPlotOpt = Annotated[
    str | None,
    typer.Option(help="PNG: the winner's step time against NIC bandwidth per compressor."),
]


def plan_cmd(
    scenario: ScenarioArg = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    gpus: GpusOrRangeOpt = None,
    fabric: FabricOpt = None,
    gpu: GpuOpt = None,
    deadline: DeadlineOpt = None,
    budget: BudgetOpt = None,
    objective: ObjectiveOpt = None,
    global_batch: GlobalBatchOpt = None,
    micro_batch: MicroBatchOpt = None,
    seq_len: SeqLenOpt = None,
    bucket_mb: OnlyBucketOpt = None,
    algorithm: OnlyAlgorithmOpt = None,
    placement: OnlyPlacementOpt = None,
    overlap: OnlyOverlapOpt = None,
    compression: OnlyCompressionOpt = None,
    error_feedback: ErrorFeedbackOpt = None,
    profile: ProfileOpt = None,
    tp: OnlyTpOpt = None,
    pp: OnlyPpOpt = None,
    ep: OnlyEpOpt = None,
    zero: OnlyZeroOpt = None,
    fsdp: FsdpOpt = False,
    recompute: OnlyRecomputeOpt = None,
    interleave: OnlyInterleaveOpt = None,
    layers_per_virtual_stage: LayersPerVirtualOpt = None,
    first_stage_layers: FirstLayersOpt = None,
    last_stage_layers: LastLayersOpt = None,
    deepspeed: DeepSpeedOpt = None,
    tokens: TokensOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    top: TopOpt = 15,
    plot: SweepPlotOpt = None,
    html: HtmlOpt = None,
    csv: CsvOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Search strategies, ranked by step time: plain DDP in full detail (algorithm x bucket
    x overlap x placement x compression) and, for transformers, data x tensor x pipeline
    layouts (micro-batch, ZeRO, recomputation, interleaving, bucket, algorithm, overlap)."""
    from commsim.files import check_output

    training = dict(  # the same in both modes
        global_batch=global_batch,
        micro_batch=micro_batch,
        seq_len=seq_len,
        tokens=tokens,
        price_per_gpu_hour=price_per_gpu_hour,
    )
    flags = dict(  # the search dimensions a flag pins
        bucket_mb=bucket_mb,
        algorithm=algorithm,
        placement=placement,
        overlap=overlap,
        compression=compression,
        error_feedback=error_feedback,
        tp=tp,
        pp=pp,
        ep=ep,
        zero=zero,
        recompute=recompute,
        interleave=interleave,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers,
    )
    more = dict(profile=profile, deepspeed=deepspeed)
    sizing = fabric is not None or ":" in (gpus or "") or deadline is not None or budget is not None
    with terminal.user_errors():
        _check_mode(
            sizing,
            top,
            gpu,
            objective,
            flags
            | more
            | {
                "fsdp": fsdp or None,
                "num_layers_per_virtual_pipeline_stage": layers_per_virtual_stage,
            },
        )
        for path, flag, image in ((plot, "--plot", True), (html, "--html", False)):
            check_output(path, flag, image)
        check_output(csv, "--csv")
    if sizing:
        options = dict(fabric=fabric, gpu=gpu, deadline=deadline, budget=budget)
        files = dict(plot=plot, html=html, csv=csv)
        return size_clusters_cmd(
            scenario,
            model,
            cluster,
            gpus,
            training,
            json_out,
            **options,
            **files,
            objective=objective or "time-to-train",
        )
    given = dict(model=model, cluster=cluster, gpus=gpus) | training | more | flags
    with terminal.user_errors(), blame_flags(scenario, given):
        setup = setup_from_flags(
            scenario,
            fsdp=fsdp,
            check=False,
            layers_per_virtual_stage=layers_per_virtual_stage,
            **given | {"gpus": gpu_count(gpus)},
        )
        pins = flags | {"micro_batch": micro_batch}  # flags validated as scenario fields: pin them
        pinned = {k for k, v in pins.items() if v is not None} | ({"zero"} if fsdp else set())
        pinned |= {"interleave"} if layers_per_virtual_stage else set()
        result, sweep = _search(setup, pinned, plot)
        doc = plan_show.plan_doc(setup, result, sweep)
        if not doc["candidates"]:
            plan_show.explain_empty(setup, pinned)
        terminal.require_finite(doc, "--tokens and --price-per-gpu-hour")
        inputs = given | {"scenario": scenario}
        plan_show.write_files(setup, result, doc, top, inputs, (csv, html), sweep)
    if json_out:
        terminal.print_json(doc)
        return
    plan_show.show(setup, doc, top, sweep, plot)
    if html or csv:
        terminal.console.print(f"written: {', '.join(p for p in (html, csv) if p)}")


def _check_mode(sizing: bool, top: int, gpu, objective, search_flags: dict[str, Any]) -> None:
    """Refuse a flag the chosen mode would ignore: --gpu and --objective only size a
    cluster; the search's own flags only pin the search."""
    if top < 1:
        raise ValueError(f"--top {top}: show at least 1 row")
    if not sizing:
        for name, value in (("--gpu", gpu), ("--objective", objective)):
            if value is not None:
                raise ValueError(
                    f"{name}: applies to cluster sizing only (give --gpus LOW:HIGH, --fabric, "
                    "--deadline or --budget)"
                )
        return
    given = [f"--{k.replace('_', '-')}" for k, v in search_flags.items() if v is not None]
    if given:
        raise ValueError(
            f"{given[0]}: cluster sizing searches every layout for each size; pin a layout "
            "with `commsim plan` at one GPU count instead"
        )


def _search(
    setup: Setup, pinned: set[str], plot: str | None
) -> tuple[PlanResult, BandwidthSweep | None]:
    """Rank the strategies, the scenario's own values pinned where a flag gave them; with
    --plot, the plain-DDP winner's bandwidth sweep, drawn."""
    from commsim.planner.plan import plan
    from commsim.planner.sweep import bandwidth_sweep
    from commsim.report import labels
    from commsim.report.sweeps import plot_bandwidth_sweep
    from commsim.units import fmt_time

    base = setup.scenario.strategy
    with terminal.progress(1, "planning") as bar:
        result = plan(
            setup, base, pinned, on_progress=lambda n, of: bar.update(0, completed=n, total=of)
        )
    sweep = None
    ddp = [k for k, p in enumerate(result.ranked) if p.strategy.data_parallel_only]
    if plot and ddp:  # compression is a DDP comm hook: the best plain-DDP layout's sweep
        sweep = bandwidth_sweep(setup, result.ranked[ddp[0]].strategy)
        title = f"{labels.run_title(setup)}: where compression stops paying"
        plot_bandwidth_sweep(sweep, plot, title)
        if ddp[0]:
            step = fmt_time(result.ranked[ddp[0]].step_time_s)
            result.notes.append(
                f"--plot: the winner is not plain DDP; the sweep is of the best plain-DDP "
                f"layout ({step} a step)"
            )
    elif plot:
        result.notes.append("--plot: no plain-DDP layout ranked, so no compression sweep")
    return result, sweep
