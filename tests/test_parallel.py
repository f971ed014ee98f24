"""The hybrid-parallel step model against hand-computed volumes and schedules."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_cluster
from typer.testing import CliRunner

from commsim import catalog
from commsim.cli.app import app
from commsim.collectives.group import GroupCost
from commsim.planner.search import enumerate_layouts
from commsim.scenario import load_scenario, resolve
from commsim.specs import ModelSpec
from commsim.step.layouts import GRAD_DTYPES, Layouts
from commsim.step.model import StepModel
from commsim.step.predict import predict
from commsim.step.shape import Shape, balanced_ends, split_problem, stage_layers
from commsim.workload.presets import build_workload

# A small GPT: 8 layers, h = 512, 8 heads, sequence 256, vocabulary 1000.
MODEL = ModelSpec(name="toy", layers=8, hidden=512, heads=8, vocab=1000, seq_len=256)
GPU = catalog.GPUS["a100-80gb"]


def _model(nodes=4, gpn=8, n=32, batch=64, **cluster):
    c = make_cluster(
        nodes=nodes,
        gpus_per_node=gpn,
        nics=gpn,
        nic_bw="200Gbps",
        link_latency="0s",
        switch_latency="0s",
        **cluster,
    )
    return StepModel(build_workload(MODEL), c, GPU, n, batch, efficiency=0.5)


def _layout(**kw):
    """One layout of bf16 gradients in one bucket (both caps huge), overlap off, ring."""
    base = dict(dp=32, micro_batches=2, bucket_mb=1e6, first_bucket_mb=1e6, overlap=False)
    return Layouts.build(**base | {"grad_dtype": GRAD_DTYPES.index("bf16")} | kw)


def test_ddp_sends_twice_the_gradient_bytes_through_a_ring():
    hm = _model()
    b = hm.evaluate(_layout()).row(0)
    grads = hm.shape.total_params * 2  # bf16 gradients, one bucket
    # ring all-reduce on the data-parallel group: intercept + slope x bytes, and the slope is
    # 2 (N-1)/N bytes per byte at the ring's bus bandwidth: check against GroupCost directly
    a, slope = GroupCost(hm.cluster, np.arange(32)).affine("all-reduce", "ring")
    assert b["dp_comm"] == pytest.approx(a + slope * grads)
    assert b["dp_exposed"] == pytest.approx(b["dp_comm"])  # overlap off: after the backward
    # 8 NICs x 25 GB/s per node: bus bandwidth 200 GB/s, so slope = 2 (31/32) / 200e9
    assert slope == pytest.approx(2 * 31 / 32 / 200e9, rel=1e-6)


def test_zero3_gathers_and_reduce_scatters_block_by_block():
    # FSDP units: each block's bf16 parameters gathered for the forward and again for the
    # backward, its gradients reduce-scattered; the embedding and head join the first unit
    hm = _model()
    sh = hm.shape
    z3 = hm.evaluate(_layout(zero=3, micro_batches=1)).row(0)
    cost = GroupCost(hm.cluster, np.arange(32))

    def ag(params):
        a, s = cost.affine("all-gather", "ring")
        return a + s * 2 * params

    def rs(params):
        a, s = cost.affine("reduce-scatter", "ring")
        return a + s * 2 * params

    block, ends = sh.block_params, sh.pre_params + sh.post_params
    units = 8 * (2 * ag(block) + rs(block)) + 2 * ag(ends)
    assert z3["dp_comm"] == pytest.approx(units, rel=1e-9)
    # 1.5x an all-reduce's volume: the bandwidth terms of 2 gathers + 1 reduce-scatter
    z0 = hm.evaluate(_layout(micro_batches=1)).row(0)
    z1 = hm.evaluate(_layout(zero=1, micro_batches=1)).row(0)
    assert z1["dp_comm"] == pytest.approx(z0["dp_comm"], rel=1e-6)  # RS + AG = AR volume
    a_ag, s_ag = cost.affine("all-gather", "ring")
    a_ar, s_ar = cost.affine("all-reduce", "ring")
    assert 3 * s_ag == pytest.approx(1.5 * s_ar, rel=1e-9)
    # overlap off: every gather and reduce-scatter on the critical path
    assert z3["dp_exposed"] == pytest.approx(z3["dp_comm"])


def test_tensor_parallel_four_allreduces_per_layer_per_micro_batch():
    hm = _model()
    b = hm.evaluate(_layout(dp=4, tp=8, micro_batches=16)).row(0)
    act = 1 * 256 * 512 * 2  # micro-batch x sequence x hidden x bf16
    a, slope = GroupCost(hm.cluster, np.arange(8)).affine("all-reduce", "ring")
    assert b["tp_comm"] == pytest.approx(16 * 8 * 4 * (a + slope * act))
    full = hm.evaluate(_layout(dp=4, tp=8, micro_batches=16, recompute=2)).row(0)
    assert full["tp_comm"] == pytest.approx(1.5 * b["tp_comm"])  # the replayed forward: 6


def test_one_f_one_b_bubble_fraction():
    hm = _model()
    p, m = 4, 6
    b = hm.evaluate(_layout(dp=8, pp=p, micro_batches=m)).row(0)
    busy = b["compute"] + b["tp_comm"] + b["pp_comm"]
    # (p - 1) idle ticks of m + p - 1: bubble / pipeline time = (p - 1) / (m + p - 1)
    assert b["bubble"] / (busy + b["bubble"]) == pytest.approx((p - 1) / (m + p - 1))
    # interleaved with v = 2: (p - 1) / v idle ticks, each tick carrying twice the sends
    inter = hm.evaluate(_layout(dp=8, pp=p, micro_batches=m, interleave=2)).row(0)
    tick = (inter["compute"] + inter["tp_comm"] + inter["pp_comm"]) / m
    assert inter["bubble"] == pytest.approx((p - 1) / 2 * tick)
    assert inter["pp_comm"] == pytest.approx(2 * b["pp_comm"])


def test_step_is_the_sum_of_its_parts_and_recompute_costs_hfu_not_mfu():
    hm = _model()
    b = hm.evaluate(_layout(dp=4, tp=4, pp=2, micro_batches=8, zero=1, overlap=True)).row(0)
    parts = ("compute", "tp_comm", "pp_comm", "bubble", "dp_exposed", "optimizer")
    assert b["step"] == pytest.approx(sum(b[k] for k in parts))
    full = hm.evaluate(_layout(dp=4, tp=4, pp=2, micro_batches=8, recompute=2)).row(0)
    assert full["hfu"] > full["mfu"]
    assert b["hfu"] == pytest.approx(b["mfu"])


def test_flop_count_matches_megatron():
    # Narayanan et al. 2021, eq. (3) per sequence, forward only: 24 s h^2 L (1 + s/6h) plus
    # the logit layer 2 s h V; Shape reads it off the workload's layers.
    sh = Shape.of(build_workload(MODEL))
    s, h, L, V = 256, 512, 8, 1000
    megatron = 24 * s * h * h * L * (1 + s / (6 * h)) + 2 * s * h * V
    assert sh.model_flops == pytest.approx(megatron, rel=0.01)


def test_interleaved_placement_hurts_tensor_parallelism():
    hm = _model()
    blocked = hm.evaluate(_layout(dp=4, tp=8, micro_batches=16)).row(0)
    spread = hm.evaluate(_layout(dp=4, tp=8, micro_batches=16, placement=1)).row(0)
    assert spread["tp_comm"] > 2 * blocked["tp_comm"]  # NVLink vs the NICs


@pytest.mark.parametrize(
    "args,expect",
    [
        (("--tp", "2"), "2 does not divide the model's 25 attention heads"),
        (("--pp", "64"), "64 pipeline stages for 48 layers"),
        (("--tp", "3"), "tp x pp x cp = 3 x 1 x 1 does not divide"),
        (("--model", "resnet50", "--tp", "2"), "not a transformer"),
        (("--pp", "2", "--interleave", "5"), "do not split evenly"),
        (
            ("--pp", "4", "--interleave", "2", "--global-batch", "32", "--micro-batch", "1"),
            "needs at least 4 per step, this layout has 2",
        ),
        (("--pp", "4", "--first-stage-layers", "10"), "leave 38 for the other 3 stages"),
        (("--first-stage-layers", "10"), "an uneven split needs pp > 1"),
        (
            ("--pp", "4", "--interleave", "4", "--first-stage-layers", "18"),
            "the other stages' 10 layers each do not split into interleave = 4 equal chunks",
        ),
    ],
)
def test_bad_layouts_exit_2(args, expect):
    result = CliRunner().invoke(app, ["predict", *args])
    assert result.exit_code == 2, result.output
    assert expect in result.output and "Traceback" not in result.output


# The toy GPT as a mixture of experts: 8 experts, top-2, capacity factor 1.25.
MOE = MODEL.model_copy(update={"experts": 8, "top_k": 2, "capacity_factor": 1.25})


def _moe(cluster=None, n=32):
    c = cluster or make_cluster(
        nodes=4, gpus_per_node=8, nics=8, nic_bw="200Gbps", link_latency="0s", switch_latency="0s"
    )
    return StepModel(build_workload(MOE), c, GPU, n, 64, efficiency=0.5)


def test_four_all_to_alls_per_moe_layer_per_micro_batch():
    hm = _moe()
    b = hm.evaluate(_layout(dp=16, tp=2, ep=8, micro_batches=4)).row(0)
    # per GPU: b x s / tp tokens x h x 2 bytes x top_k x capacity factor
    #   = 1 x 256 / 2 x 512 x 2 x 2 x 1.25 = 327,680 bytes
    nbytes = 1 * 256 / 2 * 512 * 2 * 2 * 1.25
    assert nbytes == 327_680
    # ep groups: 8 consecutive data-parallel ranks, stride tp = 2 in rank order, all at once
    groups = np.arange(32).reshape(2, 8, 2).transpose(0, 2, 1).reshape(-1, 8)
    assert groups[0].tolist() == [0, 2, 4, 6, 8, 10, 12, 14]
    a, slope = GroupCost(hm.cluster, groups).affine("all-to-all", "direct")
    # etp = tp = 2 (Megatron-core's default): the received copies all-gathered over the
    # etp pair before the experts and reduce-scattered after: an all-reduce of 2 x nbytes
    pairs = np.arange(32).reshape(-1, 2)
    a2, slope2 = GroupCost(hm.cluster, pairs[:1]).affine("all-reduce", "ring")
    gather = a2 + slope2 * 2 * nbytes
    # 4 micro-batches x 8 MoE layers x (dispatch + combine + gather, forward and backward)
    expect = 4 * 8 * 2 * (2 * (a + slope * nbytes) + gather)
    assert b["ep_comm"] == pytest.approx(expect, rel=1e-9)
    full = hm.evaluate(_layout(dp=16, tp=2, ep=8, micro_batches=4, recompute=2)).row(0)
    assert full["ep_comm"] == pytest.approx(1.5 * b["ep_comm"])  # the replayed forward
    parts = ("compute", "tp_comm", "ep_comm", "pp_comm", "bubble", "dp_exposed", "optimizer")
    assert b["step"] == pytest.approx(sum(b[k] for k in parts))
    # ep 1, etp 1: every expert whole on every GPU, nothing to exchange
    local = _layout(dp=16, tp=2, ep=1, etp=1, micro_batches=4)
    assert hm.evaluate(local).row(0)["ep_comm"] == 0.0


def test_expert_gradients_reduce_over_dp_over_ep():
    hm = _moe()
    b = hm.evaluate(_layout(ep=8)).row(0)  # dp 32, one bucket each
    experts = 8 * hm.shape.expert_params  # 8 blocks
    dense = (hm.shape.total_params - experts) * 2
    sparse = experts / 8 * 2
    a, s = GroupCost(hm.cluster, np.arange(32)).affine("all-reduce", "ring")
    # the 4 GPUs holding the same experts: stride ep = 8, one per node
    edp = np.arange(32).reshape(4, 8).T
    a2, s2 = GroupCost(hm.cluster, edp).affine("all-reduce", "ring")
    assert b["dp_comm"] == pytest.approx(a + s * dense + a2 + s2 * sparse, rel=1e-9)


def test_oversubscribed_uplinks_slow_the_all_to_all():
    # 8 nodes, one a leaf: an ep group of one GPU per node (tp = 8) crosses the uplinks
    def ep_comm(oversubscription):
        c = make_cluster(
            nodes=8,
            gpus_per_node=8,
            nics=8,
            nic_bw="200Gbps",
            nodes_per_leaf=1,
            oversubscription=oversubscription,
        )
        hm = _moe(c, n=64)
        layout = _layout(dp=8, tp=8, ep=8, micro_batch=8, micro_batches=1)  # 655,360 B a GPU
        return hm.evaluate(layout).row(0)["ep_comm"]

    blocking, non_blocking = ep_comm((3.0,)), ep_comm((1.0,))
    assert blocking > 2.0 * non_blocking


@pytest.mark.parametrize(
    "args,expect",
    [
        (("--model", "mixtral-8x7b", "--ep", "3"), "3 does not divide the model's 8 experts"),
        (("--ep", "2"), "expert parallelism needs experts"),
        (
            ("--model", "mixtral-8x7b", "--tp", "8", "--ep", "8"),
            "ep x etp = 8 x 8 does not divide a stage's tp x cp x dp = 32 ranks",
        ),
    ],
)
def test_bad_expert_parallelism_exits_2(args, expect):
    base = ["--cluster", "dgx-h100-ib", "--gpus", "32", "--global-batch", "64"]
    result = CliRunner().invoke(app, ["predict", *base, *args])
    assert result.exit_code == 2, result.output
    assert "--ep " in result.output and expect in " ".join(result.output.split())


def test_mixtral_expert_parallel_prediction_runs():
    args = "--model mixtral-8x7b --cluster dgx-h100-ib --gpus 64 --global-batch 256 --seq-len 4096"
    args += " --tp 2 --ep 8 --zero 1 --recompute selective --json"
    result = CliRunner().invoke(app, ["predict", *args.split()])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["strategy"]["ep"] == 8 and doc["ep_comm_s"] > 0
    assert doc["memory"]["fits"]


def test_search_tries_expert_parallelism_for_moe_models_only():
    def setup(model):
        overrides = dict(model=model, cluster="dgx-h100-ib", gpus=16, global_batch=64)
        return resolve(load_scenario(None, overrides)[0], check=False)

    moe = setup("mixtral-8x7b")
    layouts = enumerate_layouts(moe, {"tp": 8, "pp": 1, "etp": 8})  # dp 2: ep 1 or 2
    assert set(layouts.ep.tolist()) == {1, 2}
    # folded: with whole experts (etp 1) ep spans the 8 tp ranks x 2 dp ranks, up to the
    # model's 8 experts
    folded = enumerate_layouts(moe, {"tp": 8, "pp": 1})
    assert set(zip(folded.ep.tolist(), folded.expert_tp.tolist(), strict=True)) == {
        (1, 8), (2, 8), (1, 1), (2, 1), (4, 1), (8, 1)
    }  # fmt: skip
    assert set(enumerate_layouts(moe, {"tp": 1, "pp": 1}).ep.tolist()) == {1, 2, 4, 8}
    assert set(enumerate_layouts(moe, {"tp": 1, "pp": 1, "ep": 4}).ep.tolist()) == {4}
    assert set(enumerate_layouts(setup("llama2-7b"), {"tp": 2}).ep.tolist()) == {1}


def test_stage_layers_by_hand():
    # 10 layers on 4 stages, first 1 and last 3: the middle two take 3 each
    assert [float(x) for x in stage_layers(10, 4, 1, 3)] == [1.0, 3.0, 3.0]
    assert [float(x) for x in stage_layers(12, 4, -1, -1)] == [3.0, 3.0, 3.0]  # even
    assert [float(x) for x in stage_layers(9, 2, 4, -1)] == [4.0, 0.0, 5.0]  # no middle
    assert [float(x) for x in stage_layers(8, 1, -1, -1)] == [8.0, 0.0, 8.0]  # one stage


@pytest.mark.parametrize("seed", range(40))
def test_balanced_ends_is_the_best_megatron_split(seed):
    # against every composition of the layers into pp stages with equal middle stages
    import itertools

    rng = np.random.default_rng(seed)
    blocks, pp = int(rng.integers(3, 13)), int(rng.integers(2, 5))
    if pp > blocks:
        return
    pre, post = rng.uniform(0, 3, 2).round(2)
    best = min(
        max(k[0] + pre, *k[1:-1], k[-1] + post)
        for k in itertools.product(range(1, blocks + 1), repeat=pp)
        if sum(k) == blocks and len(set(k[1:-1])) <= 1
    )
    f, last = balanced_ends(blocks, pp, 1.0, float(pre), float(post))
    mid = (blocks - f - last) / (pp - 2) if pp > 2 else 0
    assert max(f + pre, mid, last + post) == pytest.approx(best)


def test_uneven_split_prices_the_slowest_stage():
    hm = _model()
    sh = hm.shape
    even = hm.evaluate(_layout(dp=8, pp=4, micro_batches=8)).row(0)
    pinned = hm.evaluate(_layout(dp=8, pp=4, micro_batches=8, first_layers=2, last_layers=2))
    assert pinned.row(0) == pytest.approx(even)  # the even split, spelled out
    # first 1, last 3, middle 2 each: the last stage (3 layers + head) is the slowest
    skew = hm.evaluate(_layout(dp=8, pp=4, micro_batches=8, first_layers=1, last_layers=3))
    b = skew.row(0)
    rate = GPU.peak_flops * hm.efficiency
    per_mb = (3 * sh.block_flops + sh.post_flops) * 3 / rate  # fwd + 2x bwd
    assert b["compute"] == pytest.approx(8 * per_mb)
    assert b["compute"] > even["compute"]
    # the memory of the worst stage grows with its layers: the first holds 4 in flight of 1
    # layer, the second 3 of 2, the last 1 of 3 + the logits
    assert b["memory"] != even["memory"]


def test_search_offers_the_balanced_split_where_layers_do_not_divide():
    sc, src = load_scenario(
        None, {"model": "gpt2-xl", "cluster": "dgx-a100-ib", "gpus": 40, "global_batch": 80}
    )
    setup = resolve(sc, src, check=False)
    lay = enumerate_layouts(setup, {"tp": 1, "pp": 5, "zero": 1})
    # 48 layers do not split into 5 stages evenly: only uneven splits are searched
    assert len(lay) and set(lay.first_layers.tolist()) != {-1}
    first, last = int(lay.first_layers[0]), int(lay.last_layers[0])
    assert (48 - first - last) % 3 == 0
    result = CliRunner().invoke(
        app,
        ["predict", "--model", "gpt2-xl", "--cluster", "dgx-a100-ib"]
        + ["--gpus", "40", "--global-batch", "80", "--tp", "1", "--pp", "5"]
        + ["--first-stage-layers", str(first), "--last-stage-layers", str(last), "--json"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["strategy"]["first_stage_layers"] == first


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_auto_takes_what_the_backend_runs_for_every_collective(backend):
    # under gloo auto is gloo's own algorithm of every collective (a ring all-reduce, ...):
    # the same step as ring; nccl picks as NCCL's tuner does. Under NCCL auto is NCCL's own
    # choice among all its algorithms and protocols: the same as nccl, and (the fabric
    # uncongested) never slower than its Ring or its Tree alone
    from commsim import whatif

    kw = {"model": "gpt3-175b", "cluster": "dgx-a100-ib", "gpus": 256, "global_batch": 512}
    kw |= {"seq_len": 2048, "tp": 8, "pp": 8, "recompute": "full"}
    steps = {}
    for alg in ("ring", "tree", "rhd", "auto", "nccl"):
        sc, src = load_scenario(None, kw | {"algorithm": alg})
        p = predict(resolve(whatif.change(sc, {"cluster.backend": backend}), src))
        assert p.strategy.algorithm == alg
        steps[alg] = p.step_time_s
    if backend == "gloo":
        assert steps["auto"] == steps["ring"]
        assert min(steps["ring"], steps["tree"]) <= steps["nccl"]
        assert steps["nccl"] <= max(steps["ring"], steps["tree"]) * (1 + 1e-12)
    else:
        assert steps["auto"] == steps["nccl"] <= min(steps["ring"], steps["tree"]) * (1 + 1e-12)


@pytest.mark.parametrize(
    "blocks,pp,v,first,last,problem",
    [
        (126, 16, 8, 7, 7, None),  # Llama 3 405B: 14 stages x 8 + 7 + 7, one chunk empty
        (48, 4, 2, -1, -1, None),
        (48, 4, 4, 18, -1, "other stages' 10 layers each do not split into interleave = 4"),
        (48, 5, 1, -1, -1, "do not split evenly into pp x interleave = 5 x 1"),
        (48, 1, 1, 10, -1, "an uneven split needs pp > 1"),
        (48, 2, 1, 10, 10, "leave 28 for the other 0 stages"),
    ],
)
def test_split_problem(blocks, pp, v, first, last, problem):
    got = split_problem(blocks, pp, v, first, last)
    assert got is None if problem is None else problem in got


def test_llama3_uneven_split_stage_layers():
    # Llama 3's 7-layer end stages leave 8 layers on each of the 14 middle stages
    first, mid, last = stage_layers(126, np.array([16]), np.array([7]), np.array([7]))
    assert (first[0], mid[0], last[0]) == (7, 8, 7)
