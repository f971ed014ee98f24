"""From a scenario to a predicted step: resolve names, build the cluster, run the timeline.

This is the one place where the specs, the topology, the collective costs and the
timeline meet; the CLI, the planner and notebooks all come through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from commsim import catalog
from commsim.collectives.alphabeta import ALGORITHMS
from commsim.collectives.group import GroupCost
from commsim.compression import encode_decode_seconds, parse_compressor
from commsim.memory import RECOMPUTE, MemoryBreakdown, ParallelLayout, memory_per_gpu, usable_bytes
from commsim.parallel import ALGORITHMS as HYBRID_ALGORITHMS
from commsim.parallel import NCCL_ALGORITHMS, PLACEMENT_KINDS, HybridModel, Layouts
from commsim.pipeline import pipeline_events
from commsim.specs import (
    ClusterSpec,
    GPUSpec,
    Scenario,
    SpecError,
    Strategy,
    load_spec,
    parse_spec,
    read_yaml,
)
from commsim.timeline import (
    DTYPE_BYTES,
    AllReduceTime,
    Bucket,
    CodecTime,
    Event,
    StepReport,
    adam_step_time,
    simulate_step,
)
from commsim.topology.build import Cluster, build_cluster
from commsim.topology.placement import place
from commsim.workload import Workload, build_workload

STRATEGY_FIELDS = set(Strategy.model_fields)


@dataclass(frozen=True)
class Setup:
    """A scenario with every name resolved and its cluster built for its GPU count."""

    scenario: Scenario
    source: str
    cluster: Cluster
    gpu: GPUSpec
    workload: Workload

    @property
    def n_gpus(self) -> int:
        return self.scenario.gpus

    def micro_batches(self, strategy: Strategy) -> int:
        """Micro-batches per step on each data-parallel rank: global / (dp x micro_batch)."""
        return self.scenario.global_batch // (self.dp(strategy) * self.scenario.micro_batch)

    def dp(self, strategy: Strategy) -> int:
        return self.n_gpus // (strategy.tp * strategy.pp)


@dataclass(frozen=True)
class Prediction:
    """A predicted step: where its time goes, its throughput figures, its memory.

    `parts` holds seconds by name (compute_s, forward_s, backward_s, optimizer_s, comm_s,
    codec_s, exposed_comm_s, and for hybrid layouts bubble_s, tp_comm_s, ep_comm_s, pp_comm_s,
    dp_comm_s, dp_exposed_s); `buckets` and `events` come from the DDP timeline."""

    strategy: Strategy
    step_time_s: float
    parts: dict[str, float]
    overlap_ratio: float
    overlap_efficiency: float
    scaling_efficiency: float
    mfu: float
    tflops_per_gpu: float
    samples_per_s: float
    tokens_per_s: float | None
    memory: MemoryBreakdown
    memory_usable: float  # bytes of HBM a training process may fill
    layout: dict[str, int] | None = None  # dp, micro_batch, micro_batches
    training: dict[str, float] | None = None  # time_to_train_s, gpu_hours, cost (given tokens)
    buckets: tuple[Bucket, ...] = ()
    events: tuple[Event, ...] = ()

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.memory_usable

    def to_dict(self) -> dict[str, Any]:
        m = self.memory
        return (
            {
                "strategy": self.strategy.model_dump(),
                "layout": self.layout,
                "step_time_s": self.step_time_s,
            }
            | self.parts
            | {
                "overlap_ratio": self.overlap_ratio,
                "overlap_efficiency": self.overlap_efficiency,
                "scaling_efficiency": self.scaling_efficiency,
                "mfu": self.mfu,
                "tflops_per_gpu": self.tflops_per_gpu,
                "samples_per_s": self.samples_per_s,
                "tokens_per_s": self.tokens_per_s,
                "memory": {
                    "params_bytes": m.params,
                    "grads_bytes": m.grads,
                    "optimizer_bytes": m.optimizer,
                    "activations_bytes": m.activations,
                    "buffers_bytes": m.buffers,
                    "total_bytes": m.total,
                    "usable_bytes": self.memory_usable,
                    "fits": self.fits,
                },
                "training": self.training,
                "buckets": [
                    {
                        "index": b.index,
                        "bytes": b.bytes,
                        "layers": len(b.layers),
                        "tensors": b.tensors,
                        "ready_s": b.ready_s,
                        "start_s": b.start_s,
                        "end_s": b.end_s,
                        "time_s": b.time_s,
                    }
                    for b in self.buckets
                ],
            }
        )


def load_scenario(path: str | None, overrides: dict[str, Any]) -> tuple[Scenario, str]:
    """Read a scenario file (the built-in default when None) and apply CLI overrides."""
    source = str(path or catalog.DEFAULT_SCENARIO)
    data = read_yaml(source)
    if not isinstance(data, dict):
        raise SpecError(source, "", "expected a mapping of scenario fields")
    return with_overrides(data, overrides, source), source


def with_overrides(data: dict[str, Any], overrides: dict[str, Any], source: str) -> Scenario:
    """A scenario from plain data with fields replaced (None leaves a field alone).

    Overrides are merged into the plain data before validation, so a bad value is
    reported like a bad field. Strategy fields (bucket_mb, algorithm, ...) go under
    `strategy`."""
    data = dict(data)
    strategy = dict(data.get("strategy") or {})
    if any(overrides.get(k) is not None for k in ("model", "cluster", "gpus")):
        data["name"] = f"{data.get('name', 'scenario')} (changed by flags)"
    for key, value in overrides.items():
        if value is None:
            continue
        if key in STRATEGY_FIELDS:
            strategy[key] = value
        else:
            data[key] = value
    data["strategy"] = strategy
    return parse_spec(Scenario, data, source)


def _cluster_spec(scenario: Scenario, source: str) -> ClusterSpec:
    if isinstance(scenario.cluster, ClusterSpec):
        return scenario.cluster
    return load_spec(ClusterSpec, catalog.topology_path(scenario.cluster, source))


def _with_profile(spec: ClusterSpec, scenario: Scenario) -> tuple[ClusterSpec, Scenario]:
    """The cluster with a calibration profile's fitted links, and the scenario with its
    measured compute efficiency unless the scenario sets one itself."""
    from commsim.calibrate.profile import apply_profile, load_profile

    profile = load_profile(scenario.profile)
    spec = apply_profile(spec, profile, scenario.profile)
    if profile.compute and "compute_efficiency" not in scenario.model_fields_set:
        efficiency = min(1.0, profile.compute.efficiency)
        scenario = scenario.model_copy(update={"compute_efficiency": efficiency})
    return spec, scenario


def resolve(scenario: Scenario, source: str = "scenario", check: bool = True) -> Setup:
    """Resolve the model and cluster names, build the graph, and (unless a planner will
    search the layout itself) check the scenario's layout against GPUs, batch and model."""
    spec = _cluster_spec(scenario, source)
    if scenario.profile:
        spec, scenario = _with_profile(spec, scenario)
    gpu = catalog.gpu(spec.node.gpu, spec.name, "node.gpu")
    cluster = build_cluster(spec, scenario.gpus, source)
    workload = build_workload(scenario.model, scenario.seq_len, source)
    setup = Setup(scenario, source, cluster, gpu, workload)
    if check:
        check_layout(setup, scenario.strategy)
    return setup


