"""Plain-data specs (pydantic): what a cluster, a model and a strategy are, read from YAML.

Quantities are written as strings ("400Gbps", "25MiB", "2us") and stored in SI units
(bytes, bytes/s, seconds). Loading a file never raises a traceback at the user: every
problem becomes a SpecError naming the file, the field and what is wrong.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from commsim.collectives.algorithms import ALGORITHMS
from commsim.spec_base import (
    DDP_BUCKET_MB_LIMIT,
    Bytes,
    Duration,
    FlopRate,
    Latency,
    Rate,
    Spec,
)


class SpecError(Exception):
    """A user-facing input error: which file, which field, what is wrong."""

    def __init__(self, source: str, field: str, problem: str):
        self.source, self.field, self.problem = source, field, problem
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {problem}")


class GPUSpec(Spec):
    """One accelerator: dense BF16/FP16 tensor peak, memory, NVLink bandwidth per direction,
    and what its kernels reach (the compute roofline, step.compute): streaming
    multiprocessors, the largest GEMMs' fraction of peak (measured), FlashAttention's."""

    name: str
    peak_flops: FlopRate  # dense BF16/FP16 tensor-core FLOP/s
    hbm_bytes: Bytes
    hbm_bandwidth: Rate
    nvlink_bandwidth: Rate  # per GPU, per direction (half the bidirectional figure)
    source: str
    sm_count: int | None = Field(default=None, ge=1)  # streaming multiprocessors
    fp8_flops: FlopRate | None = None  # dense FP8 tensor-core FLOP/s (None: no FP8)
    gemm_efficiency: float | None = Field(default=None, gt=0, le=1)  # best BF16 GEMM / peak
    fp8_gemm_efficiency: float | None = Field(default=None, gt=0, le=1)  # best FP8 GEMM / peak
    attention_efficiency: float | None = Field(default=None, gt=0, le=1)  # FlashAttention / peak
    # what streaming kernels reach of hbm_bandwidth (BabelStream Triad / datasheet; None: 1)
    hbm_efficiency: float | None = Field(default=None, gt=0, le=1)
    kernel_source: str = ""  # where the measured kernel figures come from
    # what NCCL's tuner reads (src/graph/tuning.cc, topo.h): the CUDA compute capability
    # picks its table rows (Volta 7.x, Ampere 8.x, Hopper 9.x, Blackwell 10.x); NVLink links
    # per GPU times NCCL's per-link rate for that capability is its NVLink bandwidth
    compute_capability: float | None = None
    nvlink_links: int = Field(default=0, ge=0)

    @property
    def stream_bandwidth(self) -> float:
        """HBM bytes/s streaming kernels reach: the datasheet's x hbm_efficiency (or 1)."""
        return self.hbm_bandwidth * (self.hbm_efficiency or 1.0)


class NICSpec(Spec):
    """The network interfaces of one node."""

    count: int = Field(ge=1)
    bandwidth: Rate  # per NIC, per direction
    latency: Latency = "2us"  # host software + NIC per message (alpha's endpoint part)


class NodeSpec(Spec):
    """A server: GPUs, how they talk inside the node, and its NICs."""

    gpu: str
    gpus_per_node: int = Field(ge=1)
    interconnect: Literal["nvswitch", "pcie"]
    intra_bandwidth: Rate | None = None  # per GPU per direction; default: the GPU's NVLink
    intra_latency: Latency = "1us"
    pcie_bandwidth: Rate = "32GB/s"  # GPU <-> NIC; PCIe 4.0 x16 is 31.5 GB/s per direction
    nics: NICSpec
    rail_optimized: bool = False
    # the host CPU: NCCL's per-step network overhead is 1 us on Intel, 2 us on AMD hosts, and
    # its LL bandwidth cap across nodes has a row per vendor (tuning.cc getNetOverhead, llMaxBws)
    cpu: Literal["intel", "amd", "arm", "power"] = "intel"
    # NVLink SHARP (in-switch reduction, NCCL's NVLS and NVLSTree): NVSwitch 3 with Hopper or
    # later GPUs. None: yes on nvswitch nodes of compute capability 9.0 and up
    nvls: bool | None = None


