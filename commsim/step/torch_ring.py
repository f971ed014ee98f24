"""Context parallelism as PyTorch's experimental `context_parallel` ran it for torchtitan in
Dec 2024 (Strategy.kernels torchtitan / torchtitan-compile, cp > 1), in place of Transformer
Engine's ring (step.context). Read in torch/distributed/tensor/experimental/_attention.py of
that era (torch 1963fc8, 2024-12-23, the nightly torchtitan's H100 benchmarks name; read at
stored copies of the file from late 2024 on, pytorch/pytorch f2127dbd and 0123248a alike in
all below) and torchtitan 9dec370:

- Sharding: `_ContextParallelOptions.enable_load_balance = True` and `_RoundRobinLoadBalancer`
  give rank r chunks r and 2 cp - 1 - r, so every ring step is 1/cp of a rank's attention,
  as in TE. The last rank takes its whole queries at every step (`i <= rank`), the others
  half of them at some (`partial`); its merges move the most bytes, so it is priced.
- K and V: torchtitan's Llama repeats them to every query head before SDPA (model.py
  repeat_kv), so the ring carries `heads` wide K and V, as many elements as the queries.
- Rotation: torchtitan's default `context_parallel_rotate_method` "allgather"
  (config_manager.py): `_AllGatherRotater` all-gathers cat(K, V) once a layer, issued before
  step 0's SDPA and waited on before step 1's: what outlasts step 0 shows. The backward
  gathers K and V again so, and passes dK and dV round the ring in fp32 (`dkv_rotater`, an
  all-to-all permute; `convert_to_f32`): the send after step i is waited on under step
  i + 1's backward, the last one after the loop, whole.
- Merging: `_SDPAMerger` in fp32 eager ops, and the backward's fp32 gradient buffers
  (inventories below). Under torch.compile the SDPA's DTensor dispatch, ring loop and all,
  is traced into the block's graph (torch's test_ring_attention_compile): Inductor fuses the
  element-wise work into few kernels (one read of each input, one write of each output; the
  merges of all steps into one after the last SDPA) and drops the concatenations no
  collective reads.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from commsim.step.contention import contended_attention
from commsim.step.eager import KERNELS, total
from commsim.step.kernel_bytes import ATTENTION_BACKWARD
from commsim.step.ringsteps import Leg, Ring

KV_WIRE = 2  # bf16 K and V in the all-gather
GRAD_WIRE = 4  # fp32 dK and dV round the ring (accum_dtype float32)

# Eager, (read, write) bytes a query element (K and V each as many elements) on the last rank.
# Forward, once: key.contiguous() and value.contiguous() (the transposed repeat_kv output)
EAGER_FORWARD_ONCE = ((4, 4),)
# each step but the last: torch.cat([key.flatten(), value.flatten()]) for the rotater (the
# all-gather rotater gathers the first only, but the cat runs every step)
EAGER_CAT = ((4, 4),)
EAGER_MERGE_FIRST = ((2, 4),)  # step 0: out.to(float32), kept
EAGER_MERGE_STEP = (
    (2, 4),  # the step's out.to(float32)
    (8, 4),  # out - block_out
    (4, 4),  # sigmoid(block_lse - lse) * that (the row-sized sigmoid in MERGE_ROWS)
    (8, 4),  # out - that
)
EAGER_MERGE_LAST = ((4, 2),)  # results(): out.to(bf16)
# bytes a row (a query's logsumexp, fp32) of each later step's merge
EAGER_MERGE_ROWS = (
    (8, 4),  # block_lse - lse
    (4, 4),  # sigmoid
    (4, 0),  # read by the product with (out - block_out)
    (8, 4),  # lse - block_lse
    (4, 4),  # logsigmoid
    (8, 4),  # lse - that
)
# Backward, once: zeros_like(q, k, v) in fp32, K and V made contiguous, and at the end
# grad_query.to(bf16) and the received dK, dV .to(bf16)
EAGER_BACKWARD_ONCE = ((0, 12), (4, 4), (4, 2), (8, 4))
EAGER_GRAD_FIRST = (
    (12, 8),  # grad_key += grad_key_, grad_value += grad_value_ (fp32 += bf16)
    (8, 8),  # their flatten(): a copy, zeros_like kept the transposed K's strides
    (8, 8),  # torch.cat of dK and dV (fp32) for the send
    (6, 4),  # grad_query += grad_query_
)
EAGER_GRAD_STEP = (
    (6, 4),  # _partial_update: chunks[0] += the step's dK, dV (half of each)
    (8, 8),  # its torch.cat(chunks): dK and dV copied whole
    (8, 8),  # torch.cat of dK and dV for the send
    (6, 4),  # grad_query += grad_query_
)
# Compiled (Inductor's kernels for this loop, torch 2.13 on CPU, tests/test_torch_ring_torch):
# forward, the all-gather's cat(K, V) written by a kernel of its own from the grouped K and V
# (read 2 + 2 bytes a grouped element: kv_heads / heads of a query's); the merges one kernel
# after the last SDPA, reading each step's bf16 output and logsumexp, writing one of each
FUSED_CAT, FUSED_GROUPED = ((0, 4),), 4
FUSED_STEP, FUSED_OUT, FUSED_ROW_STEP, FUSED_ROW_OUT = 2, 2, 4, 4
# backward, once: K and V read, written contiguous and as the cat; step 0's dK, dV into the
# fp32 send buffer; the last received dK, dV to bf16
FUSED_BACKWARD_ONCE = ((4, 8), (4, 8), (8, 4))
# each later step: the step's dK, dV added into half of the received buffer as the send
# buffer is written, the other half copied; dQ as the forward's output, one kernel at the end
FUSED_GRAD_STEP = ((6, 4), (4, 4))
# Memory the eager backward (_templated_ring_attention_backward, torch 2.13) holds beside the
# gathered K and V (gather_bytes), bytes a query element on the last rank (K and V repeated to
# every head: as many elements each). With cp > 2 its peak is step 1's rotater cat: fp32
# grad_query, grad_key and grad_value (zeros_like, 4 + 8), the received dK/dV and the cat sent
# after step 0 (8 + 8); bf16 K and V made contiguous (4), step 0's and step 1's cat(K, V) (8),
# step 0's dQ, dK, dV (6). With cp = 2 it is the last step's send: grad_query 4, the step's
# dQ and half dK, dV (4), the received dK/dV (8), its partial updates' new dK, dV (8), the
# send's cat (8) and the all-to-all's new output (8), step 0's cat(K, V) (4). Its forward
# holds less (the merges' fp32 temporaries: 18 and the rows'); compiled, Inductor plans the
# buffers itself (not modelled: the eager figure stands for both)
HELD_STEP_1 = (4 + 8, 8 + 8, 4, 8, 6)
HELD_LAST_STEP = (4, 4, 8, 8, 8 + 8, 4)


def merge_bytes(cp, queries, rows, compiled, kv_share=1.0) -> tuple[np.ndarray, np.ndarray]:
    """HBM bytes of a layer's ring on the last rank beyond its SDPA calls, forward and
    backward, for `queries` query elements (b s/cp x heads/tp x head width; K and V each as
    many), `rows` of them (queries / head width), eager or `compiled` (`kv_share`: kv_heads /
    heads); zero where cp is 1."""
    cp = np.asarray(cp, dtype=float)
    later = cp - 1.0
    eager_f = total(EAGER_FORWARD_ONCE + EAGER_MERGE_FIRST + EAGER_MERGE_LAST) * queries
    eager_f = eager_f + later * (total(EAGER_CAT + EAGER_MERGE_STEP) * queries)
    eager_f = eager_f + later * total(EAGER_MERGE_ROWS) * rows
    eager_b = total(EAGER_BACKWARD_ONCE + EAGER_GRAD_FIRST) * queries
    eager_b = eager_b + later * total(EAGER_CAT + EAGER_GRAD_STEP) * queries
    merged = FUSED_STEP * cp + FUSED_OUT  # the forward's output, and dQ alike
    cat = total(FUSED_CAT) + FUSED_GROUPED * kv_share
    fused_f = (cat + merged) * queries + (FUSED_ROW_STEP * cp + FUSED_ROW_OUT) * rows
    fused_b = (total(FUSED_BACKWARD_ONCE) + later * total(FUSED_GRAD_STEP) + merged) * queries
    on = cp > 1
    fwd = np.where(compiled, fused_f, eager_f)
    bwd = np.where(compiled, fused_b, eager_b)
    return np.where(on, fwd, 0.0), np.where(on, bwd, 0.0)


def gather_bytes(cp, queries) -> np.ndarray:
    """Bytes of the all-gather of cat(K, V) (its output, as collectives are priced): cp ranks'
    K and V of `queries` elements each, bf16."""
    return np.asarray(cp, dtype=float) * 2.0 * queries * KV_WIRE


def held_bytes(cp, queries) -> np.ndarray:
    """Bytes a layer's ring holds at its peak beyond what the layer keeps: the all-gathered K
    and V (gather_bytes) and the backward's buffers beside them, for `queries` query elements
    (K and V each as many); zero where cp is 1."""
    cp = np.asarray(cp, dtype=float)
    beside = np.where(cp > 2, sum(HELD_STEP_1), sum(HELD_LAST_STEP)) * np.asarray(queries)
    return np.where(cp > 1, gather_bytes(cp, queries) + beside, 0.0)


def grad_send_bytes(queries) -> np.ndarray:
    """Bytes of one backward ring step's send: this rank's running dK and dV, fp32."""
    return 2.0 * np.asarray(queries, dtype=float) * GRAD_WIRE


def transfers(cp, gather, send, core, slowed=(None, None)):
    """Seconds of a layer's transfers the attention does not hide, forward and backward
    (torch_legs, summed)."""
    fwd, bwd = torch_legs(cp, gather, send, core, slowed)
    return sum(leg.added() for leg in fwd), sum(leg.added() for leg in bwd)


def torch_legs(cp, gather, send, core, slowed=(None, None), nbytes=(0.0, 0.0)):
    """A layer's transfers as ring steps (forward legs, backward legs): the all-gather
    (`gather` seconds) beside step 0's SDPA (1/cp of the core's forward `core`; backward
    ATTENTION_BACKWARD x), and the cp dK/dV sends (`send` seconds each), each but the last
    beside the next step's SDPA backward, the last alone. `slowed`: the core's forward
    seconds beside the all-gather and beside a send (on the SMs their NCCL kernels leave,
    step.contention; None: its own), at which a step runs while its transfer lasts;
    `nbytes`: the all-gather's and a send's."""
    cp = np.asarray(cp, dtype=float)
    on = np.where(cp > 1, 1.0, 0.0)
    back = ATTENTION_BACKWARD / cp
    by_gather, by_send = (core if s is None else s for s in slowed)
    gathered = Leg(on, gather, core / cp, by_gather / cp, nbytes[0], "all-gather")
    fwd = (gathered,)
    bwd = (
        replace(gathered, alone=back * core, beside=back * by_gather),
        Leg(on * (cp - 1.0), send, back * core, back * by_send, nbytes[1]),
        Leg(on, send, 0.0, None, nbytes[1]),
    )
    return fwd, bwd


def torch_ring_attention(
    cp, gather, send, core, merge_fwd, merge_bwd, hbm: float, slowed=(None, None)
):
    """Seconds a layer of PyTorch's ring attention adds per micro-batch, forward and
    backward: its transfers not hidden (`transfers`, `slowed` as there) and its merges' HBM
    bytes at `hbm` bytes/s."""
    fwd, bwd = transfers(cp, gather, send, core, slowed)
    return fwd + merge_fwd / hbm, bwd + merge_bwd / hbm


def torch_ring(model, L, c, replay=False) -> Ring:
    """A layer of PyTorch's ring attention per micro-batch on the step model's layouts L (its
    Compute `c`) as its steps (torch_legs): K and V repeated to every query head (as many
    elements as this rank's queries, b s / cp x heads / tp x head width), the all-gather and
    the sends priced on the cp groups, the attention beside each on the SMs its NCCL kernel
    leaves (p2p channels for the sends), the merges eager or compiled (Strategy.kernels);
    `replay`: recomputation replays the forward."""
    arch = model.workload.arch
    queries = L.micro_batch * model.shape.seq_len / L.cp * arch.heads * arch.head_width / L.tp
    slowed, times, sizes = [], [], []
    for op, nbytes in (
        ("all-gather", gather_bytes(L.cp, queries)),
        ("send-recv", grad_send_bytes(queries)),
    ):
        times.append(model.groups.price(op, "cp", L, nbytes))
        sizes.append(nbytes)
        slowed.append(contended_attention(model, L, "cp", times[-1], c.core_fwd, op == "send-recv"))
    compiled = L.kernels == KERNELS.index("torchtitan-compile")
    rows, share = queries / arch.head_width, arch.kv_heads / arch.heads
    merge_f, merge_b = merge_bytes(L.cp, queries, rows, compiled, share)
    hbm = model.gpu.stream_bandwidth
    fwd, bwd = torch_legs(L.cp, *times, c.core_fwd, tuple(slowed), tuple(sizes))
    return Ring(fwd, bwd, (merge_f / hbm, merge_b / hbm), replay)
