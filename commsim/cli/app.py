"""The `commsim` command line: plan, predict, collective, topo.

Every command prints a rich table, or with --json one JSON document on stdout. Bad input
prints one line naming the file and field on stderr and exits 2, never a traceback.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from commsim import catalog
from commsim.cli.calibrate import calibrate_app
from commsim.cli.testbed import testbed_app
from commsim.collectives.algorithms import ALGORITHMS, SEARCHED, bus_factor
from commsim.collectives.group import GroupCost
from commsim.planner.plan import plan
from commsim.planner.sizing import (
    OBJECTIVES,
    objective_value,
    pareto_front,
    pick_size,
    size_clusters,
)
from commsim.planner.sweep import bandwidth_sweep
from commsim.profile import apply_profile, load_profile
from commsim.report import labels, plots, tables, terminal
from commsim.scenario import Setup, load_scenario, resolve
from commsim.specs import ClusterSpec, SpecError, load_spec, parse_spec
from commsim.step.predict import predict
from commsim.topology.build import build_cluster
from commsim.topology.placement import place
from commsim.units import parse_size_range, parse_time

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Predict distributed-training step time and communication, and pick the strategy.",
)
topo_app = typer.Typer(no_args_is_help=True, help="Built-in cluster topologies.")
app.add_typer(topo_app, name="topo")
app.add_typer(calibrate_app, name="calibrate")
app.add_typer(testbed_app, name="testbed")


def _progress(total: int, label: str) -> Progress:
    """A progress bar on stderr, shown only if the work lasts over a second."""
    progress = Progress(
        TextColumn(label),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=terminal.err_console,
        transient=True,
    )
    progress.add_task(label, total=total)
    return progress


ScenarioArg = Annotated[
    str | None, typer.Argument(help="Scenario YAML (default: the built-in scenario).")
]
ModelOpt = Annotated[str | None, typer.Option(help="Model preset, e.g. gpt2-xl, llama2-7b.")]
ClusterOpt = Annotated[str | None, typer.Option(help="Topology name or YAML path.")]
GpusOpt = Annotated[int | None, typer.Option(help="Number of GPUs (data-parallel ranks).")]
GlobalBatchOpt = Annotated[int | None, typer.Option(help="Samples per optimizer step.")]
MicroBatchOpt = Annotated[int | None, typer.Option(help="Samples per GPU per micro-step.")]
SeqLenOpt = Annotated[int | None, typer.Option(help="Tokens per sample.")]
BucketOpt = Annotated[float | None, typer.Option(help="DDP bucket cap in MiB.")]
AlgorithmOpt = Annotated[
    str | None,
    typer.Option(
        help=f"All-reduce algorithm: {', '.join(('auto', 'nccl', *ALGORITHMS['all-reduce']))}."
    ),
]
PlacementOpt = Annotated[
    str | None, typer.Option(help="Rank placement: blocked, interleaved, topology-aware.")
]
OverlapOpt = Annotated[
    bool | None, typer.Option("--overlap/--no-overlap", help="Overlap all-reduce with backward.")
]
CompressionOpt = Annotated[
    str | None,
    typer.Option(
        help="Gradient compression: none, fp16, bf16, int8, topk:RATIO, randomk:RATIO, "
        "powersgd:RANK, sign, topk:RATIO+int8."
    ),
]
ErrorFeedbackOpt = Annotated[
    bool | None,
    typer.Option("--error-feedback/--no-error-feedback", help="Keep and resend what was dropped."),
]


TpOpt = Annotated[int | None, typer.Option("--tp", help="Tensor-parallel degree.")]
PpOpt = Annotated[int | None, typer.Option("--pp", help="Pipeline-parallel stages.")]
EpOpt = Annotated[
    int | None, typer.Option("--ep", help="Expert-parallel degree (MoE; out of data parallel).")
]
ZeroOpt = Annotated[int | None, typer.Option("--zero", help="ZeRO stage 0, 1, 2 or 3.")]
FsdpOpt = Annotated[bool, typer.Option("--fsdp", help="FSDP full shard (the same as --zero 3).")]
RecomputeOpt = Annotated[
    str | None, typer.Option(help="Activation recomputation: none, selective, full.")
]
InterleaveOpt = Annotated[
    int | None, typer.Option(help="Virtual pipeline stages per rank (interleaved 1F1B).")
]
FirstLayersOpt = Annotated[
    int | None,
    typer.Option(help="Layers on the first pipeline stage (uneven split; the rest even)."),
]
LastLayersOpt = Annotated[
    int | None,
    typer.Option(help="Layers on the last pipeline stage (uneven split; the rest even)."),
]
TokensOpt = Annotated[float | None, typer.Option(help="Training tokens, for time to train.")]
ProfileOpt = Annotated[
    str | None, typer.Option(help="Calibration profile (commsim calibrate fit) for the cluster.")
]
PriceOpt = Annotated[float | None, typer.Option(help="Price of one GPU-hour, for cost.")]
NcclVersionOpt = Annotated[
    str | None,
    typer.Option(help="NCCL whose tuning model prices the collectives (default: the cluster's)."),
]


def _setup(
    scenario: str | None,
    fsdp: bool = False,
    check: bool = True,
    nccl_version: str | None = None,
    **overrides: Any,
) -> Setup:
    if fsdp:
        overrides["zero"] = 3
    spec, source = load_scenario(scenario, overrides)
    if nccl_version is not None:  # a cluster field: the what-if API's dotted path
        from commsim.whatif import change

        spec = change(spec, {"cluster.nccl.version": nccl_version})
    return resolve(spec, source, check)


@app.command("predict")
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
    tokens: TokensOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    profile: ProfileOpt = None,
    nccl_version: NcclVersionOpt = None,
    plot: Annotated[
        str | None, typer.Option(help="Write the step's Gantt chart to this PNG.")
    ] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Predict one training step: compute, communication, overlap, scaling, MFU, memory,
    buckets (data parallel) or pipeline/tensor-parallel parts (hybrid layouts)."""
    with terminal.user_errors():
        setup = _setup(
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
            tokens=tokens,
            price_per_gpu_hour=price_per_gpu_hour,
            profile=profile,
            nccl_version=nccl_version,
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


@app.command("plan")
def plan_cmd(
    scenario: ScenarioArg = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    gpus: Annotated[
        str | None,
        typer.Option(help="GPU count, or LOW:HIGH to size the cluster (doubling from LOW)."),
    ] = None,
    fabric: Annotated[
        str | None,
        typer.Option(help="Cluster sizing: comma-separated topologies to compare (templates)."),
    ] = None,
    gpu: Annotated[
        str | None, typer.Option(help="Cluster sizing: GPU model to put in them.")
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(help="Cluster sizing: the smallest cluster that trains in this (30d)."),
    ] = None,
    budget: Annotated[
        float | None, typer.Option(help="Cluster sizing: the most money (or GPU-hours) to spend.")
    ] = None,
    objective: Annotated[
        str, typer.Option(help="Cluster sizing: time-to-train, cost, throughput-per-dollar.")
    ] = "time-to-train",
    global_batch: GlobalBatchOpt = None,
    micro_batch: MicroBatchOpt = None,
    seq_len: SeqLenOpt = None,
    bucket_mb: Annotated[
        float | None, typer.Option(help="Search only this bucket cap (MiB) instead of 1..200.")
    ] = None,
    algorithm: Annotated[
        str | None, typer.Option(help="Search only this algorithm instead of all.")
    ] = None,
    placement: Annotated[
        str | None, typer.Option(help="Search only this placement instead of all.")
    ] = None,
    overlap: Annotated[
        bool | None, typer.Option("--overlap/--no-overlap", help="Search only overlap on/off.")
    ] = None,
    compression: Annotated[
        str | None, typer.Option(help="Search only this gradient compression instead of several.")
    ] = None,
    error_feedback: ErrorFeedbackOpt = None,
    profile: ProfileOpt = None,
    nccl_version: NcclVersionOpt = None,
    tp: Annotated[
        int | None, typer.Option("--tp", help="Search only this tensor-parallel degree.")
    ] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="Search only this pipeline depth.")] = None,
    ep: Annotated[
        int | None, typer.Option("--ep", help="Search only this expert-parallel degree (MoE).")
    ] = None,
    zero: Annotated[int | None, typer.Option("--zero", help="Search only this ZeRO stage.")] = None,
    fsdp: FsdpOpt = False,
    recompute: Annotated[
        str | None, typer.Option(help="Search only this recomputation: none, selective, full.")
    ] = None,
    interleave: Annotated[
        int | None, typer.Option(help="Search only this interleaving (virtual stages).")
    ] = None,
    first_stage_layers: FirstLayersOpt = None,
    last_stage_layers: LastLayersOpt = None,
    tokens: TokensOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    top: Annotated[int, typer.Option(help="Rows to show.")] = 15,
    plot: Annotated[
        str | None,
        typer.Option(help="PNG: the winner's step time against NIC bandwidth per compressor."),
    ] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Search strategies, ranked by step time: plain DDP in full detail (algorithm x bucket
    x overlap x placement x compression) and, for transformers, data x tensor x pipeline
    layouts (micro-batch, ZeRO, recomputation, interleaving, bucket, algorithm, overlap)."""
    if fabric or (gpus and ":" in gpus) or deadline or budget:
        return _size_clusters(
            scenario,
            model,
            cluster,
            gpus,
            fabric,
            gpu,
            deadline,
            budget,
            objective,
            dict(
                global_batch=global_batch,
                micro_batch=micro_batch,
                seq_len=seq_len,
                tokens=tokens,
                price_per_gpu_hour=price_per_gpu_hour,
            ),
            plot,
            json_out,
        )
    with terminal.user_errors():
        flags = dict(
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
        setup = _setup(
            scenario,
            fsdp=fsdp,
            check=False,
            model=model,
            cluster=cluster,
            gpus=_gpu_count(gpus),
            global_batch=global_batch,
            micro_batch=micro_batch,
            seq_len=seq_len,
            tokens=tokens,
            price_per_gpu_hour=price_per_gpu_hour,
            profile=profile,
            nccl_version=nccl_version,
            **flags,
        )
        base = setup.scenario.strategy  # flags validated as scenario fields; now pin them
        pinned = {k for k, v in flags.items() if v is not None} | ({"zero"} if fsdp else set())
        if micro_batch is not None:
            pinned.add("micro_batch")
        with _progress(1, "planning") as bar:
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
        for name, bw in sweep.crossovers.items():
            terminal.console.print(f"{name} stops paying above {bw * 8 / 1e9:.0f} Gb/s per NIC")
        if not sweep.crossovers:
            lo, hi = (b * 8 / 1e9 for b in (sweep.nic_bandwidth[0], sweep.nic_bandwidth[-1]))
            terminal.console.print(
                f"no compressor that pays here stops paying between {lo:g} and {hi:g} Gb/s per NIC"
            )
        terminal.console.print(f"bandwidth sweep drawn to {plot}")


@app.command("collective")
def collective_cmd(
    op: Annotated[str, typer.Argument(help=", ".join(ALGORITHMS))],
    cluster: Annotated[str, typer.Option(help="Topology name or YAML path.")] = "dgx-h100-ib",
    gpus: Annotated[int, typer.Option(help="Ranks in the group.")] = 64,
    sizes: Annotated[
        str, typer.Option(help="Size sweep LOW:HIGH, doubling (nccl-tests -b/-e/-f 2).")
    ] = "8B:4GiB",
    algorithm: Annotated[
        str,
        typer.Option(
            help="'all' (those auto chooses among), 'auto' (fastest; NCCL's choice under "
            "NCCL), 'nccl' (NCCL's pick), 'a|b' (the faster) or one of the op's: "
            + "; ".join(f"{op}: {', '.join(algs)}" for op, algs in ALGORITHMS.items())
        ),
    ] = "all",
    placement: Annotated[
        str, typer.Option(help="blocked, interleaved or topology-aware.")
    ] = "blocked",
    ps_shards: Annotated[int, typer.Option(help="Parameter-server shards.")] = 1,
    backend: Annotated[
        str | None,
        typer.Option(help="nccl or gloo (default: the cluster's; nccl on GPUs)."),
    ] = None,
    nccl_version: Annotated[
        str | None, typer.Option(help="NCCL whose tuning model prices (default: the cluster's).")
    ] = None,
    profile: ProfileOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Time one collective over a size sweep, nccl-tests style (time, algbw, busbw); under
    NCCL, per size the algorithm, protocol and channels its tuner chooses and the runner-up."""
    with terminal.user_errors():
        if op not in ALGORITHMS:
            raise ValueError(f"unknown op {op!r} (choose from {', '.join(ALGORITHMS)})")
        spec = load_spec(ClusterSpec, catalog.topology_path(cluster, cluster))
        if profile:
            spec = apply_profile(spec, load_profile(profile), profile)
        spec = _with_backend(spec, backend, nccl_version, cluster)
        built = build_cluster(spec, gpus, cluster)
        cost = GroupCost(built, place(built, gpus, placement), ps_shards=ps_shards)
        lo, hi = parse_size_range(sizes)
        grid = lo * 2.0 ** np.arange(int(np.floor(np.log2(hi / lo) + 1e-9)) + 1)
        algs = SEARCHED[op] if algorithm == "all" else (algorithm,)
        rows = []
        with _progress(len(algs), f"{op} on {gpus} GPUs") as bar:
            for alg in algs:
                times, chosen = cost.time_and_choice(op, alg, grid)
                detail = cost.nccl_detail(op, alg, grid) if len(algs) == 1 else None
                for i, (size, t, name) in enumerate(zip(grid, times, chosen, strict=True)):
                    algbw = size / t if t > 0 else float("inf")
                    row = {
                        "bytes": float(size),
                        "time_s": float(t),
                        "algbw_Bps": algbw,
                        "busbw_Bps": algbw * bus_factor(op, gpus),
                        "algorithm": name,
                        "requested": alg,
                    }
                    if detail:
                        row |= {k: v[i] for k, v in detail.items()}
                    rows.append(row)
                bar.advance(0)
    if json_out:
        terminal.print_json(
            {
                "op": op,
                "cluster": spec.name,
                "gpus": gpus,
                "placement": placement,
                "backend": cost.backend,
                "nccl_version": spec.nccl.version if cost.backend == "nccl" else None,
                "rows": rows,
            }
        )
        return
    shown = [r | {"algorithm": r["requested"]} for r in rows]
    terminal.console.print(
        tables.collective_table(
            f"{op}: {gpus} GPUs of {spec.name}, {placement} placement, {cost.backend}", shown, algs
        )
    )
    if rows and "protocol" in rows[0]:
        terminal.console.print(
            tables.nccl_choice_table(f"what NCCL {spec.nccl.version} runs, and why", rows)
        )
    elif algorithm in ("auto", "nccl"):
        picks = sorted({r["algorithm"] for r in rows})
        terminal.console.print(f"{algorithm} picked: {', '.join(picks)}")