class FabricSpec(Spec):
    """The network between nodes: a 2- or 3-tier Clos with over- (> 1) or under-subscription
    (< 1) per tier, in one or several independent planes (topology.build)."""

    kind: Literal["infiniband", "roce", "ethernet"]
    tiers: Literal[2, 3] = 2
    nodes_per_leaf: int = Field(ge=1)  # rail-optimised: nodes per scalable unit (one leaf a rail)
    leaves_per_pod: int = Field(default=8, ge=1)  # 3-tier only: leaves under one pod's spines
    # down / up bandwidth of a leaf, then of a spine: 7.0 is 7:1 over, 0.5 is 2:1 under
    oversubscription: list[Annotated[float, Field(gt=0.0)]] = [1.0, 1.0]
    uplinks_per_leaf: int | None = Field(default=None, ge=0)  # ports; default from oversubscription
    uplink_bandwidth: Rate | None = None  # a switch-to-switch link (default: a NIC port's)
    link_latency: Latency = "100ns"  # cable + serialisation, per hop
    switch_latency: Latency = "200ns"  # per switch traversal
    # balanced: destination-mod-k (InfiniBand); hash: static ECMP by flow hash, collisions and
    # all; adaptive: adaptive routing / packet spraying, every uplink evenly loaded
    routing: Literal["balanced", "hash", "adaptive"] = "balanced"
    throughput: float | None = Field(default=None, gt=0, le=1)  # effective; None: the routing's
    planes: int = Field(default=1, ge=1)  # independent fabrics; NIC port p is in plane p % planes
    nic_ports: int = Field(default=1, ge=1)  # ports per NIC, each to its own ToR (dual-ToR: 2)
    # in-network reduction NCCL can use (CollNet: InfiniBand SHARP through the
    # nccl-rdma-sharp-plugins, NCCL_COLLNET_ENABLE=1); enables CollNetDirect/Chain and
    # multi-node NVLS in NCCL's tuner
    sharp: bool = False


def _nccl_version(v: str) -> str:
    from commsim.collectives.nccl.tables import tables

    tables(v)  # a ValueError naming the versions encoded for one it cannot read
    return v


NcclVersion = Annotated[str, BeforeValidator(str), AfterValidator(_nccl_version)]
LinkClass = Literal["nvlink", "pci", "net"]


class NcclOverrides(Spec):
    """NCCL_ALGO / NCCL_PROTO as a job sets them: what NCCL's tuner may pick, per collective
    from 2.24 (collectives.nccl.overrides); None: NCCL's own choice. Checked against the
    model's NCCL `version` (a cluster's, or the one a calibration profile measured)."""

    algo: str | None = None
    proto: str | None = None

    @model_validator(mode="after")
    def _overrides(self) -> NcclOverrides:
        from commsim.collectives.nccl.overrides import parse

        parse(self.algo, self.proto, self.version)  # a ValueError for what NCCL would refuse
        return self


class NcclSpec(NcclOverrides):
    """How NCCL runs on this cluster: the version whose tuning model prices its collectives,
    and what a calibration fit (commsim calibrate fit on nccl-tests logs) learnt: a factor on
    NCCL's per-step latencies of each link class, and the per-channel bandwidth of its rings
    on one node (intra) and across nodes (inter), replacing what its topology search finds;
    and the job's NCCL_ALGO / NCCL_PROTO (NcclOverrides)."""

    version: NcclVersion = "2.30"
    latency_scale: dict[LinkClass, Annotated[float, Field(gt=0)]] = {}
    channel_bandwidth_intra: Rate | None = None
    channel_bandwidth_inter: Rate | None = None


FailureClass = Literal["gpu", "hbm", "nic", "host", "switch", "cable", "software"]


class ReliabilitySpec(Spec):
    """How often the cluster's parts fail and what recovery can read and write; every field
    left out keeps commsim's default (commsim.reliability.rates, with their sources).

    rates: failures per unit and hour by class: per GPU (gpu, hbm, software), per NIC, per
    node (host), per switch and per cable of the fabric (their blast radius comes from the
    graph). repair_time: how long a failed node is out of service; fabric_repair_time: a
    failed switch or cable."""

    rates: dict[FailureClass, Annotated[float, Field(ge=0)]] = {}
    repair_time: Duration | None = None
    fabric_repair_time: Duration | None = None
    storage_write_bandwidth: Rate | None = None  # aggregate, the whole job's checkpoint writes
    storage_read_bandwidth: Rate | None = None
    source: str = ""


