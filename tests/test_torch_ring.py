"""PyTorch's experimental ring attention as torchtitan ran it (step.torch_ring): its merges'
HBM bytes and the transfers its attention cannot hide, against hand-computed figures, an
event-by-event replay of the Dec 2024 loops on a compute and a communication stream, and the
step model (torchtitan's stacks take it, Megatron's keeps Transformer Engine's ring)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step.eager import KERNELS
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.step.torch_ring import (
    gather_bytes,
    grad_send_bytes,
    merge_bytes,
    torch_ring_attention,
    transfers,
)
from commsim.workload.presets import build_workload


def test_merge_bytes_by_hand():
    # cp 2 on the last rank, 1,000 query elements (K and V 1,000 each), 125 rows of 8.
    # Eager forward: K, V made contiguous 8 bytes a query element (read 2 + 2, write 2 + 2),
    # one cat of K, V for the rotater 8, step 0's out to fp32 6, step 1's merge 38 (its out to
    # fp32 6, out - out_1 12, sigmoid x that 8, out - that 12), the cast back 6: 66,000; rows
    # 56 a row: 7,000. Backward: zeros 12, K, V contiguous 8, the two final casts 6 + 12,
    # step 0's adds 20 + their flatten() 16 (copies: zeros_like kept the transposed K's
    # strides) + send cat 16 + dQ add 10, step 1's K/V cat 8 + half-adds 10 + their cats 16
    # + send cat 16 + dQ add 10: 160,000.
    # Compiled (Inductor's kernels): forward, the cat written from the grouped K, V (4 bytes
    # a query element, read 4 a grouped one: a quarter of them here, 1) and the one merge
    # kernel reading both steps' bf16 outputs and writing one, 6: 11,000; rows 4 x 2 read, 4
    # written: 1,500. Backward: K, V read and written twice 12, step 0's dK, dV into fp32 12,
    # the last cast 12, step 1's dK, dV 18, dQ 6: 60,000.
    eager = merge_bytes(np.array([2, 1]), 1000.0, 125.0, False)
    assert [x.tolist() for x in eager] == [[73_000.0, 0.0], [160_000.0, 0.0]]
    fused = merge_bytes(np.array([2, 1]), 1000.0, 125.0, True, 0.25)
    assert [x.tolist() for x in fused] == [[12_500.0, 0.0], [60_000.0, 0.0]]
    # each later step adds the same: eager 46 forward and 60 backward, compiled 2 and 20
    f2, b2 = merge_bytes(2, 1.0, 0.0, np.array([False, True]))
    f5, b5 = merge_bytes(5, 1.0, 0.0, np.array([False, True]))
    assert ((f5 - f2) / 3).tolist() == [46.0, 2.0]
    assert ((b5 - b2) / 3).tolist() == [60.0, 20.0]


def test_wire_bytes_by_hand():
    # 1,000 query elements: cp 4 ranks' bf16 K and V gathered, 4 x 2 x 1,000 x 2 bytes; the
    # backward sends dK and dV in fp32, 2 x 1,000 x 4
    assert float(gather_bytes(4, 1000.0)) == 16_000.0
    assert float(grad_send_bytes(1000.0)) == 8_000.0


def test_transfers_by_hand():
    # cp 4, 4 s of attention core forward: 1 s a step, 2.5 s backward. A 1.5 s gather shows
    # 0.5 s forward, nothing backward; 2 s sends hide under the next step's 2.5 s but the
    # last shows whole: 2 s; 3 s sends: 3 x 0.5 + 3
    fwd, bwd = transfers(4, 1.5, 2.0, 4.0)
    assert (float(fwd), float(bwd)) == pytest.approx((0.5, 2.0))
    _, bwd = transfers(4, 1.5, 3.0, 4.0)
    assert float(bwd) == pytest.approx(4.5)
    assert [float(x) for x in transfers(1, 1.5, 3.0, 4.0)] == [0.0, 0.0]
    # beside the gather the core takes 8 s (2 a step), beside a send 8 too: forward, step 0
    # at half speed for the gather's 1.5 s, 0.75 s lost; backward 2.5 s steps (5 slowed):
    # 0.75 s lost to the gather, 1 s to each 2 s send but the last, shown whole: 5.75 s
    fwd, bwd = transfers(4, 1.5, 2.0, 4.0, (8.0, 8.0))
    assert (float(fwd), float(bwd)) == pytest.approx((0.75, 0.75 + 3 * 1.0 + 2.0))
    # the merges at the HBM rate on top
    fwd, bwd = torch_ring_attention(4, 1.5, 2.0, 4.0, 100.0, 300.0, 100.0)
    assert (float(fwd), float(bwd)) == pytest.approx((1.5, 5.0))


def _replay(cp: int, gather: float, send: float, share: float) -> tuple[float, float]:
    """The Dec 2024 loops event by event, a compute stream and one NCCL stream (both
    collectives on the cp group): forward, the all-gather issued before step 0's SDPA and
    waited on before step 1's; backward, the same gather, then after each step's SDPA
    backward its dK/dV send, waited on after the next step's SDPA backward (the last after
    the loop). The ends, less the attention."""
    back = 2.5 * share
    fwd_t, gathered = 0.0, gather
    for i in range(cp):
        if i > 0:
            fwd_t = max(fwd_t, gathered)
        fwd_t += share
    t, nccl = 0.0, gather  # the gather first on the NCCL stream
    pending = None
    for i in range(cp):
        if i == 1:
            t = max(t, gather)
        t += back
        if pending is not None:
            t = max(t, pending)
        nccl = max(t, nccl) + send  # this step's send, issued after its adds
        pending = nccl
    t = max(t, pending)
    return fwd_t - cp * share, t - cp * back


@pytest.mark.parametrize("seed", range(30))
def test_the_transfers_are_the_replayed_loops(seed):
    rng = np.random.default_rng(seed)
    cp = int(rng.choice([2, 3, 4, 8, 16]))
    gather, send, core = rng.uniform(0, 3), rng.uniform(0, 3), rng.uniform(0, 8)
    fwd, bwd = transfers(cp, gather, send, core)
    want = _replay(cp, gather, send, core / cp)
    assert (float(fwd), float(bwd)) == pytest.approx(want, abs=1e-12)


def _model():
    shape = dict(layers=4, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816, gated_mlp=True)
    spec = ModelSpec(name="llama-ish", vocab=1000, seq_len=8192, **shape)
    cluster = make_cluster(nodes=2, gpus_per_node=8, nics=8, nic_bw="400Gbps")
    return StepModel(build_workload(spec), cluster, catalog.GPUS["h100"], 16, 16, None)


def test_torchtitan_stacks_take_pytorchs_ring_and_megatron_keeps_te():
    hm = _model()
    kernels = [KERNELS.index(k) for k in ("megatron", "torchtitan", "torchtitan-compile")]
    L = Layouts.build(dp=2, cp=8, micro_batches=1, kernels=kernels)
    te, eager, compiled = (hm.evaluate(L).row(i)["cp_comm"] for i in range(3))
    c = hm.compute(L)
    blocks, queries = 4, 8192 / 8 * 16 * 64  # K and V repeated to 16 heads
    for row, fused in ((1, False), (2, True)):
        gather = hm.groups.price("all-gather", "cp", L, gather_bytes(8, queries))[row]
        send = hm.groups.price("send-recv", "cp", L, grad_send_bytes(queries))[row]
        merge = merge_bytes(8, queries, queries / 64, fused, 4 / 16)
        f, b = torch_ring_attention(8, gather, send, c.core_fwd[row], *merge, 2.97e12)
        assert (eager, compiled)[row - 1] == pytest.approx(blocks * float(f + b), rel=1e-12)
    assert te != eager and eager > compiled > 0.0  # eager merges op by op, more bytes
    # no context parallelism: nothing, whatever the stack
    one = hm.evaluate(Layouts.build(dp=16, micro_batches=1, kernels=kernels))
    assert [one.row(i)["cp_comm"] for i in range(3)] == [0.0, 0.0, 0.0]
