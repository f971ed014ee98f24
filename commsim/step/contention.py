"""Compute that overlaps a collective runs slower: the collective's kernel holds SMs and HBM.

An NCCL kernel runs one CTA per channel, each on its own SM, for as long as it lasts (NCCL's
enqueue.cc: grid = nChannels), so a GEMM launched beside it runs its waves on the SMs left
(an H100 GEMM of 132 tiles in one wave takes two beside an all-gather's 24 CTAs and nearly
doubles: NVIDIA developer forum, "Compute-Communication Overlap Causes Severe GEMM
Performance Degradation because of Tail Effect", 2025); and every byte it moves passes
through HBM (COLLECTIVE_PASSES), which memory-bound kernels share. Lee et al. 2025
("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
Learning", arXiv:2507.03114) measured compute 18.9% slower on average (40% at most) while
it overlaps communication on A100 and H100.

Here the overlapped compute is priced again by step.compute's roofline at the rates left
(contended_rates: the tile and wave quantisation on SMs minus the channels, HBM bandwidth
minus the collective's bytes a second), and the two streams meet in closed form
(compute_end, exposed, contended_tail): the compute runs at C / C' of its speed while the
collective runs, at full speed otherwise. No constant here is fitted.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from commsim.step.gemm import Rates

# HBM bytes a rank moves per byte of the op's size S on n ranks, from NCCL's ring schedules
# (prims_simple.h: each received chunk lands in the receiver's FIFO buffer, one write, and its
# kernel reads it once to reduce, copy out or pass on; the kernel reads its input once and
# writes its output once):
# - all-reduce: input S read, output S written, 2 (n - 1) chunks of S / n received
# - reduce-scatter (S the input) and all-gather (S the output): S read or written whole, S / n
#   the other way, (n - 1) chunks of S / n received
# - all-to-all and send-recv (S sent): S read, S received into the FIFO and copied out
COLLECTIVE_PASSES = {
    "all-reduce": lambda n: 2.0 + 4.0 * (n - 1) / n,
    "reduce-scatter": lambda n: 1.0 + 1.0 / n + 2.0 * (n - 1) / n,
    "all-gather": lambda n: 1.0 + 1.0 / n + 2.0 * (n - 1) / n,
    "all-to-all": lambda n: 4.0 * (n - 1) / n,
    "send-recv": lambda n: np.full_like(n, 4.0),
}


def collective_hbm_bytes(op: str, nbytes, ranks) -> np.ndarray:
    """HBM bytes one rank reads and writes running `op` of `nbytes` on `ranks` ranks."""
    n = np.maximum(np.asarray(ranks, dtype=float), 1.0)
    moved = COLLECTIVE_PASSES[op](n) * np.asarray(nbytes, dtype=float)
    return np.where(n > 1, moved, 0.0)


def contended_rates(rates: Rates, sms_taken, hbm_taken) -> Rates:
    """The roofline's rates left to compute beside a collective holding `sms_taken` SMs and
    moving `hbm_taken` bytes/s through HBM: GEMMs tile onto the SMs left (compute's wave
    quantisation on `sms` SMs, each wave as long as before: the rates scale with the share
    of SMs left), FlashAttention's many waves slow with that share, and memory-bound
    kernels and GEMMs' output writes get the bandwidth the collective leaves, or at worst
    half of it (max-min fair shares of a saturated HBM)."""
    share = sm_share(rates.sms, sms_taken)
    sms = share * rates.sms
    taken = np.asarray(hbm_taken, dtype=float)
    memory, write = (np.maximum(bw - taken, bw / 2) for bw in (rates.memory, rates.write))
    return replace(
        rates,
        gemm=rates.gemm * share,
        fp8=rates.fp8 * share,
        attention=rates.attention * share,
        memory=memory,
        write=write,
        sms=sms,
    )


def sm_share(sms, taken) -> np.ndarray:
    """The share of a GPU's `sms` SMs compute keeps beside a kernel holding `taken` of them
    (one at least): what GEMM waves and FlashAttention's rate scale by."""
    return np.maximum(sms - np.asarray(taken, dtype=float), 1.0) / sms