def check_layout(setup: Setup, strategy: Strategy) -> None:
    """The strategy's degrees must fit the GPU count, the batch and the model (SpecError)."""
    s, w, src = setup.scenario, setup.workload, setup.source
    if setup.n_gpus % (strategy.tp * strategy.pp):
        raise SpecError(
            src,
            "strategy",
            f"tp x pp = {strategy.tp} x {strategy.pp} does not "
            f"divide the {setup.n_gpus} GPUs into data-parallel replicas",
        )
    per_step = setup.dp(strategy) * s.micro_batch
    if s.global_batch % per_step:
        raise SpecError(
            src,
            "global_batch",
            f"{s.global_batch} is not a multiple of "
            f"data-parallel degree x micro_batch = {per_step}",
        )
    if strategy.data_parallel_only:
        return
    if w.heads is None:
        raise SpecError(
            src,
            "strategy",
            f"{w.name} is not a transformer: only data "
            "parallelism (tp = pp = 1, zero 0, no recompute) applies",
        )
    blocks = sum(layer.name.startswith("block.") for layer in w.layers)
    if w.heads % strategy.tp:
        raise SpecError(
            src,
            "strategy.tp",
            f"{strategy.tp} does not divide the model's {w.heads} attention heads",
        )
    if strategy.pp > blocks:
        raise SpecError(src, "strategy.pp", f"{strategy.pp} pipeline stages for {blocks} layers")
    uneven = strategy.first_stage_layers is not None or strategy.last_stage_layers is not None
    if uneven:
        _check_uneven_split(strategy, blocks, src)
    elif blocks % (strategy.pp * strategy.interleave):
        raise SpecError(
            src,
            "strategy.pp",
            f"{blocks} layers do not split evenly into "
            f"pp x interleave = {strategy.pp} x {strategy.interleave} chunks "
            "(first_stage_layers / last_stage_layers set an uneven split)",
        )
    if strategy.interleave > 1 and strategy.pp == 1:
        raise SpecError(src, "strategy.interleave", "interleaving needs pp > 1")
    if strategy.interleave > 1 and setup.micro_batches(strategy) < strategy.pp:
        raise SpecError(
            src,
            "strategy.interleave",
            f"the interleaved schedule runs micro-batches in groups of pp = {strategy.pp}: "
            f"it needs at least {strategy.pp} per step, this layout has "
            f"{setup.micro_batches(strategy)} (global_batch / (dp x micro_batch))",
        )
    if strategy.ep > 1:
        if not w.moe:
            raise SpecError(
                src, "strategy.ep", f"expert parallelism needs experts; {w.name} has none"
            )
        if w.experts % strategy.ep:
            raise SpecError(
                src,
                "strategy.ep",
                f"{strategy.ep} does not divide the model's {w.experts} experts",
            )
        if setup.dp(strategy) % strategy.ep:
            raise SpecError(
                src,
                "strategy.ep",
                f"{strategy.ep} does not divide the data-parallel degree {setup.dp(strategy)} "
                "(expert-parallel ranks are taken from the data-parallel group)",
            )
    if strategy.placement not in PLACEMENT_KINDS:
        raise SpecError(
            src, "strategy.placement", f"hybrid layouts take {' or '.join(PLACEMENT_KINDS)}"
        )


