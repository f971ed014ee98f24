"""`commsim plan`: search the strategies, or size the cluster (a range of GPU counts or
several fabrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from commsim.cli import plan_show
from commsim.cli.given import (
    LAYOUT_FLAGS,
    NCCL_FLAGS,
    STACK_FLAGS,
    TRAINING_FLAGS,
    blame_flags,
    blame_nccl_flags,
    flag,
    input_files,
    pick,
)
from commsim.cli.options import (
    FSDP,
    BackendOpt,
    ClusterOpt,
    CsvOpt,
    DeepSpeedOpt,
    EfficiencyOpt,
    EpOverlapOpt,
    ErrorFeedbackOpt,
    FirstLayersOpt,
    FlashOpt,
    FsdpOpt,
    GlobalBatchOpt,
    GradDtypeOpt,
    HtmlOpt,
    KernelsOpt,
    LastLayersOpt,
    LayersPerVirtualOpt,
    MicroBatchOpt,
    ModelOpt,
    NcclAlgoOpt,
    NcclProtoOpt,
    NcclVersionOpt,
    ParamGatherOpt,
    PrecisionOpt,
    PriceOpt,
    ProfileOpt,
    ReserveOpt,
    ScenarioArg,
    ScheduleOpt,
    SeqLenOpt,
    SequenceParallelOpt,
    TokensOpt,
    TpOverlapOpt,
    gpu_count,
)
from commsim.cli.plan_options import (
    DEFAULT_TOP,
    FAILURE_FLAGS,
    AsyncSaveOpt,
    BudgetOpt,
    CheckpointIntervalOpt,
    DeadlineOpt,
    FabricOpt,
    GpuOpt,
    GpusOrRangeOpt,
    ObjectiveOpt,
    OnlyAlgorithmOpt,
    OnlyBucketOpt,
    OnlyCompressionOpt,
    OnlyCpOpt,
    OnlyEpOpt,
    OnlyEtpOpt,
    OnlyFsdpShardOpt,
    OnlyInterleaveOpt,
    OnlyOrderOpt,
    OnlyOverlapOpt,
    OnlyPlacementOpt,
    OnlyPpOpt,
    OnlyRecomputeOpt,
    OnlyReshardOpt,
    OnlyTpOpt,
    OnlyZeroOpt,
    RecoveryOpt,
    SparesOpt,
    SpareTargetOpt,
    SweepPlotOpt,
    TopOpt,
)
from commsim.cli.sizing import size_clusters_cmd
from commsim.cli.step_setup import step_setup
from commsim.cli.traced import (
    TRACE_FLAGS,
    TraceMbOpt,
    TraceOpt,
    TracePpOpt,
    TraceTpOpt,
    print_trace,
)
from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.planner.plan import PlanResult
    from commsim.planner.sweep import BandwidthSweep
    from commsim.scenario import Setup


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
    overlap_param_gather: ParamGatherOpt = None,
    compression: OnlyCompressionOpt = None,
    error_feedback: ErrorFeedbackOpt = None,
    profile: ProfileOpt = None,
    nccl_version: NcclVersionOpt = None,
    nccl_algo: NcclAlgoOpt = None,
    nccl_proto: NcclProtoOpt = None,
    backend: BackendOpt = None,
    trace: TraceOpt = None,
    trace_tp: TraceTpOpt = None,
    trace_pp: TracePpOpt = None,
    trace_micro_batch: TraceMbOpt = None,
    tp: OnlyTpOpt = None,
    pp: OnlyPpOpt = None,
    ep: OnlyEpOpt = None,
    etp: OnlyEtpOpt = None,
    zero: OnlyZeroOpt = None,
    fsdp: FsdpOpt = False,
    recompute: OnlyRecomputeOpt = None,
    interleave: OnlyInterleaveOpt = None,
    layers_per_virtual_stage: LayersPerVirtualOpt = None,
    first_stage_layers: FirstLayersOpt = None,
    last_stage_layers: LastLayersOpt = None,
    cp: OnlyCpOpt = None,
    order: OnlyOrderOpt = None,
    fsdp_shard: OnlyFsdpShardOpt = None,
    reshard_after_forward: OnlyReshardOpt = None,
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
    recovery: RecoveryOpt = None,
    checkpoint_interval: CheckpointIntervalOpt = None,
    async_save: AsyncSaveOpt = None,
    spares: SparesOpt = None,
    spare_target: SpareTargetOpt = None,
    top: TopOpt = None,
    plot: SweepPlotOpt = None,
    html: HtmlOpt = None,
    csv: CsvOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Search strategies, ranked by step time: plain DDP in full detail (algorithm x bucket
    x overlap x placement x compression) and, for transformers, data x tensor x pipeline
    layouts (micro-batch, ZeRO, recomputation, interleaving, bucket, algorithm, overlap)."""
    _plan(locals())