def compute_end(compute, contended, comm):
    """When compute of `compute` seconds alone (`contended` beside the collective) ends if a
    collective of `comm` seconds starts with it: it runs at compute / contended of its speed
    for min(comm, contended) seconds, at full speed after (contended None: no contention)."""
    compute = np.asarray(compute, float)
    contended = compute if contended is None else np.asarray(contended, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        lost = np.where(contended > 0, 1.0 - compute / contended, 0.0)
    return compute + np.minimum(comm, contended) * lost


def exposed(compute, contended, comm):
    """Seconds the pair takes beyond `compute`: max(comm, compute_end) - compute; with no
    contention (contended = compute) the usual max(comm - compute, 0)."""
    return np.maximum(comm, compute_end(compute, contended, comm)) - compute


def contended_tail(network, tail, rate):
    """Seconds a serial sync adds after a backward it overlaps (step.sync.Tail) when the
    backward runs at `rate` of its speed while the sync's network runs: `tail` is the Tail
    at the backward's length / rate (a bucket's lead of work then takes lead / rate seconds
    beside the back-to-back buckets that end the sync); the network seconds before the
    backward's end (network - tail) slow it by (1 - rate) each."""
    tail = np.asarray(tail, dtype=float)
    with np.errstate(invalid="ignore"):  # inf: a collective its groups cannot run
        return np.where(np.isfinite(tail), (1.0 - rate) * (network - tail) + tail, tail)


def contended_compute(model, L, kinds, moved, seconds, p2p: bool = False):
    """The step model's per-micro-batch Compute of layouts L beside collectives that move
    `moved` HBM bytes (collective_hbm_bytes) in `seconds` on each layout's groups of its kind
    (`kinds`: one group kind, or one per layout; `p2p`: sends and receives, on NCCL's p2p
    channels), or None where the model prices compute at one measured efficiency (a
    calibrated rate holds whatever contention its runs had). Collectives under gloo run on
    the CPU and take neither (their copies to and from the host, 2 S over PCIe, are left
    out)."""
    if model.efficiency is None:
        channels, busy = _channels(model, L, kinds, seconds, p2p)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(busy, np.asarray(moved, dtype=float) / seconds, 0.0)
        return model.compute(L, contended_rates(Rates.of(model.gpu), channels, rate))
    return None


def contended_attention(model, L, kind, seconds, core, p2p: bool = False):
    """The attention core's `core` seconds beside a collective of `seconds` on each layout's
    groups of `kind` (`p2p` as contended_compute's): FlashAttention's rate scales with the
    SMs it keeps and no HBM share touches it (contended_rates), so only the SMs count; None
    where the model prices compute at one measured efficiency."""
    if model.efficiency is None:
        channels, _ = _channels(model, L, kind, seconds, p2p)
        return core / sm_share(model.gpu.sm_count, channels)
    return None


def _channels(model, L, kinds, seconds, p2p: bool):
    """(SMs a collective of `seconds` holds on each layout's groups of its kind, whether it
    runs on the GPU and takes time: step.groups.channels)."""
    seconds = np.asarray(seconds, dtype=float)
    kinds = np.broadcast_to(np.asarray(kinds), seconds.shape)
    channels, gpu = np.zeros(seconds.shape), np.zeros(seconds.shape, dtype=bool)
    for kind in np.unique(kinds):
        mine = kinds == kind
        sms, on_gpu = model.groups.channels(str(kind), L, p2p)
        channels[mine], gpu[mine] = sms[mine], on_gpu[mine]
    busy = (seconds > 0) & np.isfinite(seconds) & gpu
    return np.where(busy, channels, 0.0), busy


def slowdown(compute, contended):
    """compute / contended (1 where there is no compute or no contention)."""
    if contended is None:
        return np.ones(np.shape(compute))
    compute, contended = np.asarray(compute, float), np.asarray(contended, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(contended > 0, compute / contended, 1.0)


def mean_rate(rates, seconds):
    """The rate compute runs at beside collectives on several groups one after another, each
    group's `rates` for its network `seconds`: the mean weighted by the seconds, as the
    compute each loses adds up (contended_tail and compute_end are linear in both); 1 where
    none runs. Lists of arrays, one a group."""
    seconds = [np.where(np.isfinite(s), s, 0.0) for s in seconds]
    lost = sum(s * (1.0 - r) for r, s in zip(rates, seconds, strict=True))
    total = sum(seconds)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, 1.0 - lost / total, 1.0)


def beside_sync(model, L, c):
    """The `slowed` that step.dpsync.sync takes: the rate a stage's backward (beside the
    gradients' reductions) or forward (beside the parameters' gathers) of layouts
    L.take(rows) runs at beside HBM bytes `moved` over `seconds` on the groups of `kind`
    (the data-parallel "dp", or the expert buckets' "edp"): its blocks' (a stage picked by
    contended times could be another stage)."""

    def slowed(rows, part, moved, seconds, kind="dp"):
        slow = contended_compute(model, L.take(rows), kind, moved, seconds)
        if part == "reduce":
            return slowdown(c.block_bwd[rows], None if slow is None else slow.block_bwd)
        return slowdown(c.block_fwd[rows], None if slow is None else slow.block_fwd)

    return slowed