class ClusterSpec(Spec):
    """A whole cluster: `nodes` identical nodes on one fabric."""

    name: str
    description: str = ""
    source: str = ""
    nodes: int = Field(ge=1)
    node: NodeSpec
    fabric: FabricSpec
    reliability: ReliabilitySpec | None = None  # failure rates, repair, storage (optional)
    # what runs the collectives: NCCL (its tuner's algorithm, protocol and cost model, the
    # graph capping its bandwidth) or gloo (commsim's schedules on the graph). None: nccl on
    # GPUs, gloo on the CPU testbed (gpu: cpu-host). A calibration profile's backend wins.
    backend: Literal["nccl", "gloo"] | None = None
    nccl: NcclSpec = NcclSpec()
    # seconds every collective call costs besides its messages: the backend's dispatch and
    # rendezvous (a calibration profile's fitted per-call constant; negative where the links
    # give each call a head start, as a token bucket that lets a burst through unshaped)
    call_overhead: float = 0.0

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.node.gpus_per_node

    @property
    def on_cpu(self) -> bool:
        """The emulated testbed's CPU processes stand in for GPUs (gpu: cpu-host): no CUDA."""
        return self.node.gpu == "cpu-host"

    @property
    def comm_backend(self) -> str:
        """The backend that runs the collectives (see `backend`)."""
        return self.backend or ("gloo" if self.on_cpu else "nccl")


class LayerSpec(Spec):
    """A custom model layer: parameters and forward FLOPs per sample."""

    name: str
    params: int = Field(ge=0)
    forward_flops: float = Field(ge=0)


class ModelSpec(Spec):
    """A model: a preset name, a transformer config, or an explicit layer list."""

    name: str
    kind: Literal["transformer", "resnet", "custom"] = "transformer"
    layers: int | None = Field(default=None, ge=1)
    hidden: int | None = Field(default=None, ge=1)
    heads: int | None = Field(default=None, ge=1)
    kv_heads: int | None = Field(default=None, ge=1)
    ffn_hidden: int | None = Field(default=None, ge=1)
    gated_mlp: bool = False
    vocab: int | None = Field(default=None, ge=1)
    seq_len: int | None = Field(default=None, ge=1)
    head_dim: int | None = Field(default=None, ge=1)  # a head's width (default hidden / heads)
    tied_embeddings: bool | None = None  # head reuses the embedding (default: GPT yes, gated no)
    qkv_bias: bool = False  # biases on Q, K, V in a gated (LLaMA-style) model (Qwen2)
    sliding_window: int | None = Field(default=None, ge=1)  # keys a windowed layer attends to
    window_every: int = Field(default=1, ge=1)  # every k-th block windowed (1: all of them)
    # multi-head latent attention (DeepSeek-V2/V3): low-rank query and key-value latents, a
    # decoupled rotary part of rope_head_dim per head, value heads of v_head_dim
    q_lora_rank: int | None = Field(default=None, ge=1)
    kv_lora_rank: int | None = Field(default=None, ge=1)
    rope_head_dim: int = Field(default=0, ge=0)
    v_head_dim: int | None = Field(default=None, ge=1)
    # mixture of experts: MoE blocks' MLP becomes `experts` MLPs behind a router (experts > 1)
    experts: int | None = Field(default=None, ge=1)
    top_k: int = Field(default=2, ge=1)  # experts each token is routed to
    capacity_factor: float = Field(default=1.25, gt=0)  # expert buffer / even share of tokens
    moe_ffn_hidden: int | None = Field(default=None, ge=1)  # an expert's width (ffn_hidden)
    shared_experts: int = Field(default=0, ge=0)  # always-on experts (DeepSeekMoE)
    dense_layers: int = Field(default=0, ge=0)  # the first blocks keep a dense MLP
    dropout: bool | None = None  # trains with dropout (None: GPT/BERT-style yes, gated no)
    custom_layers: list[LayerSpec] = []


def _compressor(spelling: str) -> str:
    # imported here: compression imports specs for GPUSpec
    from commsim.compression import parse_compressor

    return parse_compressor(spelling).spec


