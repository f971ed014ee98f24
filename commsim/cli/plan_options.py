"""The flags only `plan` takes: what cluster sizing compares, and the search dimensions a
flag pins to one value."""

from __future__ import annotations

from typing import Annotated

import typer

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
# Megatron-LM's flag names are aliases where they differ (arguments.py)
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
OnlyEtpOpt = Annotated[
    int | None,
    typer.Option(
        "--etp",
        "--expert-tensor-parallel-size",
        help="Search only this expert tensor-parallel degree (MoE; else tp and 1).",
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
OnlyCpOpt = Annotated[
    int | None,
    typer.Option(
        "--cp", "--context-parallel-size", help="Search only this context-parallel degree."
    ),
]
OnlyOrderOpt = Annotated[
    str | None, typer.Option(help="Search only this rank order: tp-cp-ep-dp-pp or tp-cp-ep-pp-dp.")
]
OnlyFsdpShardOpt = Annotated[
    int | None, typer.Option(help="Search only ZeRO-3 hybrid-sharded over this many dp ranks.")
]
OnlyReshardOpt = Annotated[
    str | None,
    typer.Option(help="Search only this FSDP reshard_after_forward: true, false, all-but-last."),
]
TopOpt = Annotated[
    int | None, typer.Option(help="Rows to show (at least 1; 15 if not given; one cluster only).")
]
DEFAULT_TOP = 15  # rows the one-cluster ranking shows when --top is not given
SweepPlotOpt = Annotated[
    str | None,
    typer.Option(help="PNG: the winner's step time against NIC bandwidth per compressor."),
]
FAILURE_FLAGS = ("recovery", "checkpoint_interval", "async_save", "spares", "spare_target")
RecoveryOpt = Annotated[
    str | None,
    typer.Option(
        help="Cluster sizing: recovery from failures for goodput (cold by default; "
        "cold, hot-spare, in-memory, per-step, ring-rebuild), or none for ideal figures only."
    ),
]
CheckpointIntervalOpt = Annotated[
    str | None, typer.Option(help="Cluster sizing: checkpoint interval (default: the optimum).")
]
AsyncSaveOpt = Annotated[
    bool | None,
    typer.Option("--async-save/--sync-save", help="Cluster sizing: asynchronous checkpoints."),
]
SparesOpt = Annotated[
    int | None,
    typer.Option(help="Cluster sizing: hot spare nodes (default: the cheapest count)."),
]
SpareTargetOpt = Annotated[
    float | None,
    typer.Option(help="Cluster sizing: probability the job stays at full size (0.999)."),
]
