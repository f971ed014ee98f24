"""Tensor-parallel communication overlap as Transformer Engine's userbuffers run it
(Megatron-core --tp-comm-overlap, NeMo / Megatron-Bridge tp_comm_overlap).

With sequence parallelism each tensor-parallel pair of a block (attention: QKV in, output
projection out; the MLP: fc1 in, fc2 out) all-gathers its input before the column-parallel
GEMMs and reduce-scatters the row-parallel GEMM's output. Userbuffers tie each collective
to one GEMM (TE pytorch/module/base.py, initialize_ub: the default method of each GEMM;
csrc comm_gemm_overlap, the methods' schedules):

- ring_exchange (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad: the all-gathers): the GEMM
  runs as tp chunk GEMMs of m / tp rows, the first on the local chunk, while the next chunk
  comes from the previous rank on a copy engine (use_ce: no SMs taken, all SMs left to the
  GEMM); chunk i + 1 starts when chunk i ends and its data has arrived.
- pipeline (proj_fprop, fc2_fprop: the reduce-scatters): the GEMM's output is cut into
  num_splits chunks; chunk i's reduce-scatter runs on COMM_SMS SMs beside chunk i + 1's GEMM,
  which (set_sm_margin) runs on the SMs left; the last chunk's reduce-scatter is exposed.
- bulk (qkv_dgrad, fc1_dgrad: the all-gather of the input the weight gradient needs, beside
  the data-gradient GEMM; qkv_wgrad, fc1_wgrad: the reduce-scatter of the data gradient,
  beside the weight-gradient GEMM): the whole collective on COMM_SMS SMs beside a GEMM on the
  SMs left.

Each GEMM (a backward one at its own shape, block_gemms.grad_gemms) is priced by
step.compute's roofline (gemm_seconds: tile and wave quantisation) on the SMs
contention.contended_rates leaves; what a GEMM and its collective take beyond the GEMM
alone is the overlap's cost, in place of the collective. The collectives' seconds are
the group's (step.groups), whatever SMs the userbuffers kernels hold. Not modelled: the HBM
the collectives share with the GEMMs (compute-bound here), atomic GEMMs, MoE experts'
collectives (the token dispatcher's, not userbuffers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsim.step.block_gemms import attention_gemms, grad_gemms, mlp_gemms, wgrad_bytes
from commsim.step.contention import contended_rates
from commsim.step.gemm import Rates, gemm_seconds
from commsim.step.groups import group_rows
from commsim.step.kernel_bytes import ACT

# One set of constants: Transformer Engine 2.x's defaults (initialize_ub, get_default_config,
# the same from v2.0 to v2.18; 1.9-1.13 had them with the SM margin off), what
# --tp-comm-overlap runs without a per-model --tp-comm-overlap-cfg and so what a planner's
# layout of any model gets. NVIDIA's tuned configs (NeMo-Framework-Launcher
# conf/training/tp_overlap/*.yaml, NeMo 2.0 tp_overlap_configs/userbuffers.py) keep these
# methods, 4 splits and the SM margin, with 8-24 SMs a pipeline and 2-24 a bulk overlap,
# chosen per model and layout: no one value of theirs serves every case.
NUM_SPLITS = 4  # pipeline chunks ("num_splits": 4)
COMM_SMS = 16  # SMs a pipeline or bulk userbuffers kernel holds ("num_sm": 16)
# set_sm_margin is on for pipeline and bulk (the GEMM runs on the SMs left), off for
# ring_exchange, whose copies run on the copy engines (use_ce True, num_sm 1)


def ring_exchange(chunk, step, tp):
    """Seconds of an all-gather GEMM run as `tp` chunk GEMMs of `chunk` seconds, the ring's
    steps of `step` seconds bringing the next chunk: chunk i starts at max(chunk i - 1's end,
    i steps), so it ends at the latest of j steps + (tp - j) chunks, j = 0 .. tp - 1, a
    linear function of j: max(tp chunks, (tp - 1) steps + a chunk)."""
    return np.maximum(tp * chunk, (tp - 1) * step + chunk)


def pipeline(chunk, rs, splits):
    """Seconds of a GEMM cut into `splits` chunks of `chunk` seconds, each chunk's reduce-
    scatter of `rs` seconds after its GEMM and the previous reduce-scatter: the last ends at
    the latest of j chunks + (splits - j + 1) reduce-scatters, j = 1 .. splits:
    max(splits chunks + rs, a chunk + splits reduce-scatters)."""
    return np.maximum(splits * chunk + rs, chunk + splits * rs)


def bulk(gemm, comm):
    """Seconds of a GEMM (at the SMs left) beside a whole collective: whichever ends last."""
    return np.maximum(gemm, comm)


@dataclass(frozen=True)
class Comm:
    """Per layout, seconds of the tensor-parallel collectives a userbuffers block runs: one
    ring step of the all-gather (a chunk to the next rank), the whole all-gather (bulk), the
    whole reduce-scatter (bulk) and one of NUM_SPLITS chunks of it (pipeline)."""

    ag_step: np.ndarray
    ag: np.ndarray
    rs: np.ndarray
    rs_chunk: np.ndarray


class GemmClock:
    """Seconds of GEMMs on one GPU: the roofline's (gemm_seconds at `rates`, FP8 layouts at
    its FP8 rate, on the SMs a collective leaves), or with one measured efficiency `flat`
    FLOP/s a layout (no SM count: a calibrated rate holds what its runs lost); weight-
    gradient GEMMs move `wgrad` bytes an output element (block_gemms.wgrad_bytes)."""

    def __init__(self, rates: Rates | None, fp8, flat=None, wgrad=ACT):
        self.rates, self.fp8, self.flat, self.wgrad = rates, fp8, flat, wgrad

    def __call__(self, shapes, rows=1.0, cols=1.0, taken=0.0, write=ACT):
        """One chunk's seconds of the (m, n, k, count) `shapes`, m split in `rows`, n in
        `cols` chunks, beside a collective holding `taken` SMs, `write` bytes an output
        element (as step.compute writes them: ACT, a weight gradient's self.wgrad). A split
        GEMM's chunks go round-robin to Transformer Engine's 3 compute streams
        (_NUM_MAX_UB_STREAMS) and wait for nothing but their data (comm_gemm_overlap.h,
        split_overlap_ag / _rs), so each chunk's tiles fill the SMs the one before leaves in
        its last wave: all the chunks' tiles fill waves together (tile_utilisation's
        `concurrent`), each chunk's tiles quantised on its own."""
        out, concurrent = 0.0, rows * cols
        if self.flat is None:
            r = contended_rates(self.rates, taken, 0.0) if taken else self.rates
            rate = np.where(self.fp8, r.fp8, r.gemm)
        for m, n, k, count in shapes:
            m, n = m / rows, n / cols
            if self.flat is not None:
                out = out + count * 2.0 * m * n * k / self.flat
            else:
                w = write / r.write  # each chunk's output through HBM (gemm_seconds)
                out = out + gemm_seconds(m, n, k, rate, r.sms, count, concurrent, write=w)
        return out


