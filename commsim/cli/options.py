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
GlobalBatchOpt = Annotated[
    int | None,
    typer.Option("--global-batch", "--global-batch-size", help="Samples per optimizer step."),
]
MicroBatchOpt = Annotated[
    int | None,
    typer.Option("--micro-batch", "--micro-batch-size", help="Samples per GPU per micro-step."),
]
SeqLenOpt = Annotated[
    int | None, typer.Option("--seq-len", "--seq-length", help="Tokens per sample.")
]
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
    bool | None,
    typer.Option(
        "--overlap/--no-overlap",
        help="Overlap gradient sync with backward (pipelines: per chunk in the cool-down; "
        "ZeRO 1-2: parameter gathers under the next forward).",
    ),
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


# Megatron-LM's flag names are aliases where they differ (arguments.py)
TpOpt = Annotated[
    int | None,
    typer.Option("--tp", "--tensor-model-parallel-size", help="Tensor-parallel degree."),
]
PpOpt = Annotated[
    int | None,
    typer.Option("--pp", "--pipeline-model-parallel-size", help="Pipeline-parallel stages."),
]
EpOpt = Annotated[
    int | None,
    typer.Option(
        "--ep",
        "--expert-model-parallel-size",
        help="Expert-parallel degree (MoE; folded over tp x cp x dp with --etp).",
    ),
]
EtpOpt = Annotated[
    int | None,
    typer.Option(
        "--etp",
        "--expert-tensor-parallel-size",
        help="Expert tensor-parallel degree (MoE; default: --tp, as Megatron-core).",
    ),
]
ZeroOpt = Annotated[int | None, typer.Option("--zero", help="ZeRO stage 0, 1, 2 or 3.")]
FsdpOpt = Annotated[bool, typer.Option("--fsdp", help="FSDP full shard (the same as --zero 3).")]
FSDP = {"zero": 3, "states": "fsdp"}  # what --fsdp sets: ZeRO-3 with PyTorch FSDP's shards
RecomputeOpt = Annotated[
    str | None,
    typer.Option(
        "--recompute",
        "--recompute-granularity",
        help="Activation recomputation: none, selective (Megatron's), full, op (torchtitan's).",
    ),
]
InterleaveOpt = Annotated[
    int | None,
    typer.Option(
        "--interleave",
        "--num-virtual-stages-per-pipeline-rank",
        help="Virtual pipeline stages per rank (interleaved 1F1B).",
    ),
]
LayersPerVirtualOpt = Annotated[
    int | None,
    typer.Option(
        "--num-layers-per-virtual-pipeline-stage",
        help="Megatron's other way to interleave: layers per virtual stage "
        "(interleave = layers / (pp x this)).",
    ),
]
FirstLayersOpt = Annotated[
    int | None,
    typer.Option(
        "--first-stage-layers",
        "--decoder-first-pipeline-num-layers",
        help="Layers on the first pipeline stage (uneven split; the rest even).",
    ),
]
LastLayersOpt = Annotated[
    int | None,
    typer.Option(
        "--last-stage-layers",
        "--decoder-last-pipeline-num-layers",
        help="Layers on the last pipeline stage (uneven split; the rest even).",
    ),
]
DeepSpeedOpt = Annotated[
    str | None,
    typer.Option(
        "--deepspeed",
        "--deepspeed-config",
        help="A DeepSpeed ds_config.json: ZeRO stage, buckets, overlap, dtype, batch sizes.",
    ),
]
CpOpt = Annotated[
    int | None,
    typer.Option(
        "--cp",
        "--context-parallel-size",
        help="Context-parallel degree (ring attention; seq % 2cp).",
    ),
]
OrderOpt = Annotated[
    str | None,
    typer.Option(help="Rank order, fastest first: tp-cp-ep-dp-pp (Megatron) or tp-cp-ep-pp-dp."),
]
ReshardOpt = Annotated[
    str | None,
    typer.Option(
        help="FSDP units after the forward: true (reshard, gather again for the backward), "
        "false (keep them until the backward) or all-but-last (torchtitan's default)."
    ),
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
ScheduleOpt = Annotated[
    str | None,
    typer.Option(
        help="Pipeline schedule: 1f1b (Megatron's, interleaved with --interleave) or dualpipe "
        "(DeepSeek-V3's: two stages a rank, even pp)."
    ),
]
GradDtypeOpt = Annotated[
    str | None,
    typer.Option(
        help="Gradients' dtype, their buffer and their reduction: fp32 (Megatron's and DDP's "
        "default), bf16 (NeMo's grad_sync_dtype) or fp16."
    ),
]
KernelsOpt = Annotated[
    str | None,
    typer.Option(
        help="Whose element-wise kernels: megatron (fused, TE), torchtitan (eager PyTorch), "
        "torchtitan-compile, llm-foundry."
    ),
]
_SP = "--sequence-parallel/--no-sequence-parallel"
SequenceParallelOpt = Annotated[
    bool | None,
    typer.Option(
        _SP,
        help="Megatron's sequence parallelism: norms, residual adds and dropout on the tp "
        "rank's share of the tokens (off: every tp rank runs them on all).",
    ),
]
TpOverlapOpt = Annotated[
    bool | None,
    typer.Option("--tp-overlap/--no-tp-overlap", help="Overlap tensor-parallel comm with GEMMs."),
]
EpOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--ep-overlap/--no-ep-overlap",
        help="Hide expert all-to-alls under another micro-batch's compute (DualPipe-style).",
    ),
]
ParamGatherOpt = Annotated[
    bool | None,
    typer.Option(
        "--overlap-param-gather/--no-overlap-param-gather",
        help="ZeRO 1-2 with overlap: parameter all-gathers under the next forward (Megatron-core's "
        "flag) or after the optimizer (DeepSpeed).",
    ),
]
TokensOpt = Annotated[float | None, typer.Option(help="Training tokens, for time to train.")]
ProfileOpt = Annotated[
    str | None, typer.Option(help="Calibration profile (commsim calibrate fit) for the cluster.")
]
PriceOpt = Annotated[float | None, typer.Option(help="Price of one GPU-hour, for cost.")]
EfficiencyOpt = Annotated[
    str | None,
    typer.Option(
        help="Compute at this fraction of peak for every FLOP, or `roofline`: a roofline per "
        "kernel class from the GPU's measured rates (the built-in scenario says 0.45).",
    ),
]
ReserveOpt = Annotated[
    float | None,
    typer.Option(
        help="Fraction of HBM kept free for the caching allocator's fragmentation (user-set; "
        "default 0: no measured figure).",
    ),
]
HtmlOpt = Annotated[
    str | None,
    typer.Option(
        "--html",
        help="Also write one self-contained HTML page: tables, plots, inputs and assumptions.",
    ),
]
CsvOpt = Annotated[
    str | None, typer.Option("--csv", help="Also write the table's rows to this CSV file.")
]

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
NcclAlgoOpt = Annotated[
    str | None,
    typer.Option(
        help="NCCL_ALGO as NCCL parses it: the algorithms its tuner may pick, e.g. 'ring', "
        "'^tree', 'ring,tree;allgather:ring' (per collective from 2.24; default: the cluster's)."
    ),
]
NcclProtoOpt = Annotated[
    str | None,
    typer.Option(
        help="NCCL_PROTO as NCCL parses it: the protocols (LL, LL128, Simple) its tuner may "
        "pick, e.g. 'Simple', '^LL', 'LL128;allreduce:^LL128' (default: the cluster's)."
    ),
]