def _check_uneven_split(strategy: Strategy, blocks: int, src: str) -> None:
    """An uneven split as Megatron-core takes it: pp > 1, no interleaving, and the layers
    the first / last stage do not take split evenly over the other stages."""
    field = "strategy.first_stage_layers"
    if strategy.pp == 1 or strategy.interleave > 1:
        raise SpecError(src, field, "an uneven split needs pp > 1 and interleave 1")
    ends = [x for x in (strategy.first_stage_layers, strategy.last_stage_layers) if x]
    rest, others = blocks - sum(ends), strategy.pp - len(ends)
    if rest < others or (others == 0 and rest) or (others and rest % others):
        raise SpecError(
            src,
            field,
            f"{blocks} layers minus {' + '.join(map(str, ends))} on the end stages leave "
            f"{rest} for the other {others} stages: they must split evenly, at least one each",
        )


def gradient_sync_cost(setup: Setup, strategy: Strategy) -> GroupCost:
    """The all-reduce cost of the data-parallel group under this strategy's placement."""
    ranks = place(setup.cluster, setup.n_gpus, strategy.placement)
    return GroupCost(setup.cluster, ranks, ps_shards=strategy.ps_shards)


def bucket_sync_time(setup: Setup, strategy: Strategy, cost: GroupCost) -> AllReduceTime:
    """Network seconds to synchronise each gradient bucket, as a function of bucket bytes.

    Uncompressed: one all-reduce in grad_dtype. Compressed (a DDP comm hook): the
    compressor's collectives on its payload: all-reduce with the strategy's algorithm,
    all-gather (whose size grows with N) with it too if it applies, else the fastest.
    """
    if strategy.compression == "none":
        return lambda nbytes: cost.time("all-reduce", strategy.algorithm, nbytes)
    compressor = parse_compressor(strategy.compression)

    def sync(nbytes: np.ndarray) -> np.ndarray:
        total = np.zeros(len(nbytes))
        plans = [compressor.collectives(n, cost.n) for n in _elements(strategy, nbytes)]
        for j, (op, _) in enumerate(plans[0] if plans else []):
            known = (*ALGORITHMS[op], "nccl")
            algorithm = strategy.algorithm if strategy.algorithm in known else "auto"
            total += cost.time(op, algorithm, np.array([p[j][1] for p in plans], dtype=float))
        return total

    return sync


