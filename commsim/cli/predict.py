"""`commsim predict`: one training step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from commsim.cli.options import (
    AlgorithmOpt,
    BackendOpt,
    BucketOpt,
    ClusterOpt,
    CompressionOpt,
    CpOpt,
    EpOpt,
    ErrorFeedbackOpt,
    FirstLayersOpt,
    FlashOpt,
    FsdpOpt,
    FsdpShardOpt,
    GlobalBatchOpt,
    GpusOpt,
    InterleaveOpt,
    LastLayersOpt,
    MicroBatchOpt,
    ModelOpt,
    NcclVersionOpt,
    OrderOpt,
    OverlapOpt,
    PlacementOpt,
    PpOpt,
    PrecisionOpt,
    PriceOpt,
    ProfileOpt,
    RecomputeOpt,
    ScenarioArg,
    SeqLenOpt,
    TokensOpt,
    TpOpt,
    TpOverlapOpt,
    ZeroOpt,
    setup_from_flags,
)
from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.scenario import Setup


def predict_cmd(
    scenario: ScenarioArg = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    gpus: GpusOpt = None,
    global_batch: GlobalBatchOpt = None,
    micro_batch: MicroBatchOpt = None,
    seq_len: SeqLenOpt = None,
    bucket_mb: BucketOpt = None,
    algorithm: AlgorithmOpt = None,
    placement: PlacementOpt = None,
    overlap: OverlapOpt = None,
    compression: CompressionOpt = None,
    error_feedback: ErrorFeedbackOpt = None,
    tp: TpOpt = None,
    pp: PpOpt = None,
    ep: EpOpt = None,
    zero: ZeroOpt = None,
    fsdp: FsdpOpt = False,
    recompute: RecomputeOpt = None,
    interleave: InterleaveOpt = None,
    first_stage_layers: FirstLayersOpt = None,
    last_stage_layers: LastLayersOpt = None,
    cp: CpOpt = None,
    order: OrderOpt = None,
    fsdp_shard: FsdpShardOpt = None,
    precision: PrecisionOpt = None,
    flash_attention: FlashOpt = None,
    tp_overlap: TpOverlapOpt = None,
    tokens: TokensOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    profile: ProfileOpt = None,
    nccl_version: NcclVersionOpt = None,
    backend: BackendOpt = None,
    plot: Annotated[
        str | None, typer.Option(help="Write the step's Gantt chart to this PNG.")
    ] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Predict one training step: compute, communication, overlap, scaling, MFU, memory,
    buckets (data parallel) or pipeline/tensor-parallel parts (hybrid layouts)."""
    from commsim.report import plots
    from commsim.step.predict import predict

    with terminal.user_errors():
        setup = setup_from_flags(
            scenario,
            model=model,
            cluster=cluster,
            gpus=gpus,
            global_batch=global_batch,
            micro_batch=micro_batch,
            seq_len=seq_len,
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
            fsdp=fsdp,
            recompute=recompute,
            interleave=interleave,
            first_stage_layers=first_stage_layers,
            last_stage_layers=last_stage_layers,
            cp=cp,
            order=order,
            fsdp_shard=fsdp_shard,
            precision=precision,
            flash_attention=flash_attention,
            tp_overlap=tp_overlap,
            tokens=tokens,
            price_per_gpu_hour=price_per_gpu_hour,
            profile=profile,
            nccl_version=nccl_version,
            backend=backend,
        )
        pred = predict(setup)
        doc = {"scenario": setup.scenario.name, "gpus": setup.n_gpus} | pred.to_dict()
        if plot and pred.strategy.data_parallel_only:
            plots.plot_timeline(doc, pred.events, plot, setup.scenario.name)
        elif plot:
            plots.plot_pipeline(doc, pred.events, plot, setup.scenario.name)
    if json_out:
        terminal.print_json(doc)
        return
    _print_prediction(setup, doc, plot)


def _print_prediction(setup: Setup, doc: dict[str, Any], plot: str | None) -> None:
    """The step table (its title names the layout) and, for plain DDP, the buckets."""
    from commsim.report import labels, tables

    s = setup.scenario
    terminal.console.print(
        tables.step_table(
            f"{s.name}: {setup.workload.name} on {s.gpus} GPUs of {setup.cluster.spec.name} "
            f"({labels.describe_strategy(doc['strategy'])})",
            doc,
        )
    )
    if doc["buckets"]:
        terminal.console.print(tables.bucket_table(doc["buckets"]))
    if plot:
        terminal.console.print(f"timeline written to {plot}")