def pair(clock: GemmClock, cols, row, comm: Comm, tp):
    """(forward, backward) seconds a column-parallel GEMM group `cols` (reading the gathered
    input) and its row-parallel GEMM `row` take beyond the GEMMs alone. Forward: the gather
    by ring exchange under `cols`, the reduce-scatter by pipeline under `row`; backward:
    _backward."""
    c_alone, r_alone = clock(cols), clock([row])
    c_ring = ring_exchange(clock(cols, rows=tp), comm.ag_step, tp) - c_alone
    chunk = clock([row], cols=NUM_SPLITS, taken=COMM_SMS)
    r_pipe = pipeline(chunk, comm.rs_chunk, NUM_SPLITS) - r_alone
    return c_ring + r_pipe, _backward(clock, cols, row, comm, tp)


def _backward(clock: GemmClock, cols, row, comm: Comm, tp):
    """Seconds the backward of a pair takes beyond its GEMMs alone, each gradient GEMM at its
    own shape and output bytes as step.compute prices it (block_gemms.grad_gemms): the output
    gradient's gather by ring exchange under `row`'s data gradient (its m rows in tp chunks),
    the input's gather under `cols`' data gradients and the data gradient's reduce-scatter
    under `cols`' weight gradients, both bulk."""
    (r_dgrad,), _ = grad_gemms([row])
    dgrad, wgrad = grad_gemms(cols)
    r_ring = ring_exchange(clock([r_dgrad], rows=tp), comm.ag_step, tp) - clock([r_dgrad])
    d_bulk = bulk(clock(dgrad, taken=COMM_SMS), comm.ag) - clock(dgrad)
    w_left, w_alone = (clock(wgrad, taken=t, write=clock.wgrad) for t in (COMM_SMS, 0.0))
    return r_ring + d_bulk + bulk(w_left, comm.rs) - w_alone