Compression = Annotated[str, AfterValidator(_compressor)]
# the data-parallel all-reduce: auto (the fastest), nccl (NCCL's pick) or a registered one
Algorithm = Literal[("auto", "nccl", *ALGORITHMS["all-reduce"])]  # type: ignore[valid-type]
Placement = Literal["blocked", "interleaved", "topology-aware"]
GradDtype = Literal["fp32", "fp16", "bf16"]
# rank order, fastest-varying first: Megatron-core's default, or pipeline inside data
# parallelism (Megatron-LM's --use-tp-pp-dp-mapping; Llama 3's [TP, CP, PP, DP], arXiv:2407.21783
# Sec. 3.3.2, so that data parallelism, not the pipeline, crosses the pods)
RankOrder = Literal["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"]
Zero3Issue = Literal["unit", "parameter"]
# how a step's micro-batches accumulate weight gradients (Strategy.grad_accumulation)
GradAccumulation = Literal["fused", "autograd", "fp32"]
# how the norms' backward runs (Strategy.norm_backward, step.compute.ELEMENTWISE)
NormBackward = Literal["two-pass", "one-pass"]
# whose element-wise kernels the blocks and loss run (Strategy.kernels, step.eager.KERNELS)
Kernels = Literal["megatron", "torchtitan", "torchtitan-compile", "llm-foundry"]
# Megatron-core's output-discarding recompute_modules (step.activations.RECOMPUTE_MODULES)
RecomputeModule = Literal[
    "layernorm", "mla_up_proj", "moe_act", "core_attn", "mlp", "shared_experts"
]
# the pipeline's schedule: 1F1B (interleaved with interleave > 1) or DeepSeek-V3's DualPipe
# (arXiv:2412.19437 sec. 3.2.1; step.dualpipe)
PipelineSchedule = Literal["1f1b", "dualpipe"]


