"""Fitting on synthetic measurements with known alpha and bandwidth per tier (no torch):
the fit recovers them within its 95% intervals, and the intervals shrink with more points.
Also: writing tiers into a cluster, profiles carried to other clusters, placements."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_spec

from commsim.calibrate import fit
from commsim.calibrate.points import collect_points, placement, span
from commsim.calibrate.records import (
    CollectiveRecord,
    DDPRecord,
    LayerRecord,
    MetaRecord,
    ModelRecord,
    RankInfo,
    Results,
    Run,
)
from commsim.calibrate.validate import codec_gpu, harness_workload, predict_ddp, validate
from commsim.collectives.backends import ALGORITHMS
from commsim.collectives.group import GroupCost
from commsim.profile import (
    Profile,
    apply_tiers,
    carry_over,
    cluster_tiers,
    hardware_class,
    leaf_uplinks,
    tier_params,
)
from commsim.specs import SpecError
from commsim.topology.build import build_cluster

# 2 racks x 2 nodes x 2 GPUs, leaf uplink 2:1 oversubscribed: all three tiers
SPEC = make_spec(nodes=4, gpus_per_node=2, nodes_per_leaf=2, oversubscription=(2.0,))
TRUTH = {"intra-node": (5e-6, 20e9), "inter-node": (30e-6, 1.25e9), "cross-rack": (40e-6, 1.25e9)}
OPS = ("all-reduce", "all-gather", "send-recv", "broadcast", "all-to-all")
GPU = codec_gpu(SPEC, None)


def _results(
    spec, truth, groups, sizes, *, noise=0.03, seed=0, ops=OPS, ranks=None, outliers=0
) -> Results:
    """Measurements drawn from commsim's own model with the true tiers, times lognormal
    noise; `outliers` points are made 20x slower (a stalled process)."""
    world = 1 + max(max(g) for g in groups)
    ranks = ranks or [
        RankInfo(rank=r, host=f"h{r // 2}", rack=f"r{r // 4}", local_rank=r % 2)
        for r in range(world)
    ]
    meta = MetaRecord(
        kind="meta", run="syn", source="harness", backend="gloo", world_size=world, ranks=ranks
    )
    run = Run(meta=meta, line=1)
    recs = [
        CollectiveRecord(kind="collective", run="syn", op=op, group=g, bytes=s, time_s=1.0)
        for g in groups
        for op in ops
        for s in sizes
    ]
    run.collectives = list(enumerate(recs, start=2))
    res = Results(files=["synthetic"], runs={"syn": run})
    points, _ = collect_points(res, spec)
    model = fit.model_times(apply_tiers(spec, truth), points, ALGORITHMS["gloo"])
    rng = np.random.default_rng(seed)
    t = model * np.exp(rng.normal(0.0, noise, model.size))
    t[rng.choice(t.size, outliers, replace=False)] *= 20
    run.collectives = [
        (line, r.model_copy(update={"time_s": float(x)}))
        for (line, r), x in zip(run.collectives, t, strict=True)
    ]
    return res


def _inside(fitted, truth):
    for tier, (alpha, bw) in truth.items():
        f = fitted.profile.tiers[tier]
        assert f.alpha_ci_s[0] <= alpha <= f.alpha_ci_s[1], (tier, f)
        assert f.bandwidth_ci_Bps[0] <= bw <= f.bandwidth_ci_Bps[1] * (1 + 1e-9), (tier, f)


def _width(fitted, tier):
    f = fitted.profile.tiers[tier]
    return (f.alpha_ci_s[1] / f.alpha_ci_s[0], f.bandwidth_ci_Bps[1] / f.bandwidth_ci_Bps[0])


ONE_HOST = [RankInfo(rank=r, host="h", local_rank=r) for r in range(4)]


def test_one_tier_recovered_and_intervals_shrink():
    spec = make_spec(nodes=1, gpus_per_node=4)
    truth = {"intra-node": (40e-6, 2e9)}
    groups = [[0, 1, 2, 3], [0, 1]]
    few = fit.fit_profile(
        _results(spec, truth, groups, 8 * 4.0 ** np.arange(8), ranks=ONE_HOST), spec
    )
    many = fit.fit_profile(
        _results(spec, truth, groups, 8 * 2.0 ** np.arange(16), seed=1, ranks=ONE_HOST), spec
    )
    for fitted in (few, many):
        _inside(fitted, truth)
        assert set(fitted.profile.tiers) == {"intra-node"}
        assert fitted.profile.tiers["intra-node"].fitted == ["alpha", "bandwidth"]
        assert fitted.profile.provenance.rms_rel_error == pytest.approx(0.03, abs=0.01)
    wide, narrow = _width(few, "intra-node"), _width(many, "intra-node")
    assert narrow[0] < wide[0] and narrow[1] < wide[1]


def test_three_tiers_recovered_with_oversubscribed_uplink():
    groups = [[0, 1], [0, 1, 2, 3], list(range(8))]
    fitted = fit.fit_profile(_results(SPEC, TRUTH, groups, 8 * 4.0 ** np.arange(12)), SPEC)
    _inside(fitted, TRUTH)
    # two-rank groups: gloo's pairwise all-gather and send-recv are not modelled, nor is
    # its all-to-all anywhere (points.unmodelled): 2 of 5 ops on two ranks, 4 on more
    assert {t: f.points for t, f in fitted.profile.tiers.items()} == {
        "intra-node": 24,
        "inter-node": 48,
        "cross-rack": 48,
    }
    # the fitted cluster predicts what it was fitted to
    val = validate(
        _results(SPEC, TRUTH, groups, 8 * 4.0 ** np.arange(12), noise=0.0),
        SPEC,
        fitted.profile.model_copy(update={"cluster": SPEC.name}),
    )
    assert val.summary("collective")["max_abs_pct_error"] < 3.0


def test_outliers_are_weighed_down_not_dropped_and_named():
    spec = make_spec(nodes=1, gpus_per_node=4)
    truth = {"intra-node": (40e-6, 2e9)}
    sizes = 8 * 2.0 ** np.arange(14)
    res = _results(spec, truth, [[0, 1, 2, 3]], sizes, outliers=3, seed=4, ranks=ONE_HOST)
    fitted = fit.fit_profile(res, spec)
    _inside(fitted, truth)
    (note,) = [n for n in fitted.profile.notes if "robust sd" in n]
    assert note.startswith("3 of 56 points lie over 4 robust sd from the fit")
    assert "none dropped" in note
    assert len(fitted.points) == 56  # every modelled point took part


def test_a_parameter_the_data_do_not_pin_down_is_said_loudly():
    # alpha shows only in the two smallest sizes, and one of them stalled 20x: the fit
    # cannot tell which to believe, and warns that alpha is not identified
    spec = make_spec(nodes=1, gpus_per_node=4)
    truth = {"intra-node": (40e-6, 2e9)}
    sizes = [8, 16, *(512e6 * 2.0 ** np.arange(4))]
    res = _results(spec, truth, [[0, 1, 2, 3]], sizes, ops=("all-reduce",), ranks=ONE_HOST)
    line, rec = res.runs["syn"].collectives[0]
    res.runs["syn"].collectives[0] = (line, rec.model_copy(update={"time_s": rec.time_s * 20}))
    fitted = fit.fit_profile(res, spec)
    tier = fitted.profile.tiers["intra-node"]
    assert tier.bandwidth_ci_Bps[0] <= 2e9 <= tier.bandwidth_ci_Bps[1]
    assert any(w.startswith("intra-node alpha is not identified") for w in fitted.profile.warnings)
    # one op on one group: the per-call overhead cannot be told from alpha
    assert fitted.profile.call_overhead_s == 0 and fitted.profile.call_overhead_ci_s is None
    assert any("per-call overhead kept at the cluster's value" in n for n in fitted.profile.notes)


def test_tier_without_its_own_group_keeps_the_cluster_value():
    # only whole-world groups: intra- and inter-node links are never measured alone
    fitted = fit.fit_profile(
        _results(SPEC, TRUTH, [list(range(8))], 8 * 4.0 ** np.arange(12)), SPEC
    )
    assert set(fitted.profile.tiers) == {"cross-rack"}


def test_too_few_points_and_mixed_backends():
    spec = make_spec(nodes=1, gpus_per_node=2)
    truth = {"intra-node": (40e-6, 2e9)}
    with pytest.raises(SpecError, match="2 points cannot fit 3 parameters"):
        fit.fit_profile(_results(spec, truth, [[0, 1]], [8, 1 << 20], ops=("all-reduce",)), spec)
    res = _results(spec, truth, [[0, 1]], 8 * 4.0 ** np.arange(8))
    other = res.runs["syn"]
    other_meta = other.meta.model_copy(update={"run": "nc", "backend": "nccl"})
    res.runs["nc"] = Run(meta=other_meta, line=99, collectives=other.collectives)
    with pytest.raises(SpecError, match="mix backends"):
        fit.fit_profile(res, spec)


# --------------------------------------------------------------------------- tiers in specs


def test_tier_params_roundtrip_keeps_every_time():
    """Writing a cluster's own tiers back changes no prediction."""
    again = apply_tiers(SPEC, tier_params(SPEC))
    groups = [[0, 1], [0, 1, 2, 3], list(range(8))]
    res = _results(SPEC, tier_params(SPEC), groups, [8.0, 65536.0, 1 << 24], noise=0.0)
    points, _ = collect_points(res, SPEC)
    a = fit.model_times(SPEC, points, ALGORITHMS["gloo"])
    b = fit.model_times(again, points, ALGORITHMS["gloo"])
    np.testing.assert_allclose(a, b, rtol=1e-9)
    for tier, values in tier_params(SPEC).items():
        assert tier_params(again)[tier] == pytest.approx(values)
    assert again.node.nics.latency == pytest.approx(2e-6)  # the same split of alpha


