"""`commsim plan`: search the strategies, or size the cluster (a range of GPU counts or
several fabrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from commsim.cli.options import (
    ClusterOpt,
    ErrorFeedbackOpt,
    FirstLayersOpt,
    FlashOpt,
    FsdpOpt,
    GlobalBatchOpt,
    LastLayersOpt,
    MicroBatchOpt,
    ModelOpt,
    NcclVersionOpt,
    PrecisionOpt,
    PriceOpt,
    ProfileOpt,
    ScenarioArg,
    SeqLenOpt,
    TokensOpt,
    TpOverlapOpt,
    gpu_count,
    setup_from_flags,
)
from commsim.cli.plan_options import (
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
    OnlyFsdpShardOpt,
    OnlyInterleaveOpt,
    OnlyOrderOpt,
    OnlyOverlapOpt,
    OnlyPlacementOpt,
    OnlyPpOpt,
    OnlyRecomputeOpt,
    OnlyTpOpt,
    OnlyZeroOpt,
    RecoveryOpt,
    SparesOpt,
    SpareTargetOpt,
    SweepPlotOpt,
    TopOpt,
)
from commsim.cli.sizing import size_clusters_cmd
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
    objective: ObjectiveOpt = "time-to-train",
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
    nccl_version: NcclVersionOpt = None,
    tp: OnlyTpOpt = None,
    pp: OnlyPpOpt = None,
    ep: OnlyEpOpt = None,
    zero: OnlyZeroOpt = None,
    fsdp: FsdpOpt = False,
    recompute: OnlyRecomputeOpt = None,
    interleave: OnlyInterleaveOpt = None,
    first_stage_layers: FirstLayersOpt = None,
    last_stage_layers: LastLayersOpt = None,
    cp: OnlyCpOpt = None,
    order: OnlyOrderOpt = None,
    fsdp_shard: OnlyFsdpShardOpt = None,
    precision: PrecisionOpt = None,
    flash_attention: FlashOpt = None,
    tp_overlap: TpOverlapOpt = None,
    tokens: TokensOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    recovery: RecoveryOpt = None,
    checkpoint_interval: CheckpointIntervalOpt = None,
    async_save: AsyncSaveOpt = None,
    spares: SparesOpt = None,
    spare_target: SpareTargetOpt = None,
    top: TopOpt = 15,
    plot: SweepPlotOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Search strategies, ranked by step time: plain DDP in full detail (algorithm x bucket
    x overlap x placement x compression) and, for transformers, data x tensor x pipeline
    layouts (micro-batch, ZeRO, recomputation, interleaving, bucket, algorithm, overlap)."""
    training = dict(  # the same in both modes
        global_batch=global_batch,
        micro_batch=micro_batch,
        seq_len=seq_len,
        tokens=tokens,
        price_per_gpu_hour=price_per_gpu_hour,
    )
    failures = dict(
        recovery=recovery,
        interval=checkpoint_interval,
        async_save=async_save,
        spares=spares,
        spare_target=spare_target,
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
        cp=cp,
        order=order,
        fsdp_shard=fsdp_shard,
        precision=precision,
        tp_overlap=tp_overlap,
    )
    stack = dict(flash_attention=flash_attention)
    if fabric or (gpus and ":" in gpus) or deadline or budget:
        sizing = dict(fabric=fabric, gpu=gpu, deadline=deadline, budget=budget, objective=objective)
        pins = {k for k, v in (flags | {"micro_batch": micro_batch}).items() if v is not None}
        overrides = training | flags | stack | ({"zero": 3} if fsdp else {})
        pins |= {"zero"} if fsdp else set()
        with terminal.user_errors():
            if profile or nccl_version:
                raise ValueError(
                    "--profile and --nccl-version price one cluster: cluster sizing builds "
                    "each fabric from its template (set them in the fabric's file)"
                )
        return size_clusters_cmd(
            scenario, model, cluster, gpus, overrides, pins, failures, plot, json_out, **sizing
        )
    with terminal.user_errors():
        given = [f"--{k.replace('_', '-')}" for k, v in failures.items() if v is not None]
        if given:
            raise ValueError(
                f"{', '.join(given)}: failures and goodput apply to cluster sizing "
                "(--gpus LOW:HIGH, --fabric, --deadline or --budget); `commsim goodput` "
                "prices one cluster"
            )
        setup = setup_from_flags(
            scenario,
            fsdp=fsdp,
            check=False,
            model=model,
            cluster=cluster,
            gpus=gpu_count(gpus),
            **training,
            profile=profile,
            nccl_version=nccl_version,
            **flags,
            **stack,  # the user's stack: every searched layout runs it, none searched
        )
        given = flags | {"micro_batch": micro_batch}  # flags validated as scenario fields: pin them
        pinned = {k for k, v in given.items() if v is not None} | ({"zero"} if fsdp else set())
        result, sweep = _search(setup, pinned, plot)
    _show_plan(setup, result, sweep, top, plot, json_out)


