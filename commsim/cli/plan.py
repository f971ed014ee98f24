"""`commsim plan`: search the strategies, or size the cluster (a range of GPU counts or
several fabrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from commsim.cli.options import (
    BackendOpt,
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
    setup_from_flags,
)
from commsim.cli.plan_options import (
    BudgetOpt,
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
    SweepPlotOpt,
    TopOpt,
)
from commsim.report import terminal

if TYPE_CHECKING:
    from commsim.planner.plan import PlanResult
    from commsim.planner.sizing import SizingRow
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
    backend: BackendOpt = None,
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
    if fabric or (gpus and ":" in gpus) or deadline or budget:
        sizing = dict(fabric=fabric, gpu=gpu, deadline=deadline, budget=budget, objective=objective)
        return _size_clusters(scenario, model, cluster, gpus, training, plot, json_out, **sizing)
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
    )
    stack = dict(precision=precision, flash_attention=flash_attention, tp_overlap=tp_overlap)
    with terminal.user_errors():
        setup = setup_from_flags(
            scenario,
            fsdp=fsdp,
            check=False,
            model=model,
            cluster=cluster,
            gpus=_gpu_count(gpus),
            **training,
            profile=profile,
            nccl_version=nccl_version,
            backend=backend,
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


def _sizing_title(spec, gpu: str | None) -> str:
    model = spec.model if isinstance(spec.model, str) else spec.model.name
    return (
        f"cluster sizing: {model}, {spec.tokens:.3g} tokens, global batch "
        f"{spec.global_batch}" + (f", {gpu}" if gpu else "")
    )


def _gpu_count(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--gpus must be a positive count or LOW:HIGH, not {text!r}")
    return int(text)


def _gpu_sizes(text: str | None, default: int) -> list[int]:
    """'256:16384' as 256, 512, ..., 16384; a single count as itself."""
    if text is None:
        return [default]
    lo, _, hi = text.partition(":")
    low, high = _gpu_count(lo), _gpu_count(hi or lo)
    if high < low:
        raise ValueError(f"--gpus {text}: HIGH must not be below LOW")
    sizes = [low]
    while sizes[-1] * 2 <= high:
        sizes.append(sizes[-1] * 2)
    return sizes


def _size_clusters(
    scenario: str | None,
    model: str | None,
    cluster: str | None,
    gpus: str | None,
    overrides: dict[str, Any],
    plot: str | None,
    json_out: bool,
    *,
    fabric: str | None,
    gpu: str | None,
    deadline: str | None,
    budget: float | None,
    objective: str,
) -> None:
    """`commsim plan` in sizing mode: best strategy per fabric and size, Pareto front, pick."""
    from commsim.planner.sizing import OBJECTIVES, pareto_front, size_clusters
    from commsim.report import plots
    from commsim.scenario import load_scenario
    from commsim.specs import SpecError
    from commsim.units import parse_time

    with terminal.user_errors():
        if objective not in OBJECTIVES:
            raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)}")
        spec, source = load_scenario(scenario, overrides | {"model": model, "cluster": cluster})
        if spec.tokens is None:
            raise SpecError(source, "tokens", "cluster sizing needs the training tokens (--tokens)")
        fabrics = (
            [f.strip() for f in fabric.split(",")]
            if fabric
            else [spec.cluster if isinstance(spec.cluster, str) else spec.cluster.name]
        )
        sizes = _gpu_sizes(gpus, spec.gpus)
        deadline_s = parse_time(deadline) if deadline else None
        with terminal.progress(len(fabrics) * len(sizes), "sizing") as bar:
            rows = size_clusters(
                spec, source, fabrics, sizes, gpu, on_progress=lambda: bar.advance(0)
            )
        front = pareto_front(rows)
        pick = _pick(rows, deadline_s, budget, objective)
        if plot:
            plots.plot_sizing(rows, front, pick, plot, _sizing_title(spec, gpu))
    why = (
        "the smallest cluster meeting the deadline"
        if deadline_s
        else "the fastest within the budget"
        if budget
        else f"the best {objective}"
    )
    _print_sizing(rows, front, pick, _sizing_title(spec, gpu), why, objective, plot, json_out)


def _pick(
    rows: list[SizingRow], deadline_s: float | None, budget: float | None, objective: str
) -> SizingRow | None:
    """The row a deadline or budget picks, else the best by the objective; None if none."""
    from commsim.planner.sizing import objective_value, pick_size

    if deadline_s or budget:
        return pick_size(rows, deadline_s, budget)
    return min(
        (r for r in rows if r.best),
        key=lambda r: objective_value(r, objective),
        default=None,
    )


def _print_sizing(
    rows: list[SizingRow],
    front: list[SizingRow],
    pick: SizingRow | None,
    title: str,
    why: str,
    objective: str,
    plot: str | None,
    json_out: bool,
) -> None:
    """The sizing table and the pick with why, or the --json document."""
    from commsim.report import labels, tables

    if json_out:
        terminal.print_json(
            {
                "sizing": [r.to_dict() for r in rows],
                "pareto": [r.to_dict() for r in front],
                "pick": pick.to_dict() if pick else None,
                "objective": objective,
            }
        )
        return
    terminal.console.print(tables.sizing_table(rows, front, pick, title))
    if pick:
        terminal.console.print(
            f"pick: {pick.gpus} GPUs of {pick.fabric}, {why}: "
            f"{labels.describe_strategy(pick.best.to_dict()['strategy'])}",
            highlight=False,
        )
    else:
        terminal.console.print("no cluster meets the deadline/budget", highlight=False)
    if plot:
        terminal.console.print(f"scaling curve and Pareto front drawn to {plot}")