def test_apply_tiers_sets_the_links():
    spec = apply_tiers(SPEC, TRUTH)
    cluster = build_cluster(spec)
    assert tier_params(spec)["cross-rack"] == pytest.approx(TRUTH["cross-rack"])
    assert leaf_uplinks(spec) == leaf_uplinks(SPEC) == 1
    # a send from rack 0 to rack 1 alone: alpha_cross + S / min(NIC, uplink)
    from commsim.topology.routing import path_params

    lat, bw = path_params(cluster, 0, 4)
    assert lat == pytest.approx(40e-6) and bw == pytest.approx(1.25e9)
    lat, bw = path_params(cluster, 0, 2)
    assert lat == pytest.approx(30e-6) and bw == pytest.approx(1.25e9)
    lat, bw = path_params(cluster, 0, 1)
    assert lat == pytest.approx(5e-6) and bw == pytest.approx(20e9)


@pytest.mark.parametrize(
    ("tiers", "words"),
    [
        ({"cross-rack": (40e-6, 3e9), "inter-node": (30e-6, 1.25e9)}, "outside what the leaf"),
        ({"cross-rack": (20e-6, 1e9), "inter-node": (30e-6, 1.25e9)}, "below the in-rack"),
        ({"cross-rack": (90e-6, 1e9), "inter-node": (30e-6, 1.25e9)}, "below the fabric's"),
        ({"spine": (1.0, 1.0)}, "unknown tier"),
    ],
)
def test_apply_tiers_refuses_what_no_link_gives(tiers, words):
    with pytest.raises(ValueError, match=words):
        apply_tiers(SPEC, tiers)


