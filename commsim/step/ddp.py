"""Plain data parallelism (DDP) on the per-bucket timeline: gradient sync and comm-hook
costs per bucket, memory, and the step's metrics."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms import ALGORITHMS
from commsim.collectives.group import GroupCost
from commsim.compression import Compressor, as_compressor, parse_compressor
from commsim.scenario import Setup
from commsim.specs import (
    GPUSpec,
    Strategy,
)
from commsim.step.memory import (
    MemoryBreakdown,
    ParallelLayout,
    memory_per_gpu,
)
from commsim.step.prediction import Prediction, prediction
from commsim.step.timeline import (
    DTYPE_BYTES,
    AllReduceTime,
    CodecTime,
    StepReport,
    simulate_step,
)
from commsim.topology.placement import place


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
    return prediction(
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


# so 32-bit keys take 4 digit-histogram passes over the input
EF_BYTES_PER_ELT = 20  # acc = g + e (read 8, write 4), e = acc - C(acc) (read 4, write 4;


def encode_decode_seconds(
    compressor: Compressor | str,
    n_elements: int,
    gpu: GPUSpec,
    n_workers: int,
    error_feedback: bool = False,
) -> tuple[float, float]:
    """GPU seconds to encode one bucket and decode the N workers' result: HBM bytes at the
    peak bandwidth, plus matmul FLOPs at the fp32 (TF32) tensor peak."""
    c = as_compressor(compressor)
    enc_b, dec_b = c.hbm_bytes(n_elements, n_workers)
    if error_feedback:
        enc_b += EF_BYTES_PER_ELT * n_elements
    enc_f, dec_f = c.flops(n_elements)
    # TF32 dense is half the BF16 peak: A100 156 vs 312, H100 SXM 495 vs 989 TFLOPS
    # (NVIDIA A100 and H100 datasheets)
    tf32 = gpu.peak_flops / 2
    return (enc_b / gpu.hbm_bandwidth + enc_f / tf32, dec_b / gpu.hbm_bandwidth + dec_f / tf32)
