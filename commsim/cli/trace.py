"""`commsim trace`: PyTorch profiler traces summarised, replayed and predicted on a cluster
(also at another scale), turned into calibration points; Chakra traces written for any
layout and read back. Heavy imports happen inside the commands (commsim --help stays fast).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from commsim.cli.options import (
    AlgorithmOpt,
    BucketOpt,
    ClusterOpt,
    CompressionOpt,
    CpOpt,
    EpOpt,
    ErrorFeedbackOpt,
    EtpOpt,
    FsdpOpt,
    FsdpShardOpt,
    GlobalBatchOpt,
    GpusOpt,
    InterleaveOpt,
    MicroBatchOpt,
    ModelOpt,
    OrderOpt,
    OverlapOpt,
    ParamGatherOpt,
    PlacementOpt,
    PpOpt,
    RecomputeOpt,
    ScenarioArg,
    SeqLenOpt,
    TpOpt,
    TpOverlapOpt,
    ZeroOpt,
)
from commsim.cli.trace_kernels import Traces, kernels_cmd
from commsim.report import terminal
from commsim.units import fmt_time

if TYPE_CHECKING:
    from commsim.traces.graph import Graph

trace_app = typer.Typer(no_args_is_help=True, help="Profiler and Chakra traces in and out.")
StepOpt = Annotated[int | None, typer.Option(help="ProfilerStep number (default: the median).")]
ProfOpt = Annotated[str | None, typer.Option("--profile", help="Calibration profile YAML.")]


def _cluster(name: str, profile: str | None, gpus: int):
    """The cluster graph a replay prices on, a profile's fitted links written in."""
    from commsim import catalog
    from commsim.profile import apply_profile, load_profile
    from commsim.spec_io import load_spec
    from commsim.specs import ClusterSpec
    from commsim.topology.build import build_cluster

    spec = load_spec(ClusterSpec, catalog.topology_path(name, name))
    if profile:
        spec = apply_profile(spec, load_profile(profile), profile)
    return build_cluster(spec, gpus)


def _check_pricing(cluster: str | None, **given) -> None:
    """The pricing flags a trace command was given (`algorithm`, `placement`, `step`,
    `profile`: None when not): each needs --cluster, and an algorithm or placement must be
    one commsim prices; a SpecError naming the flag otherwise."""
    from commsim.specs import SpecError
    from commsim.step.layouts import ALGORITHMS
    from commsim.topology.placement import PLACEMENTS

    known = {"algorithm": ALGORITHMS, "placement": PLACEMENTS}
    for key, value in given.items():
        flag = f"--{key}"
        if value is not None and not cluster:
            raise SpecError(flag, "", "needs --cluster (it only changes the prediction)")
        if value is not None and key in known and value not in known[key]:
            raise SpecError(flag, "", f"{value!r}: not one of {', '.join(known[key])}")


def _price(
    graph: Graph, cluster: str, profile: str | None, gpus: int, algorithm, placement, shards=1
):
    from commsim.traces.pricing import ClusterPricer

    built = _cluster(cluster, profile, gpus)
    return ClusterPricer(graph, built, gpus, algorithm, placement, shards)