def _with_backend(spec: ClusterSpec, backend, version, source: str) -> ClusterSpec:
    """The spec with --backend and --nccl-version applied (validated as spec fields)."""
    if backend is None and version is None:
        return spec
    data = spec.model_dump()
    if backend is not None:
        data["backend"] = backend
    if version is not None:
        data["nccl"]["version"] = version
    return parse_spec(ClusterSpec, data, source)


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
    scenario,
    model,
    cluster,
    gpus,
    fabric,
    gpu,
    deadline,
    budget,
    objective,
    overrides,
    plot,
    json_out,
) -> None:
    """`commsim plan` in sizing mode: best strategy per fabric and size, Pareto front, pick."""
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
        with _progress(len(fabrics) * len(sizes), "sizing") as bar:
            rows = size_clusters(
                spec, source, fabrics, sizes, gpu, on_progress=lambda: bar.advance(0)
            )
        front = pareto_front(rows)
        pick = (
            pick_size(rows, deadline_s, budget)
            if deadline_s or budget
            else min(
                (r for r in rows if r.best),
                key=lambda r: objective_value(r, objective),
                default=None,
            )
        )
        if plot:
            plots.plot_sizing(rows, front, pick, plot, _sizing_title(spec, gpu))
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
    terminal.console.print(tables.sizing_table(rows, front, pick, _sizing_title(spec, gpu)))
    if pick:
        why = (
            "the smallest cluster meeting the deadline"
            if deadline_s
            else "the fastest within the budget"
            if budget
            else f"the best {objective}"
        )
        terminal.console.print(
            f"pick: {pick.gpus} GPUs of {pick.fabric}, {why}: "
            f"{labels.describe_strategy(pick.best.to_dict()['strategy'])}",
            highlight=False,
        )
    else:
        terminal.console.print("no cluster meets the deadline/budget", highlight=False)
    if plot:
        terminal.console.print(f"scaling curve and Pareto front drawn to {plot}")


