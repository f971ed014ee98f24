"""Context parallelism's per-layer costs beyond the split compute: ring attention as
Transformer Engine runs it for Megatron-core (--context-parallel-size, p2p K/V exchange;
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py,
AttnFuncWithCPAndKVP2P, at NVIDIA/TransformerEngine d0067d0da).

Each sequence is cut into 2 cp chunks, rank r holding chunks r and 2 cp - 1 - r (load
balance under the causal mask), and attention runs as cp steps a layer: step i attends this
rank's queries to the K/V chunk pair received i hops round the ring while the next pair is
sent on. Per step, on the critical path of the slowest rank:
- the K/V transfer, where it outlasts the step's share (1/cp) of the attention core; the
  backward passes K, V and their gradients, against 2.5x the core (Liu et al. 2023,
  "Ring Attention with Blockwise Transformers", arXiv:2310.01889: hidden when a block's
  compute outlasts its transfer);
- the merge of the steps' partial results, passes through HBM that attention without CP
  does not make. Forward, with bf16 attention (FP8 attention's fp32 accumulator is not
  modelled): step 0's output rescaled by the softmax log-sum-exps is the accumulator, in
  the output's dtype (flash_attn_fwd_out_correction_init returns out_init_step.dtype, since
  TE v2.2, PR #1523: read 2, write 2 bytes an element), each later step rescales its own
  and adds it (flash_attn_fwd_out_correction, out.add_: read the step's output 2, read and
  write the sum 2 + 2), and out.to(fwd_nominal_dtype) after the loop is already that dtype
  (no copy); the log-sum-exps, a row each, are left out (1 / head width of it).
  Backward: each step's dQ, dK and dV are added into the running gradients (bf16: read
  2 + 2, write 2; step 0 copies: read 2, write 2). The last rank's steps all cover its
  whole chunk pair, so it is the one priced.
Recomputation that replays attention (selective or full) replays its steps too. Llama 3's
context parallelism all-gathers K and V, then attends (arXiv:2407.21783 Sec. 3.3.2); it is
priced as this scheme. What the ring holds for a layer at its peak, memory counts (held_bytes).
"""

from __future__ import annotations

import numpy as np

from commsim.step.activations import replays_core
from commsim.step.kernel_bytes import ATTENTION_BACKWARD
from commsim.step.ringsteps import Leg, Ring

MERGE_INIT = 2 + 2  # forward, step 0: read its bf16 output, write the bf16 accumulator
MERGE_STEP = 2 + 2 + 2  # forward, later steps: read the step's output, read + write the sum
GRAD_COPY = 2 + 2  # backward, step 0: copy each gradient into its running buffer
GRAD_ADD = 2 + 2 + 2  # backward, later steps: add each gradient into its running buffer
# Memory AttnFuncWithCPAndKVP2P holds for one layer beyond what the layer keeps, with bf16
# attention (the non-FP8 path; FP8 attention's uint8 and fp32 buffers are not modelled), on
# the last rank (all its steps cover its whole queries), in bytes a K (or V) element, a query
# (or output) element and a row (a query's head: its log-sum-exp). Forward (forward): the cp
# K/V chunk pairs p2p_comm_buffers, bf16 (the first torch.cat(k, v), the others received),
# kept to the end, one then saved for the backward beside the k and v the caller still holds;
# each step's output (out_per_step, bf16) and fp32 log-sum-exp (softmax_lse_per_step), all
# merged after the loop into the output (flash_attn_fwd_out_correction_init returns the
# output's dtype; the fused corrections keep no temporaries).
FORWARD_KEY, FORWARD_QUERY, FORWARD_ROW = 2 + 2, 2, 4  # a step each
# Backward (backward): dq_buffer = empty_like(q) (bf16: no fp32 accumulation without FP8),
# p2p_comm_buffers two (2, *kv.shape) bf16 (the K/V pair sent and received, the dK/dV pair
# sent and received: 4 x (K + V)), and the last, diagonal step's dq_, dk_, dv_ (whole, bf16)
BACKWARD_KEY, BACKWARD_QUERY = 4 * (2 + 2) + (2 + 2), 2 + 2


def merge_bytes(cp, queries, keys) -> tuple[np.ndarray, np.ndarray]:
    """HBM bytes per layer of merging cp steps' partial results on one GPU, forward and
    backward, for `queries` query elements (b s/cp x heads / tp x head width) and `keys` key
    (or value) elements; zero without context parallelism."""
    cp = np.asarray(cp, dtype=float)
    forward = (MERGE_INIT + (cp - 1.0) * MERGE_STEP) * queries
    backward = (GRAD_COPY + (cp - 1.0) * GRAD_ADD) * (queries + 2.0 * keys)
    on = cp > 1
    return np.where(on, forward, 0.0), np.where(on, backward, 0.0)


def held_bytes(cp, queries, keys, rows) -> np.ndarray:
    """Bytes ring attention holds for one layer at its peak beyond what the layer keeps: its
    forward's or its backward's, the larger, for `queries` query elements (b s/cp x heads/tp
    x head width), `keys` K (or V) elements and `rows` query rows (b s/cp x heads/tp); zero
    without context parallelism."""
    cp = np.asarray(cp, dtype=float)
    forward = cp * (FORWARD_KEY * keys + FORWARD_QUERY * queries + FORWARD_ROW * rows)
    backward = BACKWARD_KEY * np.asarray(keys) + BACKWARD_QUERY * np.asarray(queries)
    return np.where(cp > 1, np.maximum(forward, backward), 0.0)


def replays_attention(recompute, parts) -> np.ndarray:
    """Recomputation codes (step.activations.RECOMPUTE) and recompute_modules codes (`parts`) that
    replay attention, its ring steps with it: selective (or core_attn) and full; op-level
    checkpointing keeps the attention's output."""
    return replays_core(recompute, parts) | (np.asarray(recompute) == 2)


def ring_attention(cp, step, core, merge_fwd, merge_bwd, hbm: float, contended=None):
    """Seconds a layer of ring attention adds per micro-batch, forward and backward (te_ring's
    legs, summed)."""
    return te_ring(cp, step, core, (merge_fwd, merge_bwd), hbm, contended).per_layer()


def te_ring(cp, step, core, merge, hbm: float, contended=None, nbytes=0.0, replay=False) -> Ring:
    """A layer of ring attention as its steps: cp - 1 K/V transfers (`step` seconds each, of
    `nbytes`; backward K, V and then their gradients) a step's attention cannot hide (the
    core's forward `core` seconds for the whole chunk pair, 1/cp a step; `contended` its
    seconds on the SMs the transfer's NCCL kernel leaves, step.contention: a step's
    attention runs that slow while its transfer lasts), and the merges' HBM bytes (`merge`,
    forward and backward) at `hbm` bytes/s; `replay`: recomputation replays the forward."""
    share = core / cp
    slow = None if contended is None else contended / cp
    back = ATTENTION_BACKWARD
    fwd = Leg(cp - 1, step, share, slow, nbytes)
    bwd = Leg(cp - 1, step, back * share, None if slow is None else back * slow, nbytes, sends=2)
    return Ring((fwd,), (bwd,), (merge[0] / hbm, merge[1] / hbm), replay)