class Strategy(Spec):
    """How the step is parallelised and synchronised.

    Data parallel by default; tp, pp, ep, zero, recompute and interleave make it a Megatron-style
    hybrid layout (data x tensor x pipeline, experts over ep), priced by commsim.step.parallel."""

    tp: int = Field(default=1, ge=1)  # tensor-parallel degree
    pp: int = Field(default=1, ge=1)  # pipeline stages
    zero: Literal[0, 1, 2, 3] = 0  # ZeRO stage; 3 is FSDP full-shard
    # none; Megatron's selective (the attention core) or full; torchtitan's op-level ("op")
    recompute: Literal["none", "selective", "full", "op"] = "none"
    interleave: int = Field(default=1, ge=1)  # virtual pipeline stages per rank
    pipeline_schedule: PipelineSchedule = "1f1b"  # DualPipe: two stages a rank, both ways
    # an uneven pipeline split, as Megatron-core's --decoder-first-pipeline-num-layers and
    # --decoder-last-pipeline-num-layers: the first / last stage's transformer layers, the
    # other stages splitting the rest evenly (None: an even split)
    first_stage_layers: int | None = Field(default=None, ge=1)
    last_stage_layers: int | None = Field(default=None, ge=1)
    # MoE parallel folding (Megatron-core; Liu et al. 2025, arXiv:2504.14960): the expert
    # layers run on their own grid over the same ranks, etp x ep x edp = tp x cp x dp per
    # stage; ep: expert-parallel degree, etp: expert tensor-parallel degree (None: tp, as
    # Megatron-core's --expert-tensor-parallel-size defaults)
    ep: int = Field(default=1, ge=1)
    etp: int | None = Field(default=None, ge=1)
    algorithm: Algorithm = "auto"
    placement: Placement = "blocked"
    bucket_mb: float = Field(default=25.0, gt=0, lt=DDP_BUCKET_MB_LIMIT)  # bucket_cap_mb (MiB)
    # DDP's first bucket (MiB); None: as torch >= 2.4 forms it (step.buckets.first_bucket_mb)
    first_bucket_mb: float | None = Field(default=None, gt=0, lt=DDP_BUCKET_MB_LIMIT)
    overlap: bool = True
    # ZeRO 1-2's parameter all-gathers with overlap on: under the next step's forward
    # (Megatron-core's --overlap-param-gather) or after the optimizer step, all exposed
    # (DeepSpeed's stage 1-2 step(): all_gather_dp_groups; Megatron-core without the flag)
    overlap_param_gather: bool = True
    grad_dtype: GradDtype = "fp32"  # DDP all-reduces fp32 grads by default
    ps_shards: int = Field(default=1, ge=1)
    compression: Compression = "none"  # what a DDP comm hook does to each bucket
    error_feedback: bool = False  # keep what compression dropped and add it next step
    cp: int = Field(default=1, ge=1)  # context-parallel degree (Megatron-core ring attention)
    precision: Literal["bf16", "fp8"] = "bf16"  # the blocks' GEMMs (Transformer Engine FP8)
    flash_attention: bool = True  # fused attention: no s x s scores kept, causal half computed
    # Megatron's sequence parallelism (Korthikanti et al. 2022): norms, dropouts, residual adds
    # and their activations split over tp; false: whole on each tp rank (Megatron 2021)
    sequence_parallel: bool = True
    # how micro-batches accumulate weight gradients (step.compute.GRAD_ADD): in the wgrad GEMMs
    # (Megatron --gradient-accumulation-fusion, 2022-02), autograd's 16-bit .grad += (2021) or
    # an fp32 buffer += (Megatron's fp32 main_grad, DeepSpeed's bf16 optimizer)
    grad_accumulation: GradAccumulation = "fused"
    # the norms' backward: dx and the weight's gradient each reading dy and x (Apex, PyTorch)
    # or one kernel reading them once (Transformer Engine: Megatron-core, NeMo)
    norm_backward: NormBackward = "two-pass"
    # the element-wise kernels: Megatron-core / TE's fused ones, or a PyTorch stack's modules
    # (torchtitan eager or torch.compile'd, llm-foundry's MPT), counted in step.eager
    kernels: Kernels = "megatron"
    # outputs discarded in the forward and recomputed in the backward, beside `recompute`
    # (Megatron-core recompute_modules; DeepSeek-V3 sec. 3.2.3): step.activations
    recompute_modules: tuple[RecomputeModule, ...] = ()
    # Adam's moments: fp32, or bf16 beside fp32 master weights (DeepSeek-V3 sec. 3.3.3)
    optimizer_moments: Literal["fp32", "bf16"] = "fp32"
    # FP8 primary weights (Megatron-core fp8_param_gather; off by default there, on in
    # Megatron-Bridge's FP8 recipes): no FP8 weight copy beside 16-bit weights (step.memory)
    fp8_param: bool = False
    # DeepSeek-V3's low-precision activations (sec. 3.3.2): MoE activation inputs in FP8, the
    # attention output once in E5M6 (step.activations); with precision fp8
    fp8_cache: bool = False
    tp_overlap: bool = False  # tensor-parallel collectives overlapped with GEMMs (TE/Megatron)
    # the expert all-to-alls run under another micro-batch's compute (Megatron-core's
    # --overlap-moe-expert-parallel-comm, DeepSeek-V3's DualPipe)
    ep_overlap: bool = False
    # how ZeRO-3 keeps its shards: bf16 weights beside an fp32 master copy ("zero": DeepSpeed,
    # Megatron) or fp32 weights that are the master ("fsdp": PyTorch FSDP, step.states.zero_states)
    states: Literal["zero", "fsdp"] = "zero"
    fsdp_shard: int | None = Field(default=None, ge=1)  # hybrid sharding: ZeRO-3 groups (HSDP)
    # how ZeRO-3 issues its collectives (step.fsdp): "unit", a gather per FSDP unit prefetched
    # under compute (FSDP, DeepSpeed >= 0.6); "parameter", DeepSpeed before 0.6 (2021): one
    # synchronised gather per parameter, one reduce-scatter per gradient, none overlapped
    zero3_issue: Zero3Issue = "unit"
    # FSDP's reshard_after_forward (step.fsdp): true frees a unit's gathered parameters after
    # its forward and gathers them again for its backward; false keeps them until then (FSDP2
    # fully_shard(reshard_after_forward=False), FSDP1 SHARD_GRAD_OP): no backward gathers, the
    # units held between the passes (step.memory); "all-but-last", torchtitan's default without
    # a pipeline (parallelize_llama.py apply_fsdp). An int, FSDP2's reshard to a smaller
    # group, is refused (scenario.check_layout)
    reshard_after_forward: bool | int | Literal["all-but-last"] = True
    order: RankOrder = "tp-cp-ep-dp-pp"  # how ranks map to GPUs, fastest-varying first

    @field_validator("reshard_after_forward", mode="before")
    @classmethod
    def _reshard_value(cls, value: Any) -> Any:
        """true, false, all-but-last or a group size, as a flag or a YAML value gives them;
        anything else named with the values it may take, not as a failed boolean."""
        text = str(value).lower()
        if isinstance(value, bool) or text == "all-but-last":
            return value
        if text in ("true", "false"):
            return text == "true"
        if isinstance(value, int) or text.isdigit():
            return int(text)
        raise ValueError(f"should be true, false or all-but-last, got {value!r}")

    @property
    def split_layers(self) -> tuple[int, int]:
        """(first, last) pipeline stage layers, -1 where the split is even (the model's code)."""
        first, last = self.first_stage_layers, self.last_stage_layers
        return (-1 if first is None else first, -1 if last is None else last)

    @property
    def data_parallel_only(self) -> bool:
        """Plain DDP: what the per-bucket timeline models in full detail (no recompute_modules
        either: Megatron-core's, whose replays that timeline does not lay out)."""
        layout = (self.tp, self.pp, self.ep, self.cp, self.zero, self.recompute, self.interleave)
        split = (self.first_stage_layers, self.last_stage_layers, self.etp or 1)
        plain = layout == (1, 1, 1, 1, 0, "none", 1) and split == (None, None, 1)
        return plain and not self.recompute_modules

    @property
    def expert_tp(self) -> int:
        """The expert layers' tensor-parallel degree (etp, tp when unset)."""
        return self.etp or self.tp


