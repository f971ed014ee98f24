"""The search's newer dimensions: context parallelism, the rank order, hybrid sharding."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim import catalog
from commsim.planner.search import context_parallel_choices, enumerate_layouts
from commsim.scenario import load_scenario, resolve
from commsim.specs import ModelSpec
from commsim.step.groups import Groups
from commsim.step.layouts import RANK_ORDERS, Layouts
from commsim.step.model import StepModel
from commsim.workload.presets import build_workload

PP_DP = RANK_ORDERS.index("tp-cp-ep-pp-dp")


def _setup(model, gpus=32, global_batch=64, seq_len=None):
    overrides = dict(model=model, cluster="dgx-h100-ib", gpus=gpus, global_batch=global_batch)
    overrides |= {"seq_len": seq_len} if seq_len else {}
    sc, src = load_scenario(None, overrides)
    return resolve(sc, src, check=False)


def test_rank_orders_swap_the_data_parallel_and_pipeline_strides():
    # 32 GPUs as tp 8 x dp 2 x pp 2: Megatron's order puts stage 1 16 GPUs on, the data-parallel
    # peer 8 on; --use-tp-pp-dp-mapping the other way round
    g = Groups(make_cluster(nodes=4, gpus_per_node=8), 32)
    assert g.members(0, "dp", 8, 2, 2)[0].tolist() == [0, 8]
    assert g.members(0, "dp", 8, 2, 2, order=PP_DP)[0].tolist() == [0, 16]
    assert g._ranks(0, 8, 1, 2, 2)[:, 0, 0, 0].tolist() == [0, 16]  # stage 0 -> 1
    assert g._ranks(0, 8, 1, 2, 2, PP_DP)[:, 0, 0, 0].tolist() == [0, 8]
    assert g.members(0, "tp", 8, 2, 2, order=PP_DP)[1].tolist() == list(range(16, 24))


def test_the_pipeline_inside_a_leaf_sends_at_nic_speed():
    # 2 nodes a leaf, uplinks 4:1: in Megatron's order all 16 GPUs of stage 0 send across the
    # leaf's uplinks (16 x 25 GB/s into 100 GB/s: 6.25 GB/s each); pipeline-inside-dp keeps
    # every send in its leaf at the NIC's 25 GB/s: a 4x smaller slope
    cluster = make_cluster(
        nodes=4,
        gpus_per_node=8,
        nics=8,
        nic_bw="200Gbps",
        oversubscription=(4.0, 1.0),
        link_latency="0s",
        switch_latency="0s",
    )
    g = Groups(cluster, 32)
    _, megatron = g.send(0, 8, 2, 2)
    _, inside = g.send(0, 8, 2, 2, order=PP_DP)
    assert inside == pytest.approx(1 / 25e9, rel=1e-6)
    assert megatron == pytest.approx(4 * inside, rel=1e-6)
    toy = ModelSpec(name="toy", layers=8, hidden=512, heads=8, vocab=1000, seq_len=256)
    model = StepModel(build_workload(toy), cluster, catalog.GPUS["a100-80gb"], 32, 64, 0.5)
    lay = Layouts.build(dp=2, tp=8, pp=2, micro_batches=32, order=[0, PP_DP])
    pp = model.evaluate(lay).pp_comm
    # 2 sends a micro-batch x 32 of 1 x 256 x 512 x 2 B / tp 8 each: 3 x that / 25 GB/s more
    assert pp[0] - pp[1] == pytest.approx(64 * 32768 * 3 / 25e9, rel=1e-6)


@pytest.mark.parametrize(
    "seq,choices",
    [(1000, [1]), (2048, [1, 2]), (4096, [1, 2, 4]), (131072, [1, 2, 4, 8, 16, 32])],
)
def test_context_parallel_choices_keep_512_token_chunks(seq, choices):
    assert context_parallel_choices(seq) == choices


def test_search_covers_cp_orders_and_hybrid_sharding_where_they_apply():
    setup = _setup("llama2-7b", seq_len=4096)
    L = enumerate_layouts(setup, {"micro_batch": 1, "recompute": "none"})
    assert set(L.cp.tolist()) == {1, 2, 4}
    assert np.all(L.dp * L.tp * L.pp * L.cp == 32)
    swapped = L.order == PP_DP
    assert swapped.any() and np.all((L.pp[swapped] > 1) & (L.dp[swapped] > 1))
    hybrid = L.fsdp_shard > 0
    assert hybrid.any() and np.all(L.zero[hybrid] == 3)
    assert np.all(L.fsdp_shard[hybrid] == 8 // (L.tp[hybrid] * L.cp[hybrid]))
    assert np.all(L.dp[hybrid] > L.fsdp_shard[hybrid])


def test_a_model_without_blocks_is_searched_as_plain_data_parallelism():
    L = enumerate_layouts(_setup("resnet50", gpus=16, global_batch=256))
    assert np.all((L.zero == 0) & (L.recompute == 0) & (L.tp == 1) & (L.cp == 1))


def test_fp8_and_tp_overlap_are_searched_unless_pinned():
    setup = _setup("llama2-7b")
    L = enumerate_layouts(setup, {"micro_batch": 1})
    assert set(L.fp8.tolist()) == {False, True}  # an H100: both precisions
    assert set(L.tp_overlap[L.tp > 1].tolist()) == {False, True}
    assert not L.tp_overlap[L.tp == 1].any()
    pinned = enumerate_layouts(setup, {"micro_batch": 1, "precision": "bf16", "tp_overlap": True})
    assert not pinned.fp8.any() and np.array_equal(pinned.tp_overlap, pinned.tp > 1)
    a100 = enumerate_layouts(
        resolve(*load_scenario(None, dict(model="llama2-7b", cluster="dgx-a100-ib", gpus=16))),
        {"micro_batch": 1},
    )
    assert not a100.fp8.any()  # no FP8 tensor cores


def test_predict_and_plan_take_the_new_strategy_flags():
    import json

    from typer.testing import CliRunner

    from commsim.cli.app import app

    args = ["--model", "llama3-8b", "--cluster", "dgx-h100-ib", "--gpus", "16"]
    args += ["--global-batch", "32", "--seq-len", "32768"]
    stack = ["--precision", "fp8", "--tp-overlap", "--no-flash-attention"]
    run = CliRunner().invoke
    out = run(
        app,
        ["predict", *args, "--tp", "8", "--cp", "2", "--order", "tp-cp-ep-pp-dp", *stack, "--json"],
    )
    assert out.exit_code == 0, out.output
    s = json.loads(out.output)["strategy"]
    assert (s["cp"], s["order"], s["precision"], s["tp_overlap"], s["flash_attention"]) == (
        2,
        "tp-cp-ep-pp-dp",
        "fp8",
        True,
        False,
    )
    out = run(
        app,
        [
            "plan",
            *args,
            "--tp",
            "8",
            "--cp",
            "2",
            "--zero",
            "3",
            "--fsdp-shard",
            "1",
            *stack[:3],
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    top = json.loads(out.output)["candidates"][0]["strategy"]
    assert (top["cp"], top["fsdp_shard"], top["precision"], top["tp_overlap"]) == (
        2,
        1,
        "fp8",
        True,
    )
    out = run(app, ["predict", *args, "--cp", "3"])
    assert out.exit_code == 2 and "tp x pp x cp = 1 x 1 x 3 does not divide" in out.output
