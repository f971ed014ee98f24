"""`commsim predict`: one training step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from commsim.cli.given import (
    LAYOUT_FLAGS,
    NCCL_FLAGS,
    STACK_FLAGS,
    TRAINING_FLAGS,
    blame_flags,
    blame_nccl_flags,
    input_files,
    pick,
)
from commsim.cli.options import (
    AlgorithmOpt,
    BackendOpt,
    BucketOpt,
    ClusterOpt,
    CompressionOpt,
    CpOpt,
    CsvOpt,
    DeepSpeedOpt,
    EfficiencyOpt,
    EpOpt,
    EpOverlapOpt,
    ErrorFeedbackOpt,
    EtpOpt,
    FirstLayersOpt,
    FlashOpt,
    FsdpOpt,
    FsdpShardOpt,
    GlobalBatchOpt,
    GpusOpt,
    GradDtypeOpt,
    HtmlOpt,
    InterleaveOpt,
    KernelsOpt,
    LastLayersOpt,
    LayersPerVirtualOpt,
    MicroBatchOpt,
    ModelOpt,
    NcclAlgoOpt,
    NcclProtoOpt,
    NcclVersionOpt,
    OrderOpt,
    OverlapOpt,
    ParamGatherOpt,
    PlacementOpt,
    PpOpt,
    PrecisionOpt,
    PriceOpt,
    ProfileOpt,
    RecomputeOpt,
    ReserveOpt,
    ReshardOpt,
    ScenarioArg,
    ScheduleOpt,
    SeqLenOpt,
    SequenceParallelOpt,
    TokensOpt,
    TpOpt,
    TpOverlapOpt,
    ZeroOpt,
)
from commsim.cli.step_setup import step_setup
from commsim.cli.traced import (
    TraceMbOpt,
    TraceOpt,
    TracePpOpt,
    TraceTpOpt,
    print_trace,
)
from commsim.report import terminal

if TYPE_CHECKING:
    from rich.table import Table

    from commsim.scenario import Setup
    from commsim.step.prediction import Prediction


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
    overlap_param_gather: ParamGatherOpt = None,
    compression: CompressionOpt = None,
    error_feedback: ErrorFeedbackOpt = None,
    tp: TpOpt = None,
    pp: PpOpt = None,
    ep: EpOpt = None,
    etp: EtpOpt = None,
    cp: CpOpt = None,
    zero: ZeroOpt = None,
    fsdp: FsdpOpt = False,
    recompute: RecomputeOpt = None,
    interleave: InterleaveOpt = None,
    layers_per_virtual_stage: LayersPerVirtualOpt = None,
    first_stage_layers: FirstLayersOpt = None,
    last_stage_layers: LastLayersOpt = None,
    order: OrderOpt = None,
    fsdp_shard: FsdpShardOpt = None,
    reshard_after_forward: ReshardOpt = None,
    precision: PrecisionOpt = None,
    flash_attention: FlashOpt = None,
    sequence_parallel: SequenceParallelOpt = None,
    kernels: KernelsOpt = None,
    grad_dtype: GradDtypeOpt = None,
    pipeline_schedule: ScheduleOpt = None,
    tp_overlap: TpOverlapOpt = None,
    ep_overlap: EpOverlapOpt = None,
    deepspeed: DeepSpeedOpt = None,
    tokens: TokensOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    memory_reserve: ReserveOpt = None,
    compute_efficiency: EfficiencyOpt = None,
    profile: ProfileOpt = None,
    nccl_version: NcclVersionOpt = None,
    nccl_algo: NcclAlgoOpt = None,
    nccl_proto: NcclProtoOpt = None,
    backend: BackendOpt = None,
    trace: TraceOpt = None,
    trace_tp: TraceTpOpt = None,
    trace_pp: TracePpOpt = None,
    trace_micro_batch: TraceMbOpt = None,
    plot: Annotated[
        str | None, typer.Option(help="Write the step's Gantt chart to this image (PNG, SVG).")
    ] = None,
    html: HtmlOpt = None,
    csv: CsvOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Predict one training step: compute, communication, overlap, scaling, MFU, memory,
    the batch arithmetic, buckets (data parallel) or pipeline/tensor-parallel parts."""
    setup, doc = _predict(locals())
    if json_out:
        terminal.print_json(doc)
        return
    for table in _tables(setup, doc):
        terminal.console.print(table)
    print_trace(doc.get("trace"))
    for path, what in ((plot, "timeline"), (html, "report"), (csv, "step")):
        if path:
            terminal.console.print(f"{what} written to {path}", highlight=False)


