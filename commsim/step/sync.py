"""Data-parallel gradient sync of one bucket plan: what each bucket costs, and how much of it
the last backward hides.

The network stream runs the buckets one after another, each once it is ready and the one
before it is done; a compressing comm hook encodes each bucket on the compute stream when it
is ready (delaying the rest of the backward) and decodes after the backward, each once its
exchange is done; the optimizer starts when everything is. `tail_of_leads` is that schedule in
closed form: the time from the end of the backward to the optimizer's start, as a function of
the backward's length (bucket i launched (1 - its ready fraction) x that length before the
end), which is all a search needs. timeline.schedule_streams lays the same schedule out event
by event (the tests hold the two equal). With each bucket's lead its model chunk's place in a
pipeline's cool-down, the same closed form prices the chunks reducing during the cool-down
and, read backwards in time, the parameter all-gathers a forward waits for (step.dpsync).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from commsim.compression import Compressor, parse_compressor
from commsim.specs import GPUSpec

PARAM_WIRE_BYTES = 2  # bf16 parameters gathered by ZeRO / FSDP
EF_BYTES_PER_ELT = 20  # acc = g + e (read 8, write 4), e = acc - C(acc) (read 4, write 4;
# the local decode happens in registers, fused)

# seconds of `op` by `algorithm` for each size in bytes, on the bucket's group (expert or not)
Price = Callable[[str, str, np.ndarray, bool], np.ndarray]


@dataclass(frozen=True)
class BucketCosts:
    """Per bucket: network seconds, and a comm hook's encode and decode seconds."""

    network: np.ndarray
    encode: np.ndarray
    decode: np.ndarray


def allreduce_costs(*args) -> np.ndarray:
    """Network seconds per bucket of a ZeRO 0-2 step, both of zero_costs' parts (its
    arguments)."""
    reduce, gather = zero_costs(*args)
    return reduce + gather


def zero_costs(
    price: Price,
    algorithm: str,
    nbytes: np.ndarray,
    expert: np.ndarray,
    zero: int,
    grad_bytes: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(gradient, parameter) network seconds per bucket of a ZeRO 0-2 step: an all-reduce of
    the bucket and nothing (stage 0), or a reduce-scatter of its gradients and an all-gather
    of its updated bf16 parameters, the same volume (stages 1, 2; ZeRO Sec. 7). Reduce-scatter
    and all-gather run by ring unless the algorithm names one of theirs."""
    reduce, gather = np.zeros(nbytes.shape), np.zeros(nbytes.shape)
    for e in (False, True):
        mine = expert == e
        if not mine.any():
            continue
        sizes = nbytes[mine]
        if zero == 0:
            reduce[mine] = price("all-reduce", algorithm, sizes, e)
        else:
            params = sizes / grad_bytes
            reduce[mine] = price("reduce-scatter", algorithm, sizes, e)
            gather[mine] = price("all-gather", algorithm, params * PARAM_WIRE_BYTES, e)
    return reduce, gather


def compressed_costs(
    price: Price,
    algorithm: str,
    known: Callable[[str], tuple[str, ...]],
    compressor: Compressor,
    elements: np.ndarray,
    workers: int,
    gpu: GPUSpec,
    error_feedback: bool,
    tensor_collectives: list[list[tuple[str, int]]] | None = None,
) -> BucketCosts:
    """A DDP comm hook's buckets: its collectives on each payload (the strategy's algorithm
    where the op has it, else the fastest), and its encode / decode on the GPU
    (encode_decode_seconds). tensor_collectives, when the bucket's tensor shapes are known
    (the harness records them), replaces the flat-vector plan."""
    plans = tensor_collectives or [compressor.collectives(int(n), workers) for n in elements]
    network = np.zeros(len(plans))
    for j, (op, _) in enumerate(plans[0] if plans else []):
        alg = algorithm if algorithm in (*known(op), "auto", "nccl") else "auto"
        sizes = np.array([p[j][1] for p in plans], dtype=float)
        network += price(op, alg, sizes, False)
    codec = np.array(
        [encode_decode_seconds(compressor, int(n), gpu, workers, error_feedback) for n in elements]
    ).reshape(-1, 2)
    return BucketCosts(network, codec[:, 0], codec[:, 1])


def encode_decode_seconds(
    compressor: Compressor | str,
    n_elements: int,
    gpu: GPUSpec,
    n_workers: int,
    error_feedback: bool = False,
) -> tuple[float, float]:
    """GPU seconds to encode one bucket and decode the N workers' result: HBM bytes at the
    bandwidth streaming kernels reach (GPUSpec.stream_bandwidth), plus matmul FLOPs at the
    fp32 (TF32) tensor peak; error feedback adds its residual's traffic to the encode."""
    c = parse_compressor(compressor) if isinstance(compressor, str) else compressor
    enc_b, dec_b = c.hbm_bytes(n_elements, n_workers)
    if error_feedback:
        enc_b += EF_BYTES_PER_ELT * n_elements
    enc_f, dec_f = c.flops(n_elements)
    # TF32 dense is half the BF16 peak: A100 156 vs 312, H100 SXM 495 vs 989 TFLOPS
    # (NVIDIA A100 and H100 datasheets)
    tf32 = gpu.peak_flops / 2
    hbm = gpu.stream_bandwidth  # memory-bound kernels: the measured streaming rate
    return (enc_b / hbm + enc_f / tf32, dec_b / hbm + dec_f / tf32)


