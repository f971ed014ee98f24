"""The flags `predict` and `plan` share, as `Annotated` option types, and how they become a
Setup."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from commsim.collectives.algorithms import ALGORITHMS

if TYPE_CHECKING:
    from commsim.scenario import Setup

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
CpOpt = Annotated[
    int | None, typer.Option("--cp", help="Context-parallel degree (ring attention; seq % 2cp).")
]
OrderOpt = Annotated[
    str | None,
    typer.Option(help="Rank order, fastest first: tp-cp-ep-dp-pp (Megatron) or tp-cp-ep-pp-dp."),
]
FsdpShardOpt = Annotated[
    int | None, typer.Option(help="Hybrid sharding: ZeRO-3 over groups of this many dp ranks.")
]
PrecisionOpt = Annotated[
    str | None, typer.Option(help="The blocks' GEMMs: bf16 or fp8 (Transformer Engine).")
]
FlashOpt = Annotated[
    bool | None,
    typer.Option("--flash-attention/--no-flash-attention", help="Fused (Flash) attention."),
]
TpOverlapOpt = Annotated[
    bool | None,
    typer.Option("--tp-overlap/--no-tp-overlap", help="Overlap tensor-parallel comm with GEMMs."),
]
TokensOpt = Annotated[float | None, typer.Option(help="Training tokens, for time to train.")]
ProfileOpt = Annotated[
    str | None, typer.Option(help="Calibration profile (commsim calibrate fit) for the cluster.")
]
PriceOpt = Annotated[float | None, typer.Option(help="Price of one GPU-hour, for cost.")]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        help="nccl or gloo: what runs the collectives, priced as it runs them (default: the "
        "profile's, else the cluster's)."
    ),
]
NcclVersionOpt = Annotated[
    str | None,
    typer.Option(help="NCCL whose tuning model prices the collectives (default: the cluster's)."),
]


def setup_from_flags(
    scenario: str | None,
    fsdp: bool = False,
    check: bool = True,
    nccl_version: str | None = None,
    backend: str | None = None,
    **overrides: Any,
) -> Setup:
    from commsim.scenario import load_scenario, resolve

    if fsdp:
        overrides["zero"] = 3
    spec, source = load_scenario(scenario, overrides)
    if nccl_version is not None:  # a cluster field: the what-if API's dotted path
        from commsim.whatif import change

        spec = change(spec, {"cluster.nccl.version": nccl_version})
    setup = resolve(spec, source, check)
    return setup if backend is None else with_backend(setup, backend)


def with_backend(setup: Setup, backend: str) -> Setup:
    """The setup with --backend's backend running the collectives, over a profile's (which
    resolve applied): a per-call overhead fitted under another backend is dropped."""
    import dataclasses

    from commsim.profile import switch_backend
    from commsim.specs import SpecError

    if backend not in ("nccl", "gloo"):
        raise SpecError("--backend", "", f"{backend!r}: nccl or gloo")
    cluster = dataclasses.replace(setup.cluster, spec=switch_backend(setup.cluster.spec, backend))
    return dataclasses.replace(setup, cluster=cluster)
