"""The data-parallel step as events on two streams: compute, and gradient all-reduces (DDP).

The compute stream runs every micro-batch's forward and backward, then the optimizer. The
communication stream all-reduces gradient buckets in order, each once its gradients exist.
What the network costs is injected as a function of bucket sizes, so this module knows
nothing about topology. Buckets hold parameter tensors, as DDP's do. A tensor's gradient
counts as ready when its layer's backward ends: all of a layer's tensors at once, at the
layer's end (autograd really finishes them one op at a time within the layer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

AllReduceTime = Callable[[np.ndarray], np.ndarray]  # bucket bytes -> seconds, elementwise
# bucket bytes -> (encode seconds, decode seconds) of a compressing comm hook, elementwise
CodecTime = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Bucket:
    """One gradient bucket's all-reduce: which tensors and layers, how big, and when."""

    index: int
    bytes: float
    layers: tuple[str, ...]  # layers with a tensor in it, in gradient-ready order
    tensors: int  # how many parameter tensors
    ready_s: float  # the backward of every layer with a tensor in it has finished
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
    codec_s            compression's encode + decode on the compute stream (0 without it)
    exposed_comm_s     step_time - T_compute: time the GPU spends on or waits for
                       communication, compression's encode/decode included
    overlap_ratio      1 - exposed / T_comm (1.0 when T_comm = 0): share of comm hidden
    overlap_efficiency T_compute / max(T_compute, T_comm): 1.0 means comm could fully hide
    where T_comm = comm_s + codec_s: a compressor's encode/decode is communication cost
    """

    step_time_s: float
    compute_s: float
    comm_s: float
    codec_s: float
    exposed_comm_s: float
    overlap_ratio: float
    overlap_efficiency: float
    forward_s: float  # all micro-batches
    backward_s: float  # all micro-batches
    optimizer_s: float
    buckets: list[Bucket]
    events: list[Event]


@dataclass(frozen=True)
class _Segments:
    """Buckets flattened into one array of tensor indices (C-level iteration), each bucket a
    segment of it: its tensors' count, offset, layers, bytes and ready time."""

    counts: np.ndarray  # tensors in each bucket
    first: np.ndarray  # each bucket's offset in the flat arrays
    flat_layer: np.ndarray  # the layer of every bucketed tensor, bucket after bucket
    sizes: np.ndarray  # bytes of each bucket
    ready: np.ndarray  # the backward of each bucket's last layer has ended


def _backward_ends(backward_s: np.ndarray, accum_steps: int, fwd: float, bwd: float):
    """(end of each layer's backward in the last micro-batch, in forward order; when that
    backward ends): micro-batches run forward then backward, back to back."""
    n = len(backward_s)
    last_start = (accum_steps - 1) * (fwd + bwd) + fwd  # the last micro-batch's backward
    order = np.arange(n)[::-1]
    bwd_end = np.empty(n)
    bwd_end[order] = last_start + np.cumsum(backward_s[order])
    return bwd_end, last_start + bwd


def _segments(
    buckets: Sequence[Sequence[int]],
    tensor_layer: np.ndarray,
    tensor_bytes: np.ndarray,
    bwd_end: np.ndarray,
) -> _Segments:
    """The buckets' segments: bytes summed and ready times maxed over each bucket's tensors."""
    counts = np.fromiter(map(len, buckets), dtype=np.intp, count=len(buckets))
    flat = np.fromiter(chain.from_iterable(buckets), dtype=np.intp, count=int(counts.sum()))
    first = np.cumsum(counts) - counts
    flat_layer = tensor_layer[flat]
    sizes = np.add.reduceat(tensor_bytes[flat], first)
    ready = np.maximum.reduceat(bwd_end[flat_layer], first)
    return _Segments(counts, first, flat_layer, sizes, ready)