def test_apply_tiers_shrinks_the_fabric_under_a_small_alpha():
    # an in-rack alpha below the fabric's own cables and switch: they shrink in proportion
    spec = apply_tiers(SPEC, {"inter-node": (3e-7, 1.25e9)})
    assert tier_params(spec)["inter-node"] == pytest.approx((3e-7, 1.25e9))
    assert spec.node.nics.latency == 0
    assert spec.fabric.link_latency / spec.fabric.switch_latency == pytest.approx(0.5)


def _profile(cluster: str, tiers: dict, spec=SPEC, overhead: float = 0.0) -> Profile:
    """A profile of `spec`'s classes with the given (alpha, bandwidth) per tier."""
    lines = tier_params(spec)
    return Profile.model_validate(
        {
            "cluster": cluster,
            "backend": "gloo",
            "hardware": {t: hardware_class(spec, t) for t in cluster_tiers(spec)},
            "tiers": {
                t: {
                    "alpha_s": a,
                    "efficiency": b / lines[t][1],
                    "line_rate_Bps": lines[t][1],
                    "points": 1,
                    "fitted": ["alpha", "bandwidth"],
                }
                for t, (a, b) in tiers.items()
            },
            "call_overhead_s": overhead,
            "algorithms": ALGORITHMS["gloo"],
            "provenance": {"files": [], "runs": [], "date": "", "points": 1, "commsim": "0"},
        }
    )