@dataclass(frozen=True)
class Tail:
    """The serial sync schedule of one bucket plan in closed form (see the module docstring).

    With buckets i = 0..B-1 in launch order, network T_i, encode e_i, decode d_i, ready at a
    fraction f_i of the last backward (length x): bucket i launches x (1 - f_i) + E_{>i}
    before the (encode-stretched) backward ends, where E_{>i} sums the later encodes; its
    exchange and everything after it on both streams take C_i = T_i + max(D_i, C_{i+1}),
    D_i the decodes from i on. So the optimizer starts after the backward by
        overlap:    max(D_0, max_i (C_i - E_{>i} - (1 - f_i) x))
        no overlap: C_0 (every bucket launches at the backward's end)
    The first is the upper envelope of lines in x: `slopes` / `intercepts` keep only the
    lines on it for x >= 0 (a handful), so pricing many backward lengths is cheap."""

    slopes: np.ndarray  # -(1 - f_i) of the envelope's lines (-lead_i: tail_of_leads)
    intercepts: np.ndarray
    serial: float  # C_0: the tail with overlap off
    encode: float  # sum of encodes: how much the hook stretches the backward
    network: float  # sum of network seconds
    codec: float  # sum of encodes and decodes

    def at(self, span: np.ndarray | float, overlap: np.ndarray | bool) -> np.ndarray:
        """Seconds from the end of the backward (span long, encodes excluded) to the
        optimizer's start."""
        span = np.asarray(span, dtype=float)
        hidden = np.max(self.intercepts + self.slopes * span[..., None], axis=-1)
        return np.where(overlap, hidden, self.serial)


def tail_of_leads(costs: BucketCosts, leads: np.ndarray) -> Tail:
    """The Tail of buckets with these costs, bucket i launched leads[i] x before the end of
    the (encode-stretched) backward, x the variable Tail.at takes: 1 - its ready fraction
    under one backward of length x, or its model chunk's place in the cool-down
    (step.dpsync)."""
    t, e, d = costs.network, costs.encode, costs.decode
    n = t.size
    if not np.all(np.isfinite(t)):  # an algorithm the group cannot run
        inf = np.array([np.inf])
        return Tail(np.zeros(1), inf, np.inf, float(e.sum()), np.inf, float(e.sum() + d.sum()))
    chain, decodes = _chain(t, d)
    later_encodes = np.concatenate([np.cumsum(e[::-1])[::-1][1:], [0.0]]) if n else e
    slopes = np.concatenate([[0.0], -np.asarray(leads, dtype=float)])
    intercepts = np.concatenate([[decodes[0]], chain - later_encodes])
    # of lines with one slope (a chunk's buckets) only the highest can be on the envelope
    order = np.lexsort((intercepts, slopes))
    last = np.r_[slopes[order][1:] != slopes[order][:-1], True]
    slopes, intercepts = slopes[order][last], intercepts[order][last]
    keep = upper_envelope(slopes, intercepts)
    return Tail(
        slopes=slopes[keep],
        intercepts=intercepts[keep],
        serial=float(chain[0]) if n else 0.0,
        encode=float(e.sum()),
        network=float(t.sum()),
        codec=float(e.sum() + d.sum()),
    )


def serial_time(costs: BucketCosts) -> float:
    """Seconds from the backward's end to the optimizer's start when every bucket launches
    then (overlap off): C_0 of Tail's recurrence."""
    if not np.all(np.isfinite(costs.network)):
        return np.inf
    chain, _ = _chain(costs.network, costs.decode)
    return float(chain[0]) if chain.size else 0.0


def _chain(t: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(C_i, D_i) of Tail's recurrence: C_i = T_i + max(D_i, C_{i+1}), D_i the decodes from
    bucket i on (D_B = 0); without decodes C_i is the network seconds from i on."""
    decodes = np.concatenate([np.cumsum(d[::-1])[::-1], [0.0]])
    if not d.any():
        return np.cumsum(t[::-1])[::-1], decodes
    chain = np.empty(t.size)
    after = -np.inf
    for i in range(t.size - 1, -1, -1):
        after = t[i] + max(decodes[i], after)
        chain[i] = after
    return chain, decodes


def upper_envelope(slopes: np.ndarray, intercepts: np.ndarray) -> np.ndarray:
    """Indices of the lines y = m x + b that are the maximum somewhere on x >= 0 (the
    convex-hull trick: by increasing slope, a line whose crossing with the next leaves it
    no interval is dropped)."""
    order = np.lexsort((intercepts, slopes))
    hull: list[int] = []
    for i in order.tolist():
        m, b = slopes[i], intercepts[i]
        if hull and slopes[hull[-1]] == m:
            hull.pop()  # same slope: the later one has the larger intercept
        while len(hull) >= 2:
            m1, b1 = slopes[hull[-2]], intercepts[hull[-2]]
            m2, b2 = slopes[hull[-1]], intercepts[hull[-1]]
            # drop the middle line when the outer two cross at or before it takes over
            if (b1 - b) * (m2 - m1) <= (b1 - b2) * (m - m1):
                hull.pop()
            else:
                break
        hull.append(i)
    # a first line that the next overtakes at x <= 0 (its intercept is no larger) only wins
    # at x < 0
    while len(hull) >= 2 and intercepts[hull[1]] >= intercepts[hull[0]]:
        hull.pop(0)
    return np.array(hull, dtype=np.int64)