def _predict(args: dict[str, Any]) -> tuple[Setup, dict[str, Any]]:
    """The setup the flags (predict_cmd's locals()) give and its step as the output's
    document, with the --plot, --html and --csv files written; bad input names its flag."""
    from commsim.files import check_outputs
    from commsim.step.predict import predict

    scenario, plot, html, csv = (args[k] for k in ("scenario", "plot", "html", "csv"))
    flags = pick(args, ("model", "cluster", "gpus", *TRAINING_FLAGS, *LAYOUT_FLAGS, *STACK_FLAGS))
    flags |= pick(args, ("deepspeed", "profile"))
    nccl = pick(args, NCCL_FLAGS)
    with terminal.user_errors(), blame_flags(scenario, flags):
        check_outputs({"--plot": plot, "--html": html, "--csv": csv}, input_files(args))
        setup, traced = step_setup(args, flags)
        # pricing the graph's groups: about a second at 16,384 GPUs
        with blame_nccl_flags(nccl), terminal.progress(1, "pricing the step") as bar:
            pred = predict(setup)
            bar.advance(0)
        doc = _document(setup, pred, traced)
        terminal.require_finite(doc, "--tokens, --price-per-gpu-hour and the sizes given")
        inputs = flags | nccl | {"fsdp": args["fsdp"], "scenario": scenario}
        _write(setup, doc, pred, inputs, (plot, html, csv))
    return setup, doc


def _document(setup: Setup, pred: Prediction, traced: dict | None) -> dict[str, Any]:
    """The output: the scenario and GPUs, the prediction, the batch arithmetic, the trace."""
    from commsim.report.arithmetic import batch_arithmetic

    return (
        {"scenario": setup.scenario.name, "gpus": setup.n_gpus}
        | pred.to_dict()
        | {"batch": batch_arithmetic(setup, pred.strategy)}
        | ({"trace": traced} if traced else {})
    )


def _write(
    setup: Setup, doc: dict[str, Any], pred: Prediction, inputs: dict[str, Any], paths: tuple
) -> None:
    """The files asked for, (plot, html, csv) paths or None: the step's chart, the HTML
    report (with the `inputs` given), the step as one CSV row."""
    from commsim.report.rows import write_csv

    plot, html, csv = paths
    if plot:
        draw(setup, doc, pred, plot)
    if html:
        _html(setup, doc, pred, inputs, html)
    if csv:
        write_csv(csv, [doc])


def draw(setup: Setup, doc: dict[str, Any], pred: Prediction, path: str) -> None:
    """The step's chart: compute and communication streams for plain DDP, one row per
    pipeline stage otherwise."""
    from commsim.report import labels, plots

    title = labels.run_title(setup)
    if pred.strategy.data_parallel_only:
        plots.plot_timeline(doc, pred.events, path, title)
    else:
        plots.plot_pipeline(doc, pred.events, path, title)


def _tables(setup: Setup, doc: dict[str, Any]) -> list[Table]:
    """The step table (its title names what ran and the layout) and, for plain DDP, the
    buckets."""
    from commsim.report import labels, step

    out = [step.step_table(labels.run_title(setup), doc)]
    if doc["buckets"]:
        out.append(step.bucket_table(doc["buckets"]))
    return out


def _html(
    setup: Setup, doc: dict[str, Any], pred: Prediction, flags: dict[str, Any], path: str
) -> None:
    """The prediction as one HTML page: the tables, the step's chart, the inputs."""
    from commsim.report import labels, pages
    from commsim.report.html import Report, figure_png

    report = Report(f"commsim predict: {labels.run_title(setup)}")
    for table in _tables(setup, doc):
        report.table(table)
    report.figure(figure_png(lambda p: draw(setup, doc, pred, p)), "the step, stream by stream")
    pages.inputs(report, setup, flags)
    report.write(path)