def test_a_profile_travels_to_clusters_of_the_same_classes():
    assert cluster_tiers(SPEC) == ("intra-node", "inter-node", "cross-rack")
    applied, notes = carry_over(SPEC, _profile("test", TRUTH, overhead=2e-3))
    assert tier_params(applied)["inter-node"] == pytest.approx(TRUTH["inter-node"])
    assert applied.call_overhead == 2e-3 and applied.comm_backend == "gloo"
    assert notes[0] == "carried over from 'test' (gloo):"
    # another cluster of the same classes: twice the NICs' rate, 3 racks, another name:
    # alphas as fitted, bandwidths the same share of its own line rates
    other = make_spec(
        nodes=6, gpus_per_node=2, nodes_per_leaf=2, nic_bw="200Gbps", oversubscription=(2.0,)
    ).model_copy(update={"name": "elsewhere"})
    moved, notes = carry_over(other, _profile("test", TRUTH))
    alpha, bw = tier_params(moved)["inter-node"]
    assert alpha == pytest.approx(30e-6) and bw == pytest.approx(2.5e9)
    assert any(n.startswith("inter-node: alpha 30 us, 10.0% of its 25 GB/s") for n in notes)


def test_a_missing_or_other_class_is_refused_naming_it():
    one_rack = make_spec(nodes=2, gpus_per_node=2, nodes_per_leaf=2)
    fitted_in_a_rack = _profile("rack", {t: TRUTH[t] for t in cluster_tiers(one_rack)}, one_rack)
    with pytest.raises(SpecError, match="tiers.cross-rack: no cross-rack link class: the cluster"):
        carry_over(SPEC, fitted_in_a_rack)
    h100 = SPEC.model_copy(update={"node": SPEC.node.model_copy(update={"gpu": "h100"})})
    with pytest.raises(SpecError, match="hardware.intra-node: fitted on a100-80gb GPUs over nvs"):
        carry_over(h100, _profile("test", TRUTH))
    # a cluster without a tier the profile has: that class is simply not used
    _, notes = carry_over(one_rack, _profile("test", TRUTH))
    assert "cross-rack: not used (cluster 'test' has no cross-rack links)" in notes


# --------------------------------------------------------------------------- placement


def _meta(ranks: list[tuple[str, str | None, int]]) -> MetaRecord:
    return MetaRecord(
        kind="meta",
        run="m",
        source="harness",
        backend="gloo",
        world_size=len(ranks),
        ranks=[
            RankInfo(rank=i, host=h, rack=r, local_rank=lr) for i, (h, r, lr) in enumerate(ranks)
        ],
    )


def test_placement_follows_racks_and_hosts():
    # interleaved over racks: ranks alternate between rack B and rack A
    meta = _meta([("b1", "B", 0), ("a1", "A", 0), ("b2", "B", 0), ("a2", "A", 0)])
    spec = make_spec(nodes=4, gpus_per_node=1, nodes_per_leaf=2)
    gpu = placement(meta, spec)
    assert gpu.tolist() == [0, 2, 1, 3]  # rack B -> leaf 0 (nodes 0, 1), rack A -> leaf 1
    assert span(spec, gpu[[0, 2]]) == "inter-node"
    assert span(spec, gpu[[0, 1]]) == "cross-rack"
    # no rack labels: hosts fill nodes in order; local ranks pick the GPU
    meta = _meta([("x", None, 1), ("x", None, 0), ("y", None, 0)])
    assert placement(meta, make_spec(nodes=2, gpus_per_node=2)).tolist() == [1, 0, 2]