Metric = Literal[
    "gradient_bytes",
    "wire_ratio",
    "traffic_cut",
    "buckets",
    "sync_s",
    "busbw_Bps",
    "step_time_s",
    "comm_s",
    "exposed_comm_s",
    "comm_share",
    "overlap_ratio",
    "scaling_efficiency",
    "mfu",
    "samples_per_s",
    "time_to_train_days",
    "rebuild_s",
    "loss_per_failure_s",
    "failure_badput",
    "spare_fraction",
]


class Check(Spec):
    """One figure a document states about a scenario, as commsim would compute it: the
    metric of the scenario changed by `where`, divided by the same metric changed by
    `versus` when that is given (a before/after claim), against `claimed` (within
    `tolerance`, relative) or a bound."""

    says: str  # the figure as the document states it
    metric: Metric
    where: dict[str, Any] = {}  # scenario or strategy fields changed for this check
    versus: dict[str, Any] | None = None  # the baseline: value = metric(where) / metric(versus)
    bytes: Bytes | None = None  # sync_s / busbw_Bps of this message instead of the gradient
    # the reliability metrics' recovery policy (commsim.reliability.recovery.Policy fields)
    recovery: dict[str, Any] = {}
    claimed: float | None = Field(default=None, gt=0)  # relative tolerance: a figure above 0
    at_least: float | None = None
    at_most: float | None = None
    tolerance: float = Field(default=0.25, ge=0)

    @model_validator(mode="after")
    def _one_target(self) -> Check:
        if sum(x is not None for x in (self.claimed, self.at_least, self.at_most)) != 1:
            raise ValueError("give exactly one of claimed, at_least, at_most")
        return self


class Claim(Spec):
    """What a seed document says of a scenario: its words, the source, and the checks."""

    source: str  # the document (shared/seeds/ file name)
    says: str  # the claim, in English, as the document states it
    reading: str = ""  # how commsim reads what the document leaves open
    checks: list[Check] = Field(min_length=1)


class Scenario(Spec):
    """A question: this model, on this cluster, with this strategy."""

    name: str = "scenario"
    description: str = ""
    model: str | ModelSpec
    cluster: str | ClusterSpec
    gpus: int = Field(ge=1)
    global_batch: int = Field(ge=1)  # samples (sequences) per optimizer step
    micro_batch: int = Field(default=1, ge=1)  # samples per GPU per forward/backward
    seq_len: int | None = Field(default=None, ge=1)  # default: the model's
    # achieved / peak FLOP/s for every FLOP: None (or the word roofline) prices compute by the
    # roofline of step.compute (the GPU's measured kernel rates); a number (or a calibration
    # profile's measured rate) overrides it
    compute_efficiency: Annotated[
        float | None, BeforeValidator(lambda v: None if v == "roofline" else v)
    ] = Field(default=None, gt=0, le=1)
    profile: str | None = Field(default=None, min_length=1)  # calibrate fit's, for the cluster
    deepspeed: str | None = Field(default=None, min_length=1)  # a ds_config.json: ZeRO, batch
    tokens: float | None = Field(default=None, gt=0)  # training tokens, for time-to-train
    price_per_gpu_hour: float | None = Field(default=None, gt=0)  # for cost
    strategy: Strategy = Strategy()
    # HBM kept free for the caching allocator's fragmentation, a fraction (user-set: no measured
    # figure for these runs in our sources; step.breakdown.MEMORY_RESERVE cites what exists)
    memory_reserve: float = Field(default=0.0, ge=0, lt=1)
    claim: Claim | None = None  # a seed document's claim this scenario encodes (commsim claims)
