"""DualPipe's data-parallel sync: a rank holds two stages (stage r and stage pp - 1 - r,
step.dualpipe), so its gradients and its ZeRO-1 parameter gathers cover both, its optimizer
steps its share of both over both copies' holders (2 dp, as step.memory shards them), and
the far stage's buckets launch ahead of the near one's by the backward ops DualPipe's order
runs after them (step.dualpipe.phase_leads)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step import dualpipe
from commsim.step.layouts import Layouts
from commsim.step.memory import ParallelLayout, memory_per_gpu
from commsim.step.model import StepModel
from commsim.workload.presets import build_workload

GPT = ModelSpec(name="toy", layers=8, hidden=512, heads=8, vocab=1000, seq_len=256)


def _model():
    w = build_workload(GPT, 256, "toy")
    cluster = make_cluster(nodes=1, gpus_per_node=8, intra_bw="450GB/s", backend="nccl")
    return StepModel(w, cluster, catalog.GPUS["h100"], 8, 16, None)


def _layouts():
    # dp 2 x pp 4, ZeRO-1, fp32 gradients: 1F1B and DualPipe
    return Layouts.build(dp=2, pp=4, zero=1, micro_batches=8, schedule=[0, 1])


def test_phase_leads_by_hand():
    """pp 4, rank 0 (DualPipe.step's steps): F0 F0 | F0 F1 | B1-deferred W F1 | F0B1 F1B0 ...
    | B1 B0-deferred | W B0-deferred | W: after its last phase-1 backward two phase-0
    backwards run; three phase-0 forwards run before its first phase-1 forward. The middle
    ranks finish their far stage last of all (no backward after it), after one forward."""
    assert dualpipe.phase_leads(4, 0) == dualpipe.phase_leads(4, 3) == (2, 3)
    assert dualpipe.phase_leads(4, 1) == dualpipe.phase_leads(4, 2) == (0, 1)
    assert [dualpipe.phase_leads(16, r)[0] for r in range(8)] == [8, 6, 4, 2, 0, 0, 0, 0]


def test_the_rank_syncs_both_its_stages():
    """Rank 0 holds the embedding, blocks 0-1 and 6-7 and the final norm: its buckets carry
    their fp32 gradients; 1F1B's priced stage one end's (the first, with the embedding)."""
    model, L = _model(), _layouts()
    w = model.workload
    held = ("embedding", "block.0", "block.1", "block.6", "block.7", "final_norm", "lm_head")
    rank0 = sum(layer.params for layer in w.layers if layer.name in held)
    first = sum(layer.params for layer in w.layers[:3])
    one, dual = (model.dp.sync_plan(L, i) for i in (0, 1))
    assert one.buckets.bytes.sum() == pytest.approx(4 * first)
    assert dual.buckets.bytes.sum() == pytest.approx(4 * rank0)
    # the far stage (the last: blocks 6-7, the norm) is chunk 1, launched first
    far = dual.chunk == 1
    assert dual.buckets.bytes[far].sum() == pytest.approx(4 * (2 * 3152384 + 1024))
    assert far[: far.sum()].all()
    # its leads: two stage backwards ahead of the near stage's; its gathers three forwards
    ready = dual.buckets.ready
    np.testing.assert_allclose(dual.leads, 1 - ready + 2 * far)
    # memory counts the same two stages' weights (bf16; its tied-head copy apart)
    mem = memory_per_gpu(w, ParallelLayout(dp=2, pp=4, zero=1, micro_batches=8, dualpipe=True))
    assert mem.params == pytest.approx(2 * (rank0 + 1000 * 512))


def _serial_tail(network, leads, x):
    """Event by event: bucket i launched leads[i] x before the backward's end (at 0), the
    buckets one at a time in launch order; what runs past the end."""
    end = -np.inf
    for t, lead in zip(network, leads, strict=True):
        end = max(end, -lead * x) + t
    return max(end, 0.0)


def test_the_sync_and_the_optimizer_are_the_ranks():
    """DataParallel.sync at x (no contention): the reductions' exposed tail is the serial
    schedule of the rank's buckets at their leads, the gathers' the same at three forwards
    for the far stage; the optimizer steps (rank 0's parameters) / (2 dp)."""
    model, L = _model(), _layouts()
    dual = model.dp.sync_plan(L, 1)
    reduce = dual.costs.network - dual.params
    x = np.array([0.0, 1e-5, 2e-5, 4e-5])  # from none of it hidden to all but the last
    for xi in x:
        net, exposed, _, local, _ = model.dp.sync(L, np.full(2, xi), np.full(2, xi))
        far = dual.chunk == 1
        needs = 1 - dual.buckets.ready + 3 * far
        want = _serial_tail(reduce, dual.leads, xi) + _serial_tail(dual.params, needs, xi)
        assert exposed[1] == pytest.approx(want, rel=1e-9)
        assert net[1] == pytest.approx(dual.costs.network.sum())
    held = ("embedding", "block.0", "block.1", "block.6", "block.7", "final_norm", "lm_head")
    rank0 = sum(layer.params for layer in model.workload.layers if layer.name in held)
    assert local[1] == pytest.approx(rank0 / 4)