def bucket_codec_time(setup: Setup, strategy: Strategy) -> CodecTime | None:
    """GPU seconds of the comm hook's encode and decode per bucket (None: no compression).

    Error feedback adds its residual traffic to the encode. One GPU syncs nothing."""
    if strategy.compression == "none" or setup.n_gpus == 1:
        return None
    compressor = parse_compressor(strategy.compression)

    def codec(nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pairs = [
            encode_decode_seconds(compressor, n, setup.gpu, setup.n_gpus, strategy.error_feedback)
            for n in _elements(strategy, nbytes)
        ]
        enc, dec = np.array(pairs, dtype=float).reshape(-1, 2).T
        return enc, dec

    return codec


def _elements(strategy: Strategy, nbytes: np.ndarray) -> list[int]:
    """Gradient elements in buckets of `nbytes` (bucketed in grad_dtype)."""
    return [int(n) for n in np.rint(np.asarray(nbytes) / DTYPE_BYTES[strategy.grad_dtype])]


def predict(
    setup: Setup, strategy: Strategy | None = None, cost: GroupCost | None = None
) -> Prediction:
    """Predict one optimizer step of the scenario (or of another strategy on its setup).

    Plain DDP runs the per-bucket timeline; a hybrid layout the Megatron-style model of
    commsim.parallel. `cost` lets a caller that predicts many DDP strategies share one
    cached cost model."""
    strategy = strategy or setup.scenario.strategy
    if not strategy.data_parallel_only:
        check_layout(setup, strategy)
        return predict_hybrid(setup, strategy)
    cost = cost or gradient_sync_cost(setup, strategy)
    report = _step(
        setup,
        strategy,
        bucket_sync_time(setup, strategy, cost),
        codec_time=bucket_codec_time(setup, strategy),
    )
    return _metrics(setup, strategy, report)


def _step(
    setup: Setup,
    strategy: Strategy,
    allreduce_time: AllReduceTime,
    accum_steps: int | None = None,
    codec_time: CodecTime | None = None,
) -> StepReport:
    s = setup.scenario
    return simulate_step(
        setup.workload,
        setup.gpu,
        strategy,
        allreduce_time,
        efficiency=s.compute_efficiency,
        micro_batch=s.micro_batch,
        accum_steps=accum_steps or setup.micro_batches(strategy),
        codec_time=codec_time,
    )


def ddp_memory(setup: Setup, strategy: Strategy) -> MemoryBreakdown:
    """Per-GPU memory of plain DDP: every rank holds all states, one micro-batch of
    activations, and two gradient buckets in flight.

    DDP under torch.amp keeps fp32 weights (4 B), fp32 gradients (4 B) and Adam's m and v
    (8 B): 16 B a parameter, the same total as the memory model's mixed-precision split
    2 + 2 + 12, so that split is used with 2-byte gradients."""
    s = setup.scenario
    layout = ParallelLayout(
        dp=setup.n_gpus,
        micro_batch=s.micro_batch,
        seq_len=setup.workload.seq_len,
        grad_bytes=2,
        bucket_mb=strategy.bucket_mb,
    )
    return memory_per_gpu(setup.workload, layout)


def _metrics(setup: Setup, strategy: Strategy, report: StepReport) -> Prediction:
    """Throughput metrics of a predicted DDP step.

    scaling efficiency = throughput(N) / (N * throughput(1)), where one GPU runs the same
      global batch by gradient accumulation with no communication at all;
    MFU = model FLOPs per second / (N * peak), model FLOPs = 3 * forward FLOPs per sample
      * global batch (no recomputation in data parallelism, so hardware FLOP/s equal
      model FLOP/s and tflops_per_gpu = MFU * peak / 1e12).
    """
    n = setup.n_gpus
    accum = setup.micro_batches(strategy) * n
    single = _step(setup, strategy, lambda b: 0.0 * b, accum_steps=accum)
    r = report
    parts = {
        "compute_s": r.compute_s,
        "forward_s": r.forward_s,
        "backward_s": r.backward_s,
        "optimizer_s": r.optimizer_s,
        "comm_s": r.comm_s,
        "codec_s": r.codec_s,
        "exposed_comm_s": r.exposed_comm_s,
    }
    return _prediction(
        setup,
        strategy,
        r.step_time_s,
        parts,
        r.overlap_ratio,
        r.overlap_efficiency,
        single.step_time_s,
        mfu=setup.workload.train_flops
        * setup.scenario.global_batch
        / r.step_time_s
        / (n * setup.gpu.peak_flops),
        hfu=None,
        memory=ddp_memory(setup, strategy),
        buckets=tuple(r.buckets),
        events=tuple(r.events),
    )


def _prediction(
    setup: Setup,
    strategy: Strategy,
    step: float,
    parts: dict[str, float],
    overlap_ratio: float,
    overlap_efficiency: float,
    single_gpu_step: float,
    *,
    mfu: float,
    hfu: float | None,
    memory: MemoryBreakdown,
    buckets=(),
    events=(),
) -> Prediction:
    """The figures every prediction reports, from its step time and parts.

    tflops_per_gpu is hardware FLOP/s per GPU, recomputation included (the Megatron
    papers' convention); MFU counts model FLOPs only. time to train = tokens / tokens per
    step x step time; GPU-hours = N x that; cost = GPU-hours x price."""
    s, n = setup.scenario, setup.n_gpus
    throughput = s.global_batch / step
    seq = setup.workload.seq_len
    training = None
    if s.tokens and seq:
        seconds = s.tokens / (s.global_batch * seq) * step
        gpu_hours = seconds * n / 3600
        training = {
            "time_to_train_s": seconds,
            "gpu_hours": gpu_hours,
            "cost": gpu_hours * s.price_per_gpu_hour if s.price_per_gpu_hour else None,
        }
    return Prediction(
        strategy=strategy,
        step_time_s=step,
        parts=parts,
        overlap_ratio=overlap_ratio,
        overlap_efficiency=overlap_efficiency,
        scaling_efficiency=single_gpu_step / (n * step),
        mfu=mfu,
        tflops_per_gpu=(hfu if hfu is not None else mfu) * setup.gpu.peak_flops / 1e12,
        samples_per_s=throughput,
        tokens_per_s=throughput * seq if seq else None,
        memory=memory,
        memory_usable=usable_bytes(setup.gpu),
        layout={
            "dp": setup.dp(strategy),
            "micro_batch": s.micro_batch,
            "micro_batches": setup.micro_batches(strategy),
        },
        training=training,
        buckets=buckets,
        events=events,
    )


def strategy_layouts(setup: Setup, strategies: list[Strategy]) -> Layouts:
    """Strategies as the hybrid model's layout arrays."""

    def col(f, dtype=np.int64):
        return np.array([f(x) for x in strategies], dtype=dtype)

    return Layouts(
        dp=col(setup.dp),
        tp=col(lambda x: x.tp),
        pp=col(lambda x: x.pp),
        ep=col(lambda x: x.ep),
        micro_batch=col(lambda x: setup.scenario.micro_batch),
        micro_batches=col(setup.micro_batches),
        zero=col(lambda x: x.zero),
        recompute=col(lambda x: RECOMPUTE.index(x.recompute)),
        interleave=col(lambda x: x.interleave),
        bucket_mb=col(lambda x: x.bucket_mb, float),
        overlap=col(lambda x: x.overlap, bool),
        algorithm=col(lambda x: HYBRID_ALGORITHMS.index(x.algorithm)),
        placement=col(lambda x: PLACEMENT_KINDS.index(x.placement)),
        first_layers=col(lambda x: x.split_layers[0]),
        last_layers=col(lambda x: x.split_layers[1]),
    )


def hybrid_model(setup: Setup, strategy: Strategy) -> HybridModel:
    """The hybrid step model of this setup (gradients reduced in the strategy's dtype)."""
    s = setup.scenario
    return HybridModel(
        setup.workload,
        setup.cluster,
        setup.gpu,
        setup.n_gpus,
        s.global_batch,
        s.compute_efficiency,
        DTYPE_BYTES[strategy.grad_dtype],
    )


def predict_hybrid(
    setup: Setup, strategy: Strategy, model: HybridModel | None = None
) -> Prediction:
    """Predict a data x tensor x pipeline layout with commsim.parallel's step model; an
    algorithm the hybrid model does not name ('auto', 'nccl', 'ps') runs as the faster of
    NCCL's ring and tree, as the search takes it, and the prediction names the one run."""
    model = model or hybrid_model(setup, strategy)
    names = (strategy.algorithm,) if strategy.algorithm in HYBRID_ALGORITHMS else NCCL_ALGORITHMS
    candidates = [strategy.model_copy(update={"algorithm": a}) for a in names]
    layouts = strategy_layouts(setup, candidates)
    rows = model.evaluate(layouts)
    best = int(np.argmin(rows.step))
    b = rows.row(best)
    events = tuple(pipeline_events(layouts.row(best), b))
    return hybrid_prediction(setup, candidates[best], b, events)


def hybrid_prediction(
    setup: Setup, strategy: Strategy, b: dict[str, float], events: tuple[Event, ...] = ()
) -> Prediction:
    """A Prediction from one row of the hybrid model's StepBreakdown (with the pipeline's
    events when the caller will draw them)."""
    comm = b["tp_comm"] + b["ep_comm"] + b["pp_comm"] + b["dp_comm"]
    exposed = b["tp_comm"] + b["ep_comm"] + b["pp_comm"] + b["dp_exposed"]
    compute = b["compute"] + b["optimizer"]
    parts = {
        "compute_s": compute,
        "forward_s": b["compute"] / 3.0,
        "backward_s": b["compute"] * 2.0 / 3.0,
        "optimizer_s": b["optimizer"],
        "comm_s": comm,
        "codec_s": 0.0,
        "exposed_comm_s": exposed,
        "bubble_s": b["bubble"],
        "tp_comm_s": b["tp_comm"],
        "ep_comm_s": b["ep_comm"],
        "pp_comm_s": b["pp_comm"],
        "dp_comm_s": b["dp_comm"],
        "dp_exposed_s": b["dp_exposed"],
    }
    w, s = setup.workload, setup.scenario
    single = s.global_batch * w.train_flops / (setup.gpu.peak_flops * s.compute_efficiency) + (
        adam_step_time(w.params, setup.gpu, DTYPE_BYTES[strategy.grad_dtype])
    )
    layout = ParallelLayout(
        dp=setup.dp(strategy),
        tp=strategy.tp,
        pp=strategy.pp,
        ep=strategy.ep,
        micro_batch=s.micro_batch,
        seq_len=w.seq_len,
        zero=strategy.zero,
        recompute=strategy.recompute,
        sequence_parallel=strategy.tp > 1,
        interleave=strategy.interleave,
        micro_batches=setup.micro_batches(strategy),
        grad_bytes=DTYPE_BYTES[strategy.grad_dtype],
        bucket_mb=strategy.bucket_mb,
        first_layers=strategy.split_layers[0],
        last_layers=strategy.split_layers[1],
    )
    return _prediction(
        setup,
        strategy,
        b["step"],
        parts,
        1.0 - exposed / comm if comm > 0 else 1.0,
        compute / max(compute, comm) if compute > 0 else 1.0,
        single,
        mfu=b["mfu"],
        hfu=b["hfu"],
        memory=memory_per_gpu(w, layout),
        events=events,
    )
