"""Scenario to prediction: metric definitions, overrides, the planner's search."""

from __future__ import annotations

import pytest

from commsim.planner.plan import plan
from commsim.scenario import load_scenario, resolve
from commsim.specs import SpecError
from commsim.step.predict import predict


def _setup(**overrides):
    scenario, source = load_scenario(None, overrides)
    return resolve(scenario, source)


def test_one_gpu_scales_perfectly_and_mfu_is_by_definition():
    setup = _setup(gpus=1, global_batch=8, micro_batch=2)
    pred = predict(setup)
    r = pred.parts
    assert r["comm_s"] == 0 and r["exposed_comm_s"] == 0
    assert pred.scaling_efficiency == pytest.approx(1.0)
    # MFU = 3 x forward FLOPs per sample x global batch / step time / (N x peak)
    flops = setup.workload.train_flops * 8 / pred.step_time_s
    assert pred.mfu == pytest.approx(flops / setup.gpu.peak_flops)
    assert pred.tflops_per_gpu == pytest.approx(flops / 1e12)


def test_scaling_efficiency_counts_exposed_comm_and_replicated_optimizer():
    setup = _setup()
    pred = predict(setup)
    r, n = pred.parts, setup.n_gpus
    # one GPU runs all n x accum micro-batches of the global batch, then one optimizer step
    one_gpu = n * (r["forward_s"] + r["backward_s"]) + r["optimizer_s"]
    assert pred.scaling_efficiency == pytest.approx(one_gpu / (n * pred.step_time_s))


def test_overlap_never_hurts():
    setup = _setup()
    base = setup.scenario.strategy
    for alg in ("ring", "tree", "hierarchical"):
        on = predict(setup, base.model_copy(update={"algorithm": alg, "overlap": True}))
        off = predict(setup, base.model_copy(update={"algorithm": alg, "overlap": False}))
        assert on.step_time_s <= off.step_time_s
        assert off.parts["exposed_comm_s"] == pytest.approx(off.parts["comm_s"])


def test_batch_must_divide():
    with pytest.raises(SpecError, match="global_batch"):
        _setup(global_batch=100)


# plain data parallelism at the scenario's micro-batch: what DDP users tune
DDP_ONLY = {"tp", "pp", "ep", "cp", "zero", "recompute", "interleave", "micro_batch", "precision"}


def _plan(setup, **pins):
    """plan() of plain DDP with `pins` held (the other DDP dimensions searched)."""
    base = setup.scenario.strategy.model_copy(update=pins)
    return plan(setup, base, DDP_ONLY | set(pins))


def test_plan_ranks_and_drops_duplicate_orders():
    setup = _setup()
    result = _plan(setup, bucket_mb=25.0, compression="none")
    times = [p.step_time_s for p in result.ranked]
    assert times == sorted(times)
    # topology-aware equals blocked on a packed allocation: it is not searched, and noted
    assert {p.strategy.placement for p in result.ranked} == {"blocked", "interleaved"}
    assert result.searched == len(result.ranked) == 5 * 2 * 2  # algorithms, placements, overlap
    assert any("topology-aware" in n for n in result.notes)
    # the blocked ring beats the interleaved ring on every setting
    ring = {
        (p.strategy.placement, p.strategy.overlap): p.step_time_s
        for p in result.ranked
        if p.strategy.algorithm == "ring"
    }
    assert ring["blocked", True] < ring["interleaved", True]


def test_plan_leaves_out_whole_node_algorithms_on_partial_nodes():
    # 20 GPUs of 8-GPU nodes: commsim's hierarchical needs whole nodes; NCCL's tree (the
    # default backend's) runs on any communicator
    setup = _setup(gpus=20, global_batch=40)
    result = _plan(setup, bucket_mb=25.0, placement="blocked", compression="none")
    assert {p.strategy.algorithm for p in result.ranked} == {"ring", "tree", "rhd", "ps"}
    assert result.skipped == 2  # hierarchical, overlap on and off
    assert any("whole nodes" in n for n in result.notes)


@pytest.mark.parametrize(
    "cluster,gpus,expect_compression",
    [("ethernet-10g", 64, True), ("dgx-h100-ib", 8, False)],
)
def test_planner_compresses_on_a_slow_fabric_not_on_nvlink(cluster, gpus, expect_compression):
    # BERT-large, 8 sequences of 512 per GPU: compute-heavy enough to hide NVLink traffic
    setup = _setup(
        model="bert-large",
        seq_len=512,
        cluster=cluster,
        gpus=gpus,
        global_batch=8 * gpus,
        micro_batch=8,
    )
    result = _plan(setup, algorithm="ring", bucket_mb=25.0, placement="blocked")
    best = result.ranked[0]
    assert (best.strategy.compression != "none") == expect_compression
    if not expect_compression:  # on NVLink every codec costs more GPU time than it saves
        slower = [p for p in result.ranked if p.strategy.overlap][1:]
        assert all(p.parts["codec_s"] > 0 for p in slower)


def test_compression_codec_counts_as_communication():
    pred = predict(_setup(compression="powersgd:4", error_feedback=True, overlap=False))
    r = pred.parts
    # Without overlap the all-reduces wait for the backward and every encode; decodes hide
    # under later all-reduces except the last: exposed = encodes + all-reduces + last decode.
    bars = [e for e in pred.events if e.label.startswith(("encode", "decode"))]
    encodes = sum(e.end_s - e.start_s for e in bars if e.label.startswith("encode"))
    last_decode = max((e for e in bars if e.label.startswith("decode")), key=lambda e: e.end_s)
    assert r["codec_s"] > 0
    assert r["exposed_comm_s"] == pytest.approx(
        encodes + r["comm_s"] + last_decode.end_s - last_decode.start_s
    )
    assert 0 < pred.overlap_ratio < 0.1


def test_plan_drops_what_does_not_fit_and_says_why():
    setup = _setup(micro_batch=8)  # GPT-2 XL, 8 x 1024 tokens of activations: over 40 GB
    result = _plan(setup, bucket_mb=25.0, compression="none")
    assert result.ranked == [] and result.skipped == result.searched == 5 * 2 * 2
    assert any("does not fit in GPU memory" in n and "activations" in n for n in result.notes)
