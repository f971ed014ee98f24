"""The data-parallel step as events on two streams: compute, and gradient all-reduces (DDP).

The compute stream runs every micro-batch's forward and backward, then the optimizer. The
communication stream all-reduces gradient buckets in order, each once its gradients exist.
What the network costs is injected as a function of bucket sizes, so this module knows
nothing about topology. A layer is one gradient tensor for bucketing (a transformer block
is bucketed whole; DDP would split it into its weight matrices).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from commsim.specs import GPUSpec, Strategy
from commsim.workload import Workload, layer_times

MIB = 2**20
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}

AllReduceTime = Callable[[np.ndarray], np.ndarray]  # bucket bytes -> seconds, elementwise


def assign_buckets(
    param_bytes_forward_order: Sequence[float],
    cap_bytes: float,
    first_cap_bytes: float = DDP_FIRST_BUCKET_BYTES,
) -> list[list[int]]:
    """Group layers into DDP gradient buckets; returns layer indices per bucket, in bucket order.

    As torch's compute_bucket_assignment_by_size does when DDP rebuilds its buckets after the
    first iteration: tensors in gradient-ready order (reverse registration order), a bucket
    closes as soon as its size reaches its limit (the tensor that crosses it stays in), the
    first bucket's limit is `first_cap_bytes` and later ones' `cap_bytes`. A layer with no
    parameters has no gradient and joins no bucket.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    size, limit = 0.0, first_cap_bytes
    for i in reversed(range(len(param_bytes_forward_order))):
        nbytes = param_bytes_forward_order[i]
        if nbytes <= 0:
            continue
        current.append(i)
        size += nbytes
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0.0, cap_bytes
    if current:
        buckets.append(current)
    return buckets


def adam_step_time(params: float, gpu: GPUSpec, grad_bytes: int = 4) -> float:
    """Seconds of a memory-bound mixed-precision Adam step over `params` parameters.

    Bytes per parameter: read fp32 master weight, m and v (12), read the gradient
    (`grad_bytes`), write master, m and v (12), write the bf16 working copy (2): 30 with
    fp32 gradients. Divided by the GPU's peak HBM bandwidth.
    """
    return params * (26 + grad_bytes) / gpu.hbm_bandwidth


@dataclass(frozen=True)
class Bucket:
    """One gradient bucket's all-reduce: which layers, how big, and when."""

    index: int
    bytes: float
    layers: tuple[str, ...]  # in gradient-ready order
    ready_s: float  # the backward of every layer in it has finished
    start_s: float
    end_s: float
    time_s: float


@dataclass(frozen=True)
class Event:
    """A bar in the Gantt chart."""

    stream: str  # "compute" or "comm"
    label: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class StepReport:
    """One optimizer step of data-parallel training and its metrics (defined here, once).

    step_time_s        end of the optimizer step (the step starts at 0)
    compute_s          T_compute = forward + backward (all micro-batches) + optimizer
    comm_s             T_comm = sum of bucket all-reduce times
    exposed_comm_s     step_time - T_compute: time the GPU waits on communication
    overlap_ratio      1 - exposed / T_comm (1.0 when T_comm = 0): share of comm hidden
    overlap_efficiency T_compute / max(T_compute, T_comm): 1.0 means comm could fully hide
    """

    step_time_s: float
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    overlap_ratio: float
    overlap_efficiency: float
    forward_s: float  # all micro-batches
    backward_s: float  # all micro-batches
    optimizer_s: float
    buckets: list[Bucket]
    events: list[Event]


