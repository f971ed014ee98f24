"""A predicted step: where its time goes, its throughput figures and its memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from commsim.scenario import Setup
from commsim.specs import (
    Strategy,
)
from commsim.step.breakdown import MemoryBreakdown, usable_bytes
from commsim.step.buckets import first_bucket_mb
from commsim.step.timeline import Bucket, Event


@dataclass(frozen=True)
class Prediction:
    """A predicted step: where its time goes, its throughput figures, its memory.

    `parts` holds seconds by name (compute_s, forward_s, backward_s, optimizer_s, comm_s,
    codec_s, exposed_comm_s, bubble_s, tp_comm_s, ep_comm_s, pp_comm_s, dp_comm_s,
    dp_exposed_s); `buckets` and `events` lay the step out: the per-bucket timeline of plain
    data parallelism, the pipeline schedule of the others."""

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
    memory_reserve: float = 0.0  # of HBM, kept free for fragmentation (Scenario.memory_reserve)
    layout: dict[str, int] | None = None  # dp, micro_batch, micro_batches
    training: dict[str, float] | None = None  # time_to_train_s, gpu_hours, cost (given tokens)
    buckets: tuple[Bucket, ...] = ()
    events: tuple[Event, ...] = ()

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.memory_usable

    @property
    def first_bucket(self) -> float:
        """The DDP first bucket (MiB) the step was priced with."""
        return float(first_bucket_mb(self.strategy.bucket_mb, self.strategy.first_bucket_mb))

    def to_dict(self) -> dict[str, Any]:
        m = self.memory
        return (
            {
                "strategy": self.strategy.model_dump() | {"first_bucket_mb": self.first_bucket},
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
                    "workspace_bytes": m.workspace,
                    "total_bytes": m.total,
                    "usable_bytes": self.memory_usable,
                    "reserve_fraction": self.memory_reserve,
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


def prediction(
    setup: Setup,
    strategy: Strategy,
    b: dict[str, float],
    single: float,
    memory: MemoryBreakdown,
    buckets: tuple[Bucket, ...] = (),
    events: tuple[Event, ...] = (),
) -> Prediction:
    """The figures every prediction reports, from one StepBreakdown row of its layout.

    comm = tensor-, expert-, pipeline- and data-parallel network time; exposed = the part
    of it on the critical path (a comm hook's encodes included); overlap ratio = 1 -
    exposed / (comm + codec); overlap efficiency = compute / max(compute, comm + codec).
    scaling efficiency = throughput(N) / (N throughput(1)), one GPU running the global
    batch by accumulation with no communication (`single` seconds). tflops_per_gpu is
    hardware FLOP/s per GPU, recomputation included (the Megatron papers' convention); MFU
    counts model FLOPs only.
    time to train = tokens / tokens per step x step time; GPU-hours = N x that; cost =
    GPU-hours x price."""
    s, n, w = setup.scenario, setup.n_gpus, setup.workload
    step = b["step"]
    critical = b["tp_comm"] + b["cp_comm"] + b["ep_comm"] + b["pp_comm"]
    comm = critical + b["dp_comm"]
    exposed = critical + b["dp_exposed"]
    compute = b["compute"] + b["optimizer"]
    parts = {
        "compute_s": compute,
        "forward_s": b["forward"],
        "backward_s": b["backward"],
        "optimizer_s": b["optimizer"],
        "comm_s": comm,
        "codec_s": b["codec"],
        "exposed_comm_s": exposed,
        "bubble_s": b["bubble"],
        "tp_comm_s": b["tp_comm"],
        "cp_comm_s": b["cp_comm"],
        "ep_comm_s": b["ep_comm"],
        "pp_comm_s": b["pp_comm"],
        "dp_comm_s": b["dp_comm"],
        "dp_exposed_s": b["dp_exposed"],
    }
    busy = comm + b["codec"]
    throughput = s.global_batch / step
    seq = w.seq_len
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
        # clipped to [0, 1]: exposed == busy may round to 1 + 2e-16 (-0.0% hidden)
        overlap_ratio=min(1.0, max(0.0, 1.0 - exposed / busy)) if busy > 0 else 1.0,
        overlap_efficiency=compute / max(compute, busy) if compute > 0 else 1.0,
        scaling_efficiency=single / (n * step),
        mfu=b["mfu"],
        tflops_per_gpu=b["hfu"] * setup.gpu.peak_flops / 1e12,
        samples_per_s=throughput,
        tokens_per_s=throughput * seq if seq else None,
        memory=memory,
        memory_usable=usable_bytes(setup.gpu, s.memory_reserve),
        memory_reserve=s.memory_reserve,
        layout={
            "dp": setup.dp(strategy),
            "micro_batch": s.micro_batch,
            "micro_batches": setup.micro_batches(strategy),
        },
        training=training,
        buckets=buckets,
        events=events,
    )