def _bucket_costs(
    sizes: np.ndarray, allreduce_time: AllReduceTime, codec_time: CodecTime | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(all-reduce, encode, decode) seconds of each bucket; a ValueError when the network
    function does not give one non-negative time per bucket."""
    times = np.asarray(allreduce_time(sizes), dtype=float) if len(sizes) else np.zeros(0)
    if times.shape != sizes.shape or np.any(times < 0):
        raise ValueError("allreduce_time must return one non-negative time per bucket")
    if codec_time and len(sizes):
        enc, dec = (np.asarray(t, dtype=float) for t in codec_time(sizes))
        return times, enc, dec
    return times, np.zeros(len(sizes)), np.zeros(len(sizes))


def _contended_backward(bwd_end, start, ready, times, rate):
    """(layer backward ends, backward end, launches, all-reduce ends) when the last backward (from
    `start`) runs at `rate` of its speed while an all-reduce runs: layer by layer in
    backward order, each bucket launched once its last layer's (uncontended) `ready` work is
    done and the bucket before it has ended. The stream's busy time is one run from the
    latest launch to `free`, so reaching the next layer's work is a two-piece line."""
    order = np.arange(len(bwd_end))[::-1]  # backward order: last layer first
    work = bwd_end - start  # each layer's work done at its end, in uncontended seconds
    ready_work = ready - start
    t, done, free, k = start, 0.0, start, 0
    launch, ends, new_end = np.empty(len(times)), np.empty(len(times)), np.empty(len(bwd_end))
    for i in order.tolist():
        t, done = _reach(t, done, free, float(work[i]), rate), float(work[i])
        new_end[i] = t
        while k < len(times) and ready_work[k] <= done:
            free = max(t, free) + float(times[k])
            launch[k], ends[k], k = t, free, k + 1
    return new_end, float(new_end.max(initial=start)), launch, ends


def _reach(t, done, free, target, rate):
    """When compute that has done `done` work at time t reaches `target`: at `rate` while
    the stream is busy (until `free`), at full speed after."""
    if t < free:
        at_free = done + (free - t) * rate
        if target <= at_free:
            return t + (target - done) / rate
        return free + (target - at_free)
    return t + (target - done)


def _encode_delays(bwd_end, backward_s, backward_done, ready, enc):
    """(layer backward ends, backward end, bucket ready times) once the encodes run on the
    compute stream: bucket order is ready order, so a layer whose backward starts at t is
    late by the encodes of buckets ready by t, and bucket b launches after its own encode."""
    encoded_before = np.concatenate(([0.0], np.cumsum(enc)))  # [k]: the first k buckets'
    bwd_end = bwd_end + encoded_before[np.searchsorted(ready, bwd_end - backward_s, "right")]
    return bwd_end, backward_done + float(encoded_before[-1]), ready + encoded_before[:-1]


def _bucket_layers(seg: _Segments, names: list[str]) -> tuple[list[str], list[int]]:
    """Each bucket's layer names, flat, and the bounds of each bucket's run in that list:
    a name starts where the layer changes along the flat tensors, or a bucket begins."""
    flat_layer, first = seg.flat_layer, seg.first
    new_layer = np.ones(len(flat_layer), dtype=bool)
    new_layer[1:] = flat_layer[1:] != flat_layer[:-1]
    new_layer[first] = True
    bucket_names = [names[i] for i in flat_layer[new_layer].tolist()]
    return bucket_names, [*(np.cumsum(new_layer)[first] - 1).tolist(), len(bucket_names)]


def _report_buckets(seg: _Segments, names, ready, starts, ends, times) -> list[Bucket]:
    """The buckets as the report lists them."""
    bucket_names, bounds = _bucket_layers(seg, names)
    columns = (seg.sizes, seg.counts, ready, starts, ends, times)
    rows = zip(*(c.tolist() for c in columns), bounds[:-1], bounds[1:], strict=True)
    return [
        Bucket(k, size, tuple(bucket_names[lo:hi]), count, r, t0, t1, t)
        for k, (size, count, r, t0, t1, t, lo, hi) in enumerate(rows)
    ]


def _events(
    accum_steps, fwd, bwd, names, bwd_end, backward_s, buckets, codec_spans, opt_start, step
) -> list[Event]:
    """Gantt bars: whole passes, except the last backward per layer (it drives the buckets),
    the all-reduces, a hook's encodes and decodes (`codec_spans`: (kind, ends, seconds)),
    and the optimizer."""
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
        for i in range(len(backward_s))[::-1]
    ]
    events += [Event("comm", f"all-reduce bucket {b.index}", b.start_s, b.end_s) for b in buckets]
    events += [
        Event("compute", f"{kind} bucket {b}", float(end - t), float(end))
        for kind, finish, span in codec_spans
        for b, (end, t) in enumerate(zip(finish, span, strict=True))
        if t > 0
    ]
    events.append(Event("compute", "optimizer", opt_start, step))
    return events