def schedule_streams(
    forward_s: np.ndarray,
    backward_s: np.ndarray,
    layer_bytes: np.ndarray,
    buckets: list[list[int]],
    allreduce_time: AllReduceTime,
    *,
    overlap: bool = True,
    accum_steps: int = 1,
    optimizer_s: float = 0.0,
    names: Sequence[str] | None = None,
) -> StepReport:
    """Lay one step out on the compute and communication streams; per-layer arrays in forward order.

    Compute: `accum_steps` x (forward of all layers, backward in reverse), then the optimizer
    once the last all-reduce ends. Under DDP's no_sync only the last micro-batch's backward
    launches all-reduces. Bucket b starts at max(ready_b, end_{b-1}), or with overlap off at
    max(backward end, end_{b-1}).
    """
    if accum_steps < 1:
        raise ValueError(f"accum_steps must be at least 1, got {accum_steps}")
    backward_s = np.asarray(backward_s, dtype=float)
    layer_bytes = np.asarray(layer_bytes, dtype=float)
    names = list(names) if names is not None else [f"layer {i}" for i in range(len(backward_s))]
    fwd, bwd = float(np.sum(forward_s)), float(backward_s.sum())
    last_start = (accum_steps - 1) * (fwd + bwd) + fwd  # the last micro-batch's backward
    order = np.arange(len(backward_s))[::-1]
    bwd_end = np.empty(len(backward_s))
    bwd_end[order] = last_start + np.cumsum(backward_s[order])
    backward_done = last_start + bwd

    sizes = np.array([layer_bytes[b].sum() for b in buckets])
    times = np.asarray(allreduce_time(sizes), dtype=float) if buckets else np.zeros(0)
    if times.shape != sizes.shape or np.any(times < 0):
        raise ValueError("allreduce_time must return one non-negative time per bucket")
    ready = np.array([bwd_end[b].max() for b in buckets])
    launch = ready if overlap else np.full(len(buckets), backward_done)
    # end_b = max(launch_b, end_{b-1}) + t_b, unrolled: max over j <= b of (launch_j + t_j..t_b)
    sent = np.cumsum(times)
    ends = sent + np.maximum.accumulate(launch - (sent - times))
    starts = ends - times
    opt_start = float(ends.max(initial=backward_done))
    step = opt_start + optimizer_s

    compute = accum_steps * (fwd + bwd) + optimizer_s
    comm = float(times.sum())
    exposed = max(0.0, step - compute)
    report_buckets = [
        Bucket(
            index=k,
            bytes=float(sizes[k]),
            layers=tuple(names[i] for i in b),
            ready_s=float(ready[k]),
            start_s=float(starts[k]),
            end_s=float(ends[k]),
            time_s=float(times[k]),
        )
        for k, b in enumerate(buckets)
    ]
    # Gantt bars: whole passes, except the last backward per layer (it drives the buckets)
    events = []
    for m in range(accum_steps):
        t0 = m * (fwd + bwd)
        events.append(Event("compute", f"forward mb{m}", t0, t0 + fwd))
        if m < accum_steps - 1:
            events.append(Event("compute", f"backward mb{m}", t0 + fwd, t0 + fwd + bwd))
    events += [
        Event(
            "compute", f"backward {names[i]}", float(bwd_end[i] - backward_s[i]), float(bwd_end[i])
        )
        for i in order
    ]
    events += [
        Event("comm", f"all-reduce bucket {b.index}", b.start_s, b.end_s) for b in report_buckets
    ]
    events.append(Event("compute", "optimizer", opt_start, step))
    return StepReport(
        step_time_s=step,
        compute_s=compute,
        comm_s=comm,
        exposed_comm_s=exposed,
        overlap_ratio=1.0 - exposed / comm if comm > 0 else 1.0,
        overlap_efficiency=compute / max(compute, comm) if compute > 0 else 1.0,
        forward_s=accum_steps * fwd,
        backward_s=accum_steps * bwd,
        optimizer_s=optimizer_s,
        buckets=report_buckets,
        events=events,
    )


def simulate_step(
    workload: Workload,
    gpu: GPUSpec,
    strategy: Strategy,
    allreduce_time: AllReduceTime,
    *,
    efficiency: float,
    micro_batch: int = 1,
    accum_steps: int = 1,
) -> StepReport:
    """One DDP step of `workload` on `gpu`: buckets from the strategy, comm cost injected.

    Gradients are bucketed and sent in strategy.grad_dtype; the optimizer is mixed-precision
    Adam over all parameters (every data-parallel rank runs it in full).
    """
    forward_s, backward_s = layer_times(workload, gpu, efficiency, micro_batch)
    grad_bytes = DTYPE_BYTES[strategy.grad_dtype]
    layer_bytes = workload.layer_params * float(grad_bytes)
    buckets = assign_buckets(layer_bytes, strategy.bucket_mb * MIB, strategy.first_bucket_mb * MIB)
    return schedule_streams(
        forward_s,
        backward_s,
        layer_bytes,
        buckets,
        allreduce_time,
        overlap=strategy.overlap,
        accum_steps=accum_steps,
        optimizer_s=adam_step_time(workload.params, gpu, grad_bytes),
        names=[layer.name for layer in workload.layers],
    )