def block_overlap(arch, shape, tokens, tp, clock: GemmClock, comm: Comm):
    """(forward, backward) seconds a mean block's tensor-parallel collectives add under
    userbuffers: attention's pair, and the MLP's where it runs on tp (the dense blocks' and
    the MoE blocks' shared experts, as Shape.tp_collectives counts them)."""
    attn = attention_gemms(arch, tokens, tp)
    fwd, bwd = pair(clock, attn[:-1], attn[-1], comm, tp)
    width = (arch.moe_ffn_hidden or arch.ffn_hidden) * shape.shared_experts
    for share, w in ((1.0 - shape.moe_share, arch.ffn_hidden), (shape.moe_share, width)):
        if share and w:
            up, down = mlp_gemms(arch, tokens, w, tp)
            f, b = pair(clock, [up], down, comm, tp)
            fwd, bwd = fwd + share * f, bwd + share * b
    return fwd, bwd


def userbuffers(model, L, nbytes):
    """Per micro-batch (forward, backward) seconds per block of layouts L's tensor-parallel
    collectives under userbuffers on `model` (a StepModel), `nbytes` the bf16 bytes of a
    block's activations on the wire (model.tp_bytes); FP8 layouts gather FP8 inputs (TE's
    all-gather buffers are FP8 under an FP8 recipe: fp8_buf), reduce-scatter bf16. Priced
    once per distinct (algorithm, tp groups, micro-batch, precision, gradient accumulation):
    all it depends on."""
    cols = [L.algorithm, L.placement, L.tp, L.dp, L.pp, L.cp, L.order, L.micro_batch, L.fp8]
    cols.append(L.grad_accumulation)  # the weight gradients' output bytes
    inverse, firsts = group_rows(cols)
    fwd, bwd = _userbuffers(model, L.take(firsts), np.broadcast_to(nbytes, L.tp.shape)[firsts])
    return fwd[inverse], bwd[inverse]


def _userbuffers(model, L, nbytes):
    """userbuffers' seconds on distinct layouts."""
    gpu, tp = model.gpu, L.tp.astype(float)
    ag_bytes = nbytes * np.where(L.fp8, 0.5, 1.0)
    price = model.groups.price
    comm = Comm(
        ag_step=price("send-recv", "tp", L, ag_bytes / tp),
        ag=price("all-gather", "tp", L, ag_bytes),
        rs=price("reduce-scatter", "tp", L, nbytes),
        rs_chunk=price("reduce-scatter", "tp", L, nbytes / NUM_SPLITS),
    )
    wgrad = wgrad_bytes(L.grad_accumulation)
    if model.efficiency is None:
        clock = GemmClock(Rates.of(gpu), L.fp8, wgrad=wgrad)
    else:  # the rate step.model prices the linear layers at under one efficiency
        clock = GemmClock(None, L.fp8, model.linear_flops(L.fp8), wgrad)
    tokens = L.micro_batch * model.shape.seq_len / L.cp
    fwd, bwd = block_overlap(model.workload.arch, model.shape, tokens, tp, clock, comm)
    return np.where(tp > 1, fwd, 0.0), np.where(tp > 1, bwd, 0.0)  # tp 1: no userbuffers
