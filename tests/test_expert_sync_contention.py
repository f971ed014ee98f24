"""The expert buckets' collectives hold the SMs and move the HBM bytes of the group they
reduce over, the expert-data-parallel one (edp ranks, its own NCCL channels), not the data-
parallel group's; the backward's rate beside the sync is the two groups' rates weighted by
their network seconds (step.dpsync._rates)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim import catalog
from commsim.specs import ModelSpec
from commsim.step.contention import collective_hbm_bytes, contended_compute, slowdown
from commsim.step.layouts import Layouts
from commsim.step.model import StepModel
from commsim.workload.presets import build_workload

SPEC = ModelSpec(
    name="toy-moe", layers=4, hidden=2048, heads=16, vocab=32000, seq_len=2048, experts=8, top_k=2
)


def _model():
    # two nodes of 8 GPUs, 8 NICs each: NCCL runs dp = 16 on 20 channels, edp = 4 on 8
    cluster = make_cluster(
        nodes=2, gpus_per_node=8, nics=8, nic_bw="400Gbps", intra_bw="450GB/s", backend="nccl"
    )
    return StepModel(build_workload(SPEC), cluster, catalog.GPUS["h100"], 16, 64, None)


def _layout():
    return Layouts.build(dp=16, ep=4, zero=1, micro_batch=1, micro_batches=4)


def _parts(model, L):
    """(network seconds, gradient bytes) of the reductions' dense and expert buckets."""
    plan = model.dp.sync_plan(L, 0)
    reduce = plan.costs.network - plan.params
    expert = plan.buckets.expert
    assert expert.any() and (~expert).any()
    return [(reduce[m].sum(), plan.buckets.bytes[m].sum()) for m in (~expert, expert)]


def test_each_group_prices_its_own_buckets():
    """A stub `slowed` at 0.9 on dp and 0.6 on edp: the rate is 1 - (0.1 t_dp + 0.4 t_edp) /
    (t_dp + t_edp), and the edp call carries the expert buckets' reduce-scatter bytes on 4
    ranks: (1 + 1/4 + 2 x 3/4) = 2.75 times their size."""
    model, L = _model(), _layout()
    assert model.groups.channels("dp", L)[0][0] != model.groups.channels("edp", L)[0][0]
    (t_dp, g_dp), (t_edp, g_edp) = _parts(model, L)
    calls = {}

    def slowed(rows, part, moved, seconds, kind="dp"):
        calls[(part, kind)] = (float(moved[0]), float(seconds[0]))
        return np.full(len(rows), {"dp": 0.9, "edp": 0.6}[kind])

    one = np.ones(1)
    *_, rate = model.dp.sync(L, one, one, slowed)
    assert rate[0] == pytest.approx(1 - (0.1 * t_dp + 0.4 * t_edp) / (t_dp + t_edp))
    assert calls[("reduce", "edp")] == pytest.approx((2.75 * g_edp, t_edp))
    assert calls[("reduce", "dp")] == pytest.approx((g_dp * (1 + 1 / 16 + 2 * 15 / 16), t_dp))


def test_the_step_model_prices_the_expert_group():
    """StepModel.evaluate's sync rate against the roofline beside each group's collectives
    on its own channels (contended_compute), weighted by hand."""
    model, L = _model(), _layout()
    c = model.compute(L)
    lost = total = 0.0
    for (seconds, grads), kind, ranks in zip(_parts(model, L), ("dp", "edp"), (16, 4), strict=True):
        moved = collective_hbm_bytes("reduce-scatter", grads, ranks)
        slow = contended_compute(model, L, kind, np.array([moved]), np.array([seconds]))
        lost += seconds * (1 - slowdown(c.block_bwd, slow.block_bwd)[0])
        total += seconds
    rate = model.evaluate(L).sync_rate[0]
    assert rate == pytest.approx(1 - lost / total, rel=1e-12)
    # all on dp's 20 channels (the defect) would slow the backward more
    moved = collective_hbm_bytes("reduce-scatter", sum(g for _, g in _parts(model, L)), 16)
    slow = contended_compute(model, L, "dp", np.array([moved]), np.array([total]))
    assert rate > slowdown(c.block_bwd, slow.block_bwd)[0]


def test_fsdp_expert_units_on_their_group():
    """ZeRO-3 units of a MoE block: the forward beside the dense all-gather on dp and the
    expert one on edp, each on its own channels and ranks, at the rates' mean weighted by
    the gathers' seconds (hand-weighted from contended_compute on each group)."""
    from commsim.step import fsdp

    model, L = _model(), Layouts.build(dp=16, ep=4, zero=3, micro_batch=1, micro_batches=4)
    sh, c = model.shape, model.compute(L)
    dense, sparse = sh.block_params - sh.expert_params, sh.expert_params / 4
    rows = np.array([0])
    lost = total = 0.0
    for params, part, kind, ranks in ((dense, "dense", "dp", 16), (sparse, "expert", "edp", 4)):
        g = fsdp._unit(model, L, params, part)[0]
        moved = collective_hbm_bytes("all-gather", params * 2, ranks)
        slow = contended_compute(model, L, kind, moved, g)
        lost += g[0] * (1 - slowdown(c.block_fwd, slow.block_fwd)[0])
        total += g[0]
    parts = [
        (dense, *fsdp._unit(model, L, dense, "dense"), False),
        (sparse, *fsdp._unit(model, L, sparse, "expert"), True),
    ]
    f_slow, _ = fsdp.beside_units(model, L, c, rows, parts)
    assert f_slow[0] == pytest.approx(c.block_fwd[0] / (1 - lost / total), rel=1e-12)
    # all on dp's 20 channels and 16 ranks (the defect) would slow it more
    moved = collective_hbm_bytes("all-gather", (dense + sparse) * 2, 16)
    slow = contended_compute(model, L, "dp", moved, np.array([total]))
    assert f_slow[0] < slow.block_fwd[0]