@pytest.mark.parametrize(
    ("ranks", "spec_kw", "words"),
    [
        ([("a", "R", 0), ("b", "R", 0), ("c", "R", 0)], {"nodes_per_leaf": 2}, "3 hosts"),
        ([("a", None, 0), ("a", None, 1), ("a", None, 2)], {"gpus_per_node": 2}, "2 GPUs per"),
        ([("a", None, 0), ("b", None, 0), ("c", None, 0)], {"nodes": 2}, "has 2 nodes"),
        ([("a", "R", 0), ("a", "S", 1)], {}, "in two racks"),
    ],
)
def test_placement_that_does_not_fit(ranks, spec_kw, words):
    kw = {"nodes": 4, "gpus_per_node": 1, "nodes_per_leaf": 2} | spec_kw
    with pytest.raises(SpecError, match=words):
        placement(_meta(ranks), make_spec(**kw))


# --------------------------------------------------------------------------- DDP, compute


def _model_record() -> ModelRecord:
    layers = [
        LayerRecord(
            name=f"{i}.Linear",
            tensors=[512 * 512, 512],
            forward_flops=2 * 512 * 512,
            forward_s=1e-3,
            backward_s=2e-3,
        )
        for i in range(8)
    ]
    return ModelRecord(kind="model", run="syn", name="mlp", batch=16, layers=layers)


def test_ddp_prediction_and_compute_rate():
    spec = make_spec(nodes=1, gpus_per_node=2)
    model = _model_record()
    workload = harness_workload(model)
    assert workload.params == 8 * (512 * 512 + 512)
    assert workload.tensor_params.tolist()[:2] == [512 * 512, 512]
    ddp = DDPRecord(
        kind="ddp",
        run="syn",
        bucket_mb=1.0,
        first_bucket_mb=1.0,
        compute_s=0.03,
        optimizer_s=0.006,
        step_s=0.04,
        exposed_comm_s=0.01,
        repeats=5,
    )
    group = GroupCost(build_cluster(spec), np.array([0, 1]))
    rep = predict_ddp(group, model, ddp, "ring", GPU)
    # compute scaled to the measured 24 ms of forward + backward, then the optimizer
    assert rep.compute_s == pytest.approx(0.03)
    assert len(rep.buckets) == 8  # one 1 MiB tensor crosses each bucket cap
    assert rep.step_time_s >= rep.compute_s
    res = _results(spec, {"intra-node": (40e-6, 2e9)}, [[0, 1]], [8.0, 1 << 20])
    res.runs["syn"].model, res.runs["syn"].ddp = model, [ddp]
    compute = fit.fit_compute(res, spec)
    flops = 3 * 8 * 2 * 512 * 512 * 16
    assert compute.flops_per_s == pytest.approx(flops / 0.024)
    assert compute.efficiency == pytest.approx(flops / 0.024 / 312e12)


def test_ddp_with_a_comm_hook_runs_its_collectives_and_codec():
    # fp16: every bucket all-reduces half its fp32 bytes, after an encode on the compute
    # stream; validate predicts hook records as such and names the hook in the row's op
    spec = make_spec(nodes=1, gpus_per_node=2)
    model = _model_record()
    kw = dict(kind="ddp", run="syn", bucket_mb=1.0, first_bucket_mb=1.0, repeats=5)
    times = dict(compute_s=0.03, optimizer_s=0.006, exposed_comm_s=0.01)
    plain = DDPRecord(**kw, **times, step_s=0.04)
    fp16 = DDPRecord(**kw, **times, step_s=0.035, compression="fp16")
    group = GroupCost(build_cluster(spec), np.array([0, 1]))
    base = predict_ddp(group, model, plain, "ring", GPU)
    half = predict_ddp(group, model, fp16, "ring", GPU)
    assert base.codec_s == 0 and half.codec_s > 0
    sizes = [b.bytes for b in base.buckets]
    assert [b.bytes for b in half.buckets] == sizes
    assert half.comm_s == pytest.approx(sum(group.time("all-reduce", "ring", np.array(sizes) / 2)))
    assert base.comm_s == pytest.approx(sum(group.time("all-reduce", "ring", np.array(sizes))))

    res = _results(spec, {"intra-node": (40e-6, 2e9)}, [[0, 1]], 8 * 4.0 ** np.arange(10))
    res.runs["syn"].model, res.runs["syn"].ddp = model, [plain, fp16]
    profile = fit.fit_profile(res, spec).profile
    rows = [r for r in validate(res, spec, profile).rows if r.kind == "ddp-step"]
    assert [r.op for r in rows] == ["ddp", "ddp fp16"]