def gpu_count(text: str | None, whole: str | None = None) -> int | None:
    """--gpus as one positive count (None when not given); `whole`, the flag's value this
    count is part of (LOW:HIGH), is the one the refusal names."""
    if text is None:
        return None
    if not text.isdigit() or int(text) < 1:
        named = text if whole is None else whole
        raise ValueError(f"--gpus {named}: must be a positive count or LOW:HIGH, not {text!r}")
    return int(text)


def gpu_sizes(text: str | None, default: int) -> list[int]:
    """--gpus '256:16384' as 256, 512, ..., 16384; a single count as itself."""
    if text is None:
        return [default]
    lo, _, hi = text.partition(":")
    low, high = gpu_count(lo, text), gpu_count(hi or lo, text)
    if high < low:
        raise ValueError(f"--gpus {text}: HIGH must not be below LOW")
    sizes = [low]
    while sizes[-1] * 2 <= high:
        sizes.append(sizes[-1] * 2)
    return sizes


def setup_from_flags(
    scenario: str | None,
    fsdp: bool = False,
    check: bool = True,
    layers_per_virtual_stage: int | None = None,
    nccl_version: str | None = None,
    backend: str | None = None,
    nccl_algo: str | None = None,
    nccl_proto: str | None = None,
    **overrides: Any,
) -> Setup:
    """The scenario file (or the built-in one) with the flags' values, resolved; --fsdp is
    --zero 3 with PyTorch FSDP's shards (states: fsdp), Megatron's
    --num-layers-per-virtual-pipeline-stage becomes interleave, and --nccl-version,
    --nccl-algo and --nccl-proto set the cluster's nccl fields."""
    from commsim.cli.given import blame_cluster_flags, refuse_nccl_flags
    from commsim.scenario import load_scenario, resolve
    from commsim.specs import SpecError

    if fsdp:
        if overrides.get("zero") not in (None, 3):
            raise SpecError("--fsdp", "", f"is ZeRO-3, but --zero {overrides['zero']} is given")
        overrides |= FSDP
    if layers_per_virtual_stage is not None and overrides.get("interleave") is not None:
        raise SpecError(
            "--num-layers-per-virtual-pipeline-stage", "", "give it or --interleave, not both"
        )
    spec, source = load_scenario(scenario, overrides)
    flags = {"nccl_version": nccl_version, "nccl_algo": nccl_algo, "nccl_proto": nccl_proto}
    nccl = {"version": nccl_version, "algo": nccl_algo, "proto": nccl_proto}
    nccl = {f"cluster.nccl.{k}": v for k, v in nccl.items() if v is not None}
    if nccl:  # cluster fields: the what-if API's dotted paths
        from commsim.whatif import change

        with blame_cluster_flags(flags):
            spec = change(spec, nccl)
    if layers_per_virtual_stage is not None:
        setup = resolve(spec, source, check=False)
        spec = spec.model_copy(
            update={"strategy": interleave_of(setup, spec.strategy, layers_per_virtual_stage)}
        )
    setup = resolve(spec, source, check)
    if spec.profile:  # the profile's NCCL fit, if any, set the version: else the flag did
        check_fitted_version(nccl_version, setup.cluster.spec.nccl.version, spec.profile)
    setup = setup if backend is None else with_backend(setup, backend)
    refuse_nccl_flags(flags, setup.cluster.spec.comm_backend)
    return setup