def schedule_streams(
    forward_s: np.ndarray,
    backward_s: np.ndarray,
    tensor_bytes: np.ndarray,
    buckets: Sequence[Sequence[int]],
    allreduce_time: AllReduceTime,
    *,
    tensor_layer: np.ndarray | None = None,
    overlap: bool = True,
    accum_steps: int = 1,
    optimizer_s: float = 0.0,
    names: Sequence[str] | None = None,
    codec_time: CodecTime | None = None,
    contention: float = 1.0,
) -> StepReport:
    """Lay one step out on the compute and communication streams; per-layer arrays in forward order.

    `buckets` holds tensor indices; `tensor_layer` maps each tensor to its layer
    (non-decreasing: a layer's tensors are consecutive), by default one tensor per layer.
    Compute: `accum_steps` x (forward of all layers, backward in reverse), then the optimizer
    once the last all-reduce ends. Under DDP's no_sync only the last micro-batch's backward
    launches all-reduces. Bucket b is ready when the backward of its tensors' layers ends and
    starts at max(ready_b, end_{b-1}), or with overlap off at max(backward end, end_{b-1}).
    A compressing comm hook (`codec_time`) runs on the compute stream, as DDP hooks do:
    bucket b's encode runs when it is ready, delaying the rest of the backward and its own
    all-reduce; decodes run after the backward, each once its all-reduce has ended.
    `contention`: the rate (0 to 1] the backward runs at while an all-reduce runs beside it
    (step.contention), event by event; not with a comm hook, whose codec shares the stream.
    """
    if accum_steps < 1:
        raise ValueError(f"accum_steps must be at least 1, got {accum_steps}")
    if not 0.0 < contention <= 1.0 or (contention < 1.0 and codec_time):
        raise ValueError(f"contention must be in (0, 1], and 1 with a comm hook: {contention}")
    backward_s = np.asarray(backward_s, dtype=float)
    n = len(backward_s)
    tensor_layer = np.arange(n) if tensor_layer is None else np.asarray(tensor_layer)
    names = list(names) if names is not None else [f"layer {i}" for i in range(n)]
    fwd, bwd = float(np.sum(forward_s)), float(backward_s.sum())
    bwd_end, backward_done = _backward_ends(backward_s, accum_steps, fwd, bwd)
    tensor_bytes = np.asarray(tensor_bytes, dtype=float)
    seg = _segments(buckets, tensor_layer, tensor_bytes, bwd_end)
    times, enc, dec = _bucket_costs(seg.sizes, allreduce_time, codec_time)
    bwd_end, backward_done, ready = _encode_delays(
        bwd_end, backward_s, backward_done, seg.ready, enc
    )
    if contention < 1.0 and overlap:
        start = backward_done - bwd
        bwd_end, backward_done, ready, ends = _contended_backward(
            bwd_end, start, seg.ready, times, contention
        )
        backward_s = bwd_end - np.concatenate([bwd_end[1:], [start]])  # stretched layers
    else:
        launch = ready + enc if overlap else np.full(len(buckets), backward_done)
        ends = serial_ends(launch, times)
    starts = ends - times
    # decode b starts at max(end of decode b-1, all-reduce b's end), after the backward
    dec_ends = serial_ends(np.maximum(ends, backward_done), dec)
    opt_start = float(max(ends.max(initial=backward_done), dec_ends.max(initial=backward_done)))
    step = opt_start + optimizer_s
    report_buckets = _report_buckets(seg, names, ready, starts, ends, times)
    spans = (("encode", ready + enc, enc), ("decode", dec_ends, dec))
    events = _events(
        accum_steps, fwd, bwd, names, bwd_end, backward_s, report_buckets, spans, opt_start, step
    )
    compute = accum_steps * (fwd + bwd) + optimizer_s
    return _step_report(
        step, compute, times, enc, dec, accum_steps, fwd, bwd, optimizer_s, report_buckets, events
    )


def _step_report(
    step, compute, times, enc, dec, accum_steps, fwd, bwd, optimizer_s, buckets, events
) -> StepReport:
    """The step's metrics (StepReport defines them) from its schedule."""
    comm = float(times.sum())
    codec = float(enc.sum() + dec.sum())
    exposed = max(0.0, step - compute)
    return StepReport(
        step_time_s=step,
        compute_s=compute,
        comm_s=comm,
        codec_s=codec,
        exposed_comm_s=exposed,
        overlap_ratio=1.0 - exposed / (comm + codec) if comm + codec > 0 else 1.0,
        overlap_efficiency=compute / max(compute, comm + codec) if compute > 0 else 1.0,
        forward_s=accum_steps * fwd,
        backward_s=accum_steps * bwd,
        optimizer_s=optimizer_s,
        buckets=buckets,
        events=events,
    )


def serial_ends(launch: np.ndarray, times: np.ndarray) -> np.ndarray:
    """End times of jobs run in order on one stream: end_b = max(launch_b, end_{b-1}) + t_b,
    unrolled as max over j <= b of (launch_j + t_j + ... + t_b)."""
    done = np.cumsum(times)
    return done + np.maximum.accumulate(launch - (done - times)) if len(times) else done