@trace_app.command("summary")
def summary_cmd(
    traces: Traces,
    cluster: ClusterOpt = None,
    profile: ProfOpt = None,
    algorithm: Annotated[
        str | None, typer.Option(help="Algorithm the prediction prices (default: auto).")
    ] = None,
    step: StepOpt = None,
    plot: Annotated[
        str | None, typer.Option(help="PNG: the measured step beside commsim's (needs --cluster).")
    ] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Per rank and step: compute, communication, exposed communication; each collective's
    algbw and busbw."""
    from commsim.files import check_output
    from commsim.report.traces import plot_step, summary_tables
    from commsim.specs import SpecError
    from commsim.traces.imported import import_step
    from commsim.traces.kineto import read_traces
    from commsim.traces.replay import replay
    from commsim.traces.summary import summarize

    with terminal.user_errors():
        if plot and not cluster:
            raise SpecError("--plot", "", "needs --cluster to predict the step it draws beside")
        check_output(plot, "--plot", image=True)
        _check_pricing(cluster, profile=profile, algorithm=algorithm, step=step)
        read = read_traces(traces)
        s = summarize(read)
        doc = s.to_dict()
        if cluster:
            graph = import_step(read, step)
            world = max(t.world for t in read)
            price = _price(graph, cluster, profile, world, algorithm or "auto", "blocked")
            measured, predicted = replay(graph), replay(graph, price)
            doc["prediction"] = {
                "step": int(graph.metadata["step"]),
                "replayed_s": measured.step_s,
                "predicted_s": predicted.step_s,
                "kept_as_traced": sorted(price.kept),
            }
            if plot:
                plot_step(read, graph, predicted, plot)
    if json_out:
        terminal.print_json(doc)
        return
    for table in summary_tables(s):
        terminal.console.print(table)
    if "prediction" in doc:
        p = doc["prediction"]
        terminal.console.print(
            f"step {p['step']} replayed as traced: {fmt_time(p['replayed_s'])}; "
            f"priced on {cluster}: {fmt_time(p['predicted_s'])}"
        )
    if plot:
        terminal.console.print(f"plot written to {plot}")


@trace_app.command("predict")
def predict_cmd(
    traces: Traces,
    cluster: Annotated[str, typer.Option(help="Topology name or YAML to predict on.")],
    gpus: Annotated[
        int | None, typer.Option(help="GPUs at the new scale (default: traced).")
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree of the traced run.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages of the traced run.")] = 1,
    profile: ProfOpt = None,
    algorithm: Annotated[str, typer.Option(help="Algorithm collectives run.")] = "auto",
    placement: Annotated[
        str, typer.Option(help="blocked, interleaved, topology-aware.")
    ] = "blocked",
    step: StepOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """The traced step replayed on a cluster's cost model, at the traced scale or another."""
    from commsim.traces.imported import import_step
    from commsim.traces.kineto import read_traces
    from commsim.traces.replay import replay
    from commsim.traces.retarget import ASSUMPTIONS, check_layout, retarget

    with terminal.user_errors():
        _check_pricing(cluster, algorithm=algorithm, placement=placement)
        read = read_traces(traces)
        world = read[0].world
        n = world if gpus is None else gpus
        check_layout(world, n, tp, pp)
        graph = import_step(read, step)
        target = retarget(graph, world, n, tp, pp) if n != world else graph
        price = _price(target, cluster, profile, n, algorithm, placement)
        doc = {
            "step": int(graph.metadata["step"]),
            "traced_gpus": world,
            "gpus": n,
            "layout": {"tp": tp, "pp": pp, "dp_traced": world // (tp * pp), "dp": n // (tp * pp)},
            "traced_s": replay(graph).step_s,
            "predicted_s": replay(target, price).step_s,
            "assumptions": list(ASSUMPTIONS),
            "kept_as_traced": sorted(price.kept),
        }
    if json_out:
        terminal.print_json(doc)
        return
    terminal.console.print(
        f"step {doc['step']}: {fmt_time(doc['traced_s'])} on {world} traced ranks; "
        f"predicted {fmt_time(doc['predicted_s'])} on {n} GPUs of {cluster} "
        f"(tp {tp}, pp {pp}, dp {doc['layout']['dp']})"
    )
    for a in doc["assumptions"] + [f"kept as traced: {k}" for k in doc["kept_as_traced"]]:
        terminal.console.print(f"assumed: {a}", highlight=False)


def _prefix_dir(prefix: str) -> None:
    """The directory `trace export`'s files go to, made if missing; a file in its way is a
    SpecError naming --out."""
    from pathlib import Path

    from commsim.specs import SpecError

    try:
        Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecError(
            f"--out {prefix!r}", "", f"cannot make its directory: {e.strerror}"
        ) from None


# the scenario fields `trace export` takes flags for (cli.given's names)
EXPORT_FLAGS = (
    *("global_batch", "micro_batch", "seq_len", "bucket_mb", "algorithm", "placement"),
    *("overlap", "compression", "error_feedback", "tp", "pp", "ep", "etp", "cp", "zero"),
    *("fsdp_shard", "recompute", "interleave", "order", "tp_overlap", "overlap_param_gather"),
)


@trace_app.command("export")
def export_cmd(
    out: Annotated[str, typer.Option(help="Prefix of the files: PREFIX.<rank>.et")],
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
    etp: EtpOpt = None,
    cp: CpOpt = None,
    zero: ZeroOpt = None,
    fsdp: FsdpOpt = False,
    fsdp_shard: FsdpShardOpt = None,
    recompute: RecomputeOpt = None,
    interleave: InterleaveOpt = None,
    order: OrderOpt = None,
    tp_overlap: TpOverlapOpt = None,
    overlap_param_gather: ParamGatherOpt = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Write the Chakra execution trace (one .et file per rank) of a layout's step: data,
    tensor, pipeline, context and expert parallelism (folded grids too), ZeRO 0-3 and
    hybrid sharding, compression (plain DDP), the parameter server. Refused (scenario
    fields): ep_overlap (expert all-to-alls under another micro-batch's compute) and
    zero3_issue: parameter (DeepSpeed's 2021 per-tensor ZeRO-3)."""
    args = locals()  # the flags as given
    import os

    from commsim.cli.given import blame_flags, pick, refuse_ignored
    from commsim.cli.options import setup_from_flags
    from commsim.files import write_atomic
    from commsim.specs import SpecError
    from commsim.traces.chakra import chakra_files
    from commsim.traces.export import export_graph
    from commsim.traces.replay import replay

    flags = pick(args, ("model", "cluster", "gpus", *EXPORT_FLAGS))
    with terminal.user_errors(), blame_flags(scenario, flags):
        if not out.strip() or out.endswith(("/", os.sep)):
            raise SpecError(f"--out {out!r}", "", "names no file: give PREFIX for PREFIX.<rank>.et")
        setup = setup_from_flags(scenario, fsdp=fsdp, **flags)
        refuse_ignored(setup.scenario, flags)
        graph, predicted = export_graph(setup)
        files = chakra_files(graph, graph.metadata)  # all built before any is written
        _prefix_dir(out)
        with terminal.progress(len(files), "writing .et files") as bar:
            for rank, data in files.items():
                write_atomic(f"{out}.{rank}.et", data)
                bar.advance(bar.task_ids[0])
        doc = {
            "files": len(files),
            "prefix": out,
            "replayed_s": replay(graph).step_s,
            "predicted_s": predicted,
            "nodes": graph.counts(),
        }
    if json_out:
        terminal.print_json(doc)
        return
    terminal.console.print(
        f"{doc['files']} files {out}.<rank>.et; step {fmt_time(doc['replayed_s'])} "
        f"(predict: {fmt_time(predicted)}); nodes: "
        + ", ".join(f"{k} {v}" for k, v in doc["nodes"].items())
    )


@trace_app.command("import")
def import_cmd(
    files: Annotated[list[str], typer.Argument(help="Chakra .et files, one per rank.")],
    cluster: ClusterOpt = None,
    profile: ProfOpt = None,
    algorithm: Annotated[str | None, typer.Option(help="Default: the trace's, else auto.")] = None,
    placement: Annotated[
        str | None, typer.Option(help="Default: the trace's, else blocked.")
    ] = None,
    json_out: terminal.JsonOpt = False,
) -> None:
    """Replay Chakra traces: as recorded, and with --cluster on commsim's cost model."""
    from commsim.specs import SpecError
    from commsim.traces.chakra import import_chakra
    from commsim.traces.replay import replay

    with terminal.user_errors():
        _check_pricing(cluster, profile=profile, algorithm=algorithm, placement=placement)
        graph = import_chakra(files)
        doc = {
            "ranks": len(graph.ranks),
            "nodes": graph.counts(),
            "recorded_s": replay(graph).step_s,
        }
        if cluster:
            n = max(r for _, rs in graph.groups.values() for r in rs) + 1
            alg = algorithm or graph.metadata.get("algorithm", "auto")
            where = placement or graph.metadata.get("placement", "blocked")
            shards = graph.metadata.get("ps_shards", "1")  # a parameter server's (export's)
            if not shards.isdigit() or int(shards) < 1:
                raise SpecError(files[0], "metadata.ps_shards", f"{shards!r}: not a server count")
            price = _price(graph, cluster, profile, n, alg, where, int(shards))
            doc |= {"priced_s": replay(graph, price).step_s, "kept_as_traced": sorted(price.kept)}
    if json_out:
        terminal.print_json(doc)
        return
    line = f"{doc['ranks']} ranks, step {fmt_time(doc['recorded_s'])} as recorded"
    if cluster:
        line += f", {fmt_time(doc['priced_s'])} priced on {cluster}"
    terminal.console.print(line)


@trace_app.command("calibrate")
def calibrate_cmd(
    traces: Traces,
    out: Annotated[str, typer.Option(help="Results file (JSONL) for `calibrate fit`.")],
    json_out: terminal.JsonOpt = False,
) -> None:
    """Every traced collective of known size and group as a measured point (the results
    format `calibrate fit` and `validate` read)."""
    from commsim.calibrate.kineto import trace_records
    from commsim.calibrate.records import import_runs
    from commsim.cli.calibrate import print_imported
    from commsim.files import check_output
    from commsim.traces.kineto import read_traces

    with terminal.user_errors():
        check_output(out, "--out")
        added = import_runs(out, trace_records(read_traces(traces)))
    print_imported(added, "rank traces", json_out)


trace_app.command("kernels")(kernels_cmd)
