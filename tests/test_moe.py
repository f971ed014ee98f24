"""MoE in the step model: parallel folding (the expert grid over the attention grid's ranks),
experts' memory, and the MoE layer's kernels, against hand-computed cases and an independent
rank generator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import make_cluster
from typer.testing import CliRunner

from commsim.cli.app import app
from commsim.planner.search import enumerate_layouts, search
from commsim.scenario import load_scenario, resolve
from commsim.specs import ModelSpec
from commsim.step.groups import Groups
from commsim.step.layouts import RANK_ORDERS
from commsim.step.memory import ParallelLayout, memory_per_gpu
from commsim.step.predict import predict, step_model
from commsim.workload.presets import build_workload

MOE = ModelSpec(
    name="toy-moe",
    layers=4,
    hidden=1024,
    heads=8,
    vocab=1000,
    seq_len=512,
    gated_mlp=True,
    ffn_hidden=2048,
    experts=8,
    top_k=2,
    capacity_factor=1.0,
    moe_ffn_hidden=512,
)


def megatron_groups(kind, tp, cp, dp, pp, ep, etp, order):
    """Expert groups as Megatron-core's expert RankGenerator lays them out, written from its
    rank arithmetic: tp=etp, ep, dp=edp, cp=1 in the order's dimensions (fastest first:
    etp, ep, edp, pp; or etp, ep, pp, edp for the pipeline inside data parallelism)."""
    edp = tp * cp * dp // (ep * etp)
    sizes = {"etp": etp, "ep": ep, "edp": edp, "pp": pp}
    dims = ["etp", "ep", "edp", "pp"] if order == "tp-cp-ep-dp-pp" else ["etp", "ep", "pp", "edp"]
    groups = {}
    for coords in itertools.product(*(range(sizes[d]) for d in dims)):
        rank, stride = 0, 1
        for d, c in zip(dims, coords, strict=True):
            rank += c * stride
            stride *= sizes[d]
        key = tuple(c for d, c in zip(dims, coords, strict=True) if d != kind)
        groups.setdefault(key, set()).add(rank)
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize(
    "tp,cp,dp,pp,ep,etp,order",
    [
        (2, 1, 16, 2, 32, 1, "tp-cp-ep-dp-pp"),  # Qwen3-235B's fold: ep spans tp x dp
        (2, 1, 8, 2, 4, 2, "tp-cp-ep-dp-pp"),  # etp = tp: ep out of dp, as before folding
        (2, 2, 4, 1, 8, 2, "tp-cp-ep-dp-pp"),  # ep spans cp and dp
        (4, 2, 2, 2, 2, 1, "tp-cp-ep-dp-pp"),  # ep inside the tp ranks, edp over the rest
        (2, 2, 2, 2, 4, 1, "tp-cp-ep-pp-dp"),  # pipeline inside dp: ep x etp = tp x cp
    ],
)
def test_expert_groups_are_megatrons(tp, cp, dp, pp, ep, etp, order):
    n = tp * cp * dp * pp
    groups = Groups(make_cluster(nodes=n // 8 or 1, gpus_per_node=min(n, 8), nics=1), n)
    for kind in ("ep", "edp", "etp"):
        got = groups.members(0, kind, tp, dp, pp, ep, cp, 1, RANK_ORDERS.index(order), etp)
        assert {frozenset(r) for r in got.tolist()} == megatron_groups(
            kind, tp, cp, dp, pp, ep, etp, order
        ), kind


def test_qwen3_235b_fold_by_hand():
    # tp 2, dp 16, pp 8 on 256 GPUs, ep 32, etp 1: a stage's 32 ranks are one ep group,
    # each GPU alone in its expert-data-parallel and expert-tensor-parallel groups
    groups = Groups(make_cluster(nodes=32, gpus_per_node=8, nics=8), 256)
    ep = groups.members(0, "ep", 2, 16, 8, 32, 1, 1, 0, 1)
    assert ep.shape == (8, 32) and ep[1].tolist() == list(range(32, 64))
    assert groups.members(0, "edp", 2, 16, 8, 32, 1, 1, 0, 1).shape == (256, 1)
    assert groups.cost(0, "edp", 2, 16, 8, 32, 1, 1, 1, 0, 1) is None  # nothing to reduce


def _memory(**kw):
    base = dict(dp=4, tp=2, pp=1, micro_batch=1, zero=1, grad_bytes=4, sequence_parallel=True)
    return memory_per_gpu(build_workload(MOE), ParallelLayout(**base | kw))


def test_experts_shard_over_ep_times_etp():
    w = build_workload(MOE)
    expert = w.expert_params  # one block's experts
    assert expert == 8 * 3 * 1024 * 512  # gate, up, down of 512 for 8 experts
    folded = _memory(ep=8, etp=1)  # ep x etp = 8: an eighth of every block's experts
    carved = _memory(ep=2)  # etp = tp = 2, ep 2 out of dp: a quarter
    # weights: 2 bytes x 4 blocks x experts x (1/4 - 1/8)
    assert carved.params - folded.params == pytest.approx(2 * 4 * expert * (1 / 4 - 1 / 8))
    # ZeRO-1 shards the experts' optimizer states over edp = tp dp / (ep etp): whatever the
    # fold, each GPU keeps 12 bytes x experts / (tp dp) of them
    assert carved.optimizer == pytest.approx(folded.optimizer)
    # fp32 main gradients (unsharded under ZeRO-1): 4 bytes x (1/4 - 1/8)
    assert carved.grads - folded.grads == pytest.approx(4 * 4 * expert * (1 / 4 - 1 / 8))


def _predict(*args):
    base = ["predict", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-ib", "--gpus", "16"]
    return CliRunner().invoke(app, [*base, "--global-batch", "64", *args])


@pytest.mark.parametrize(
    "args,expect",
    [
        (("--tp", "2", "--ep", "8", "--etp", "4"), "ep x etp = 8 x 4 does not divide a stage's"),
        (
            ("--tp", "2", "--pp", "2", "--ep", "8", "--etp", "1", "--order", "tp-cp-ep-pp-dp"),
            "tp-cp-ep-pp-dp with pp > 1 needs ep x etp = tp x cp",
        ),
    ],
)
def test_bad_expert_grids_exit_2_in_one_line(args, expect):
    result = _predict(*args)
    assert result.exit_code == 2, result.output
    assert expect in result.output and len(result.output.strip().splitlines()) == 1


def test_folded_expert_parallelism_predicts():
    result = _predict("--tp", "2", "--ep", "8", "--etp", "1", "--zero", "1", "--json")
    assert result.exit_code == 0, result.output
    assert '"etp": 1' in result.output


def test_the_search_and_predict_agree_on_folded_layouts():
    # layouts whose ep spans tp ranks (etp 1 under tp 2), priced by the vectorised search and
    # by predict one at a time: one model, one figure
    overrides = dict(model=MOE, cluster="dgx-h100-ib", gpus=16, global_batch=64)
    setup = resolve(load_scenario(None, overrides)[0], check=False)
    layouts = enumerate_layouts(setup, {"tp": 2, "etp": 1, "zero": 1, "recompute": "none"})
    folded = np.nonzero(layouts.ep * layouts.expert_tp > layouts.tp)[0]
    assert set(layouts.ep[folded].tolist()) == {4, 8}  # ep over tp and dp ranks, 8 experts
    found = search(step_model(setup), layouts)
    row = {int(i): k for k, i in enumerate(found.fitting)}
    picks = [i for i in folded.tolist() if i in row][:12]
    assert picks
    for i in picks:
        strategy = layouts.strategy(i, setup.scenario.strategy)
        sc = setup.scenario.model_copy(update={"micro_batch": int(layouts.micro_batch[i])})
        variant = type(setup)(sc, setup.source, setup.cluster, setup.gpu, setup.workload)
        predicted = predict(variant, strategy).step_time_s
        assert predicted == pytest.approx(float(found.breakdown.step[row[i]]), rel=1e-9)