def check_fitted_version(flag: str | None, fitted: str | None, profile: str | None) -> None:
    """--nccl-version against the version a profile's NCCL fit ran (and prices) at
    (`fitted`, None without one): another would price the fit with another version's
    tables, so it is refused."""
    from commsim.specs import SpecError

    if flag is not None and fitted is not None and fitted != flag:
        raise SpecError(
            f"--nccl-version {flag}",
            "",
            f"the profile {profile} was fitted at NCCL {fitted}, whose model prices its fit: "
            "drop the flag, or fit the profile at that version",
        )


def interleave_of(setup: Setup, strategy: Any, layers: int) -> Any:
    """The strategy with Megatron's virtual stages of `layers` layers each: interleave =
    transformer layers / (pp x layers) (Megatron-LM arguments.py)."""
    from commsim.specs import SpecError

    blocks = setup.workload.blocks
    what = "--num-layers-per-virtual-pipeline-stage"
    if layers < 1 or strategy.pp < 2 or blocks % (strategy.pp * layers):
        raise SpecError(
            f"{what} {layers}",
            "",
            f"needs pp > 1 and {blocks} layers / pp {strategy.pp} to split into chunks of {layers}",
        )
    return strategy.model_copy(update={"interleave": blocks // (strategy.pp * layers)})


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