def _search(
    setup: Setup, pinned: set[str], plot: str | None
) -> tuple[PlanResult, BandwidthSweep | None]:
    """Rank the strategies, the scenario's own values pinned where a flag gave them; with
    --plot, the plain-DDP winner's bandwidth sweep, drawn."""
    from commsim.planner.plan import plan
    from commsim.planner.sweep import bandwidth_sweep
    from commsim.report import plots

    base = setup.scenario.strategy
    with terminal.progress(1, "planning") as bar:
        result = plan(
            setup, base, pinned, on_progress=lambda n, of: bar.update(0, completed=n, total=of)
        )
    sweep = None
    if plot and result.ranked and result.ranked[0].strategy.data_parallel_only:
        sweep = bandwidth_sweep(setup, result.ranked[0].strategy)
        plots.plot_bandwidth_sweep(
            sweep, plot, f"{setup.scenario.name}: where compression stops paying"
        )
    elif plot:
        result.notes.append("--plot draws the compression sweep of a plain-DDP winner only")
    return result, sweep


def _show_plan(
    setup: Setup,
    result: PlanResult,
    sweep: BandwidthSweep | None,
    top: int,
    plot: str | None,
    json_out: bool,
) -> None:
    """The ranked table, why the winner wins, the notes and where compression stops paying,
    or the --json document; exit 1 when nothing can run."""
    from commsim.report import labels, tables

    docs = [p.to_dict() for p in result.ranked]
    if json_out:
        terminal.print_json(
            {
                "scenario": setup.scenario.name,
                "gpus": setup.n_gpus,
                "candidates": docs,
                "skipped": result.skipped,
                "notes": result.notes,
                "bandwidth_sweep": sweep
                and {
                    "nic_bandwidth_Bps": sweep.nic_bandwidth,
                    "step_time_s": sweep.step_time,
                    "crossover_Bps": sweep.crossovers,
                },
            }
        )
        return
    if not docs:
        terminal.err_console.print("no strategy can run here:", highlight=False)
        for note in result.notes:
            terminal.err_console.print(f"  {note}", highlight=False)
        raise typer.Exit(1)
    s = setup.scenario
    terminal.console.print(
        tables.plan_table(
            f"{s.name}: {setup.workload.name}, {s.gpus} GPUs of {setup.cluster.spec.name}, "
            f"global batch {s.global_batch}: {result.searched - result.skipped} of "
            f"{result.searched} layouts ranked",
            docs,
            top,
        )
    )
    for line in [*labels.explain_winner(docs), *result.notes]:
        terminal.console.print(line, highlight=False)
    if sweep:
        _print_crossovers(sweep, plot)


def _print_crossovers(sweep: BandwidthSweep, plot: str | None) -> None:
    """Where each compressor stops paying, from the bandwidth sweep."""
    for name, bw in sweep.crossovers.items():
        terminal.console.print(f"{name} stops paying above {bw * 8 / 1e9:.0f} Gb/s per NIC")
    if not sweep.crossovers:
        lo, hi = (b * 8 / 1e9 for b in (sweep.nic_bandwidth[0], sweep.nic_bandwidth[-1]))
        terminal.console.print(
            f"no compressor that pays here stops paying between {lo:g} and {hi:g} Gb/s per NIC"
        )
    terminal.console.print(f"bandwidth sweep drawn to {plot}")