def _plan(args: dict[str, Any]) -> None:
    """Check the flags against the mode they select, then size clusters or plan one."""
    from commsim.files import check_outputs

    failures = pick(args, FAILURE_FLAGS)
    one_cluster = pick(args, ("profile", *NCCL_FLAGS, "deepspeed", *TRACE_FLAGS))
    one_cluster["num_layers_per_virtual_pipeline_stage"] = args["layers_per_virtual_stage"]
    sizing = args["fabric"] is not None or ":" in (args["gpus"] or "")
    sizing |= args["deadline"] is not None or args["budget"] is not None
    with terminal.user_errors():
        sizing_only = pick(args, ("gpu", "objective"))
        _check_mode(sizing, args["top"], sizing_only, failures, one_cluster)
        check_outputs({f"--{k}": args[k] for k in ("plot", "html", "csv")}, input_files(args))
    flags = pick(args, LAYOUT_FLAGS)  # the search dimensions a flag pins
    pins = {k for k, v in (flags | pick(args, ("micro_batch",))).items() if v is not None}
    pins |= {"zero"} if args["fsdp"] else set()  # flags validated as scenario fields: pin them
    if not sizing:
        return _plan_one_cluster(args, flags, pins)
    training = pick(args, TRAINING_FLAGS)
    overrides = training | flags | pick(args, STACK_FLAGS) | (FSDP if args["fsdp"] else {})
    size_clusters_cmd(
        *(args[k] for k in ("scenario", "model", "cluster", "gpus")),
        overrides,
        pins,
        failures,
        args["json_out"],
        **pick(args, ("fabric", "gpu", "deadline", "budget", "plot", "html", "csv")),
        objective="time-to-train" if args["objective"] is None else args["objective"],
    )


def _plan_one_cluster(args: dict[str, Any], flags: dict[str, Any], pins: set[str]) -> None:
    """Rank one cluster's layouts, the flags' values pinned; print, or write the files."""
    from commsim.scenario import check_pins

    scenario, plot, html, csv = (args[k] for k in ("scenario", "plot", "html", "csv"))
    top = DEFAULT_TOP if args["top"] is None else args["top"]
    nccl = pick(args, NCCL_FLAGS)
    given = pick(args, ("model", "cluster", "gpus", "profile", "deepspeed"))
    given |= pick(args, TRAINING_FLAGS) | flags | pick(args, STACK_FLAGS)
    with terminal.user_errors(), blame_flags(scenario, given):
        setup, traced = step_setup(args, given | {"gpus": gpu_count(args["gpus"])}, check=False)
        pinned = pins | ({"interleave"} if args["layers_per_virtual_stage"] else set())
        check_pins(setup.workload, setup.scenario.strategy, pinned, setup.source)
        with blame_nccl_flags(nccl):
            result, sweep = _search(setup, pinned, plot)
        doc = plan_show.plan_doc(setup, result, sweep) | ({"trace": traced} if traced else {})
        if not doc["candidates"]:
            plan_show.explain_empty(setup, pinned)
        terminal.require_finite(doc, "--tokens and --price-per-gpu-hour")
        inputs = given | nccl | {"scenario": scenario}
        plan_show.write_files(setup, result, doc, top, inputs, (csv, html), sweep)
    if args["json_out"]:
        terminal.print_json(doc)
        return
    plan_show.show(setup, doc, top, sweep, plot)
    print_trace(doc.get("trace"))
    if html or csv:
        terminal.console.print(f"written: {', '.join(p for p in (html, csv) if p)}")


def _check_mode(
    sizing: bool,
    top: int | None,
    sizing_only: dict[str, Any],
    failures: dict[str, Any],
    one_cluster: dict[str, Any],
) -> None:
    """Refuse a flag the chosen mode would ignore: --gpu, --objective and the failure flags
    only size clusters; a profile, an NCCL version, a DeepSpeed config, Megatron's layers
    per virtual stage and --top (the ranking's rows) describe one cluster's layout, which
    sizing does not build (it shows every size it priced)."""
    if top is not None and top < 1:
        raise ValueError(f"--top {top}: show at least 1 row")
    if not sizing:
        for name, value in sizing_only.items():
            if value is not None:
                raise ValueError(
                    f"--{name}: applies to cluster sizing only (give --gpus LOW:HIGH, --fabric, "
                    "--deadline or --budget)"
                )
        given = [flag(k) for k, v in failures.items() if v is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)}: failures and goodput apply to cluster sizing "
                "(--gpus LOW:HIGH, --fabric, --deadline or --budget); `commsim goodput` "
                "prices one cluster"
            )
        return
    if top is not None:
        raise ValueError(f"--top {top}: rows of one cluster's ranking; sizing shows every size")
    given = [flag(k) for k, v in one_cluster.items() if v is not None]
    if given:
        raise ValueError(
            f"{', '.join(given)}: not in cluster sizing, which builds each fabric from its "
            "template and searches its layouts (give the cluster's figures in the fabric's "
            "file; pin --zero, --interleave, ... by flag)"
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
