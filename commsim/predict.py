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
from commsim.memory import MemoryBreakdown, ParallelLayout, memory_per_gpu, usable_bytes
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
from commsim.timeline import DTYPE_BYTES, AllReduceTime, CodecTime, StepReport, simulate_step
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
    accum_steps: int

    @property
    def n_gpus(self) -> int:
        return self.scenario.gpus


@dataclass(frozen=True)
class Prediction:
    """A predicted step and the throughput metrics derived from it."""

    strategy: Strategy
    report: StepReport
    scaling_efficiency: float
    mfu: float
    tflops_per_gpu: float
    samples_per_s: float
    tokens_per_s: float | None
    memory: MemoryBreakdown
    memory_usable: float  # bytes of HBM a training process may fill

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.memory_usable

    def to_dict(self) -> dict[str, Any]:
        r, m = self.report, self.memory
        return {
            "strategy": self.strategy.model_dump(),
            "step_time_s": r.step_time_s,
            "compute_s": r.compute_s,
            "forward_s": r.forward_s,
            "backward_s": r.backward_s,
            "optimizer_s": r.optimizer_s,
            "comm_s": r.comm_s,
            "codec_s": r.codec_s,
            "exposed_comm_s": r.exposed_comm_s,
            "overlap_ratio": r.overlap_ratio,
            "overlap_efficiency": r.overlap_efficiency,
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
                for b in r.buckets
            ],
        }


def load_scenario(path: str | None, overrides: dict[str, Any]) -> tuple[Scenario, str]:
    """Read a scenario file (the built-in default when None) and apply CLI overrides.

    Overrides are merged into the plain data before validation, so a bad flag value is
    reported like a bad field. Strategy fields (bucket_mb, algorithm, ...) go under
    `strategy`.
    """
    source = str(path or catalog.DEFAULT_SCENARIO)
    data = read_yaml(source)
    if not isinstance(data, dict):
        raise SpecError(source, "", "expected a mapping of scenario fields")
    strategy = dict(data.get("strategy") or {})
    for key, value in overrides.items():
        if value is None:
            continue
        if key in STRATEGY_FIELDS:
            strategy[key] = value
        else:
            data[key] = value
    data["strategy"] = strategy
    return parse_spec(Scenario, data, source), source


def _cluster_spec(scenario: Scenario, source: str) -> ClusterSpec:
    if isinstance(scenario.cluster, ClusterSpec):
        return scenario.cluster
    return load_spec(ClusterSpec, catalog.topology_path(scenario.cluster, source))


def resolve(scenario: Scenario, source: str = "scenario") -> Setup:
    """Resolve the model and cluster names, check the batch arithmetic, build the graph."""
    spec = _cluster_spec(scenario, source)
    gpu = catalog.gpu(spec.node.gpu, spec.name, "node.gpu")
    cluster = build_cluster(spec, scenario.gpus, source)
    workload = build_workload(scenario.model, scenario.seq_len, source)
    per_step = scenario.gpus * scenario.micro_batch
    if scenario.global_batch % per_step:
        raise SpecError(
            source,
            "global_batch",
            f"{scenario.global_batch} is not a multiple of gpus x micro_batch = {per_step}",
        )
    return Setup(scenario, source, cluster, gpu, workload, scenario.global_batch // per_step)


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
            algorithm = strategy.algorithm if strategy.algorithm in ALGORITHMS[op] else "auto"
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

    `cost` lets a caller that predicts many strategies share one cached cost model."""
    strategy = strategy or setup.scenario.strategy
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
        accum_steps=accum_steps or setup.accum_steps,
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
    """Throughput metrics of a predicted step.

    scaling efficiency = throughput(N) / (N * throughput(1)), where one GPU runs the same
      global batch by gradient accumulation with no communication at all;
    MFU = model FLOPs per second / (N * peak), model FLOPs = 3 * forward FLOPs per sample
      * global batch (no recomputation in data parallelism, so hardware FLOP/s equal
      model FLOP/s and tflops_per_gpu = MFU * peak / 1e12).
    """
    s, n = setup.scenario, setup.n_gpus
    single = _step(setup, strategy, lambda b: 0.0 * b, accum_steps=setup.accum_steps * n)
    throughput = s.global_batch / report.step_time_s
    scaling = throughput / (n * s.global_batch / single.step_time_s)
    flops = setup.workload.train_flops * s.global_batch / report.step_time_s
    seq = setup.workload.seq_len
    return Prediction(
        strategy=strategy,
        report=report,
        scaling_efficiency=scaling,
        mfu=flops / (n * setup.gpu.peak_flops),
        tflops_per_gpu=flops / n / 1e12,
        samples_per_s=throughput,
        tokens_per_s=throughput * seq if seq else None,
        memory=ddp_memory(setup, strategy),
        memory_usable=usable_bytes(setup.gpu),
    )