@topo_app.command("list")
def topo_list(json_out: terminal.JsonOpt = False) -> None:
    """The built-in cluster files."""
    with terminal.user_errors():
        specs = [load_spec(ClusterSpec, catalog.topology_path(n)) for n in catalog.topology_names()]
    if json_out:
        terminal.print_json(
            {
                "topologies": [
                    {
                        "name": s.name,
                        "description": s.description,
                        "nodes": s.nodes,
                        "gpus": s.total_gpus,
                        "gpu": s.node.gpu,
                    }
                    for s in specs
                ]
            }
        )
        return
    from rich.table import Table

    table = Table(title="built-in topologies", title_justify="left")
    for col in ("name", "GPUs", "GPU", "description"):
        table.add_column(col)
    for s in specs:
        table.add_row(s.name, str(s.total_gpus), s.node.gpu, s.description)
    terminal.console.print(table)


@topo_app.command("show")
def topo_show(
    name: Annotated[str, typer.Argument(help="Topology name or YAML path.")],
    gpus: Annotated[
        int | None, typer.Option(help="Build only the nodes this many GPUs need.")
    ] = None,
    plot: Annotated[str | None, typer.Option(help="Draw the graph to this PNG.")] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """A topology's summary: nodes, NICs, tiers, bandwidths, switch counts; --plot draws it."""
    with terminal.user_errors():
        spec = load_spec(ClusterSpec, catalog.topology_path(name, name))
        built = build_cluster(spec, gpus, name)
        summary = built.summary()
        if plot:
            plots.plot_topology(built.graph, plot, f"{spec.name} ({built.n_gpus} GPUs)")
    if json_out:
        terminal.print_json(summary)
        return
    terminal.console.print(tables.topology_table(summary))
    if spec.source:
        terminal.console.print(f"[dim]source: {spec.source.strip()}[/dim]")
    if plot:
        terminal.console.print(f"graph drawn to {plot}")


compression_app = typer.Typer(no_args_is_help=True, help="Gradient compressors: measure them.")
app.add_typer(compression_app, name="compression")

BENCH_COMPRESSORS = (
    "none,fp16,bf16,int8,topk:0.05,topk:0.01,topk:0.05+int8,randomk:0.05,powersgd:4,sign"
)
# One transformer block's weight gradients at hidden 1024 (QKV, proj, MLP up, MLP down),
# flattened into one DDP bucket: 12.6 M fp32 values, 50 MB.
BLOCK_SHAPES = ((3072, 1024), (1024, 1024), (4096, 1024), (1024, 4096))


def _compressor_list(text: str) -> list[str]:
    from commsim.compression import parse_compressor

    return [parse_compressor(c).spec for c in text.split(",") if c.strip()]


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
    from commsim.compression import measure, synthetic_gradients
    from commsim.convergence import mlp_gradients

    with terminal.user_errors():
        specs = _compressor_list(compressors)
        sources = {
            "synthetic block": np.concatenate(
                [g.ravel() for g in synthetic_gradients(BLOCK_SHAPES)]
            ),
            "digits MLP": np.concatenate([g.ravel() for g in mlp_gradients()]),
        }
        rows = []
        with _progress(len(specs) * len(sources), "measuring") as bar:
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

    with terminal.user_errors():
        modes = {"both": "both", "on": True, "off": False}
        if error_feedback not in modes:
            raise ValueError(f"--error-feedback must be both, on or off, not {error_feedback!r}")
        if steps < 1 or workers < 1:
            raise ValueError("--steps and --workers must be at least 1")
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


if __name__ == "__main__":
    app()


@app.command("claims")
def claims_cmd(
    files: Annotated[
        list[str] | None,
        typer.Argument(help="Scenario files with a claim (default: scenarios/seeds/*.yaml)."),
    ] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Check the figures the seed documents state against commsim's model of their setup."""
    from commsim import claims

    with terminal.user_errors():
        paths = files or [str(p) for p in claims.seed_files()]
        if not paths:
            raise ValueError(f"no scenario files given and none in {claims.SEED_DIR}")
        results = []
        with _progress(len(paths), "checking claims") as bar:
            for path in paths:
                results.append(claims.check_claims(path))
                bar.advance(0)
    if json_out:
        terminal.print_json({"claims": [r.to_dict() for r in results]})
        return
    terminal.console.print(tables.claims_table(results))
    held = sum(r.holds for r in results)
    terminal.console.print(
        f"{held} of {len(results)} claims hold (a claim holds when all its checks do; "
        "(Nx): commsim's figure over the stated one). Each file's `reading` says what it "
        "assumes and why a figure does or does not follow."
    )
