"""A fit a user can trust, on synthetic measurements drawn from commsim's own model with
known parameters (no torch): the per-call overhead recovered, 95% intervals that cover the
truth about 95% of the time (Monte Carlo over seeds), warnings where the residuals follow an
op or the bandwidths contradict a link check, points commsim does not model left out with
their reason, and validation with or without a profile."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_spec
from test_calibrate_fit import ONE_HOST, SPEC, TRUTH, _results

from commsim.calibrate import diagnose, fit
from commsim.calibrate.points import PAIRWISE, unmodelled
from commsim.calibrate.records import (
    DDPRecord,
    LayerRecord,
    LinkCheckRecord,
    ModelRecord,
    Results,
)
from commsim.calibrate.validate import ddp_buckets, validate
from commsim.step.buckets import MIB

ONE_NODE = make_spec(nodes=1, gpus_per_node=4)
NODE_TRUTH = {"intra-node": (40e-6, 2e9)}
SIZES = 8 * 4.0 ** np.arange(8)


def _with_repeats(res: Results, overhead: float, noise: float, seed: int) -> Results:
    """Each record's time plus a per-call overhead, as the median of 5 repeats with
    lognormal noise (the repeats recorded, as the harness does)."""
    rng = np.random.default_rng(seed)
    run = res.runs["syn"]
    recs = []
    for line, rec in run.collectives:
        reps = (rec.time_s + overhead) * np.exp(rng.normal(0.0, noise, 5))
        update = {"time_s": float(np.median(reps)), "times_s": reps.tolist()}
        recs.append((line, rec.model_copy(update=update)))
    run.collectives = recs
    return res


def _node_results(seed: int, overhead: float = 0.0, noise: float = 0.03, sizes=SIZES) -> Results:
    groups = [[0, 1, 2, 3], [0, 1]]
    res = _results(ONE_NODE, NODE_TRUTH, groups, sizes, noise=0.0, ranks=ONE_HOST)
    return _with_repeats(res, overhead, noise, seed)


def test_the_per_call_overhead_is_recovered_with_the_tiers():
    # sizes up to 32 MiB: at the cluster's 300 GB/s the bandwidth moves their time by over
    # 0.1% even under a 5 ms overhead, so the fit frees it
    res = _node_results(0, overhead=5e-3, noise=0.02, sizes=8 * 4.0 ** np.arange(12))
    fitted = fit.fit_profile(res, ONE_NODE).profile
    lo, hi = fitted.call_overhead_ci_s
    assert lo <= 5e-3 <= hi and fitted.call_overhead_s == pytest.approx(5e-3, rel=0.05)
    tier = fitted.tiers["intra-node"]
    assert tier.alpha_ci_s[0] <= 40e-6 <= tier.alpha_ci_s[1]
    assert tier.bandwidth_ci_Bps[0] <= 2e9 <= tier.bandwidth_ci_Bps[1]


@pytest.mark.slow
def test_intervals_cover_the_truth_about_95_percent_of_the_time():
    """Monte Carlo over noise draws: each fit's 95% bootstrap intervals should hold the true
    alpha and bandwidth in about 95% of the draws; 20 draws, at least 16 (binomial 95%
    lower end for p = 0.95 is 17; one spare for the bootstrap's own percentile noise)."""
    hits = np.zeros(2, dtype=int)
    for seed in range(20):
        tier = fit.fit_profile(_node_results(seed), ONE_NODE).profile.tiers["intra-node"]
        hits += [
            tier.alpha_ci_s[0] <= 40e-6 <= tier.alpha_ci_s[1],
            tier.bandwidth_ci_Bps[0] <= 2e9 <= tier.bandwidth_ci_Bps[1],
        ]
    assert hits.min() >= 16, hits


def test_residuals_structured_by_op_are_said_loudly():
    plain = fit.fit_profile(_node_results(1), ONE_NODE).profile
    assert not [w for w in plain.warnings if "structured" in w]
    res = _node_results(1)
    run = res.runs["syn"]
    run.collectives = [
        (line, rec.model_copy(update={"time_s": rec.time_s * 1.2}))
        if rec.op == "all-gather"
        else (line, rec)
        for line, rec in run.collectives
    ]
    warned = fit.fit_profile(res, ONE_NODE).profile.warnings
    assert any(w.startswith("residuals are structured by op: all-gather measures") for w in warned)


def _check(testbed: str, goodput: float) -> LinkCheckRecord:
    row = {"link": "host link (same rack)", "tier": "inter-node", "shaped_Bps": 1.25e9}
    return LinkCheckRecord(
        kind="link-check", run="c", testbed=testbed, links=[row | {"measured_Bps": [goodput]}]
    )


def test_a_fit_that_contradicts_the_link_check_is_said_loudly():
    groups = [[0, 2], [0, 2, 4, 6]]  # one GPU a node: inter-node and cross-rack
    res = _results(SPEC, TRUTH, groups, 8 * 4.0 ** np.arange(11), noise=0.01)
    res.link_checks = [_check(SPEC.name, 1.25e9)]
    assert not fit.fit_profile(res, SPEC).profile.warnings
    res.link_checks = [_check(SPEC.name, 1.5e9), _check("another-testbed", 1.0)]
    (warning,) = fit.fit_profile(res, SPEC).profile.warnings
    assert warning.startswith("the fit contradicts the testbed's link check (test, host link")
    assert "1500 MB/s of TCP goodput measured (-17%)" in warning


def test_flow_bandwidth_of_a_link_check_row():
    fitted = {"inter-node": 10.0, "cross-rack": 12.0}
    assert diagnose.flow_bandwidth("inter-node", 1, fitted, 2) == 10.0
    assert diagnose.flow_bandwidth("cross-rack", 1, fitted, 2) == 6.0  # one of 2 uplinks
    assert diagnose.flow_bandwidth("cross-rack", 4, fitted, 2) == 3.0  # 4 flows share them
    assert diagnose.flow_bandwidth("cross-rack", 1, fitted, 1) == 10.0  # the NIC is slower


def test_what_commsim_does_not_model_is_left_out_with_its_reason():
    assert unmodelled("all-to-all", 4, "slowest-rank", "gloo").endswith(PAIRWISE)
    assert "on 2 ranks is a pairwise exchange" in unmodelled(
        "all-gather", 2, "slowest-rank", "gloo"
    )
    assert unmodelled("all-gather", 3, "slowest-rank", "gloo") == ""
    assert unmodelled("send-recv", 4, "slowest-rank", "gloo") == ""
    assert unmodelled("all-to-all", 4, "slowest-rank", "nccl") == ""
    assert "root returns" in unmodelled("broadcast", 4, "rank0", "nccl")
    assert unmodelled("all-reduce", 4, "rank0", "gloo") == ""
    fitted = fit.fit_profile(_node_results(2), ONE_NODE)
    assert {p.op for p in fitted.points if len(p.gpus) == 2} == {"all-reduce", "broadcast"}
    assert "all-to-all" not in {p.op for p in fitted.points}
    notes = [n for n in fitted.profile.notes if n.startswith("left out")]
    assert notes[0].startswith("left out 16 points commsim does not model: gloo all-to-all")


def test_validate_without_a_profile_prices_the_cluster_as_it_is():
    res = _node_results(3)
    checked = validate(res, ONE_NODE, min_bytes=1.0)
    assert checked.backend == "gloo" and checked.notes[0].startswith("no profile")
    off = [r for r in checked.rows if r.unmodelled]
    assert len(off) == 16 + 2 * 8  # all-to-all everywhere; all-gather, send-recv on 2 ranks
    assert checked.summary("collective")["points"] == len(checked.rows) - len(off)
    with_profile = validate(res, ONE_NODE, fit.fit_profile(res, ONE_NODE).profile, min_bytes=1.0)
    assert with_profile.notes[0] == "carried over from 'test' (gloo):"
    worse, better = (
        v.summary("collective")["median_abs_pct_error"] for v in (checked, with_profile)
    )
    assert better < 5 < worse  # the cluster's placeholder links are far from the truth


def _mlp(mib: float) -> ModelRecord:
    """Layers of 1/8 of `mib` MiB of float32 gradients each."""
    n = int(mib * MIB / 4 / 8)
    layers = [
        LayerRecord(name=f"{i}", tensors=[n], forward_flops=1.0, forward_s=1e-3, backward_s=2e-3)
        for i in range(8)
    ]
    return ModelRecord(kind="model", run="syn", name="mlp", batch=1, layers=layers)


def test_ddp_buckets_follow_the_runs_torch_and_are_checked_against_its_own():
    model = _mlp(16.0)  # 16 MiB of gradients
    kw = dict(kind="ddp", run="syn", first_bucket_mb=1, compute_s=0.1, optimizer_s=0.0)
    ddp = DDPRecord(**kw, bucket_mb=25, step_s=0.2, exposed_comm_s=0.1, repeats=3)
    assert ddp_buckets(model, ddp, "2.13.0").bytes.tolist() == [16 * MIB]  # one 25 MiB cap
    older = ddp_buckets(model, ddp, "2.3.1").bytes  # a 1 MiB first bucket: one layer's 2 MiB
    assert older.tolist() == [2 * MIB, 14 * MIB]
    from commsim.calibrate.validate import bucket_check

    same = ddp.model_copy(update={"buckets_bytes": [16 * MIB]})
    assert bucket_check(ddp_buckets(model, same, "2.13.0"), same, "2.13.0") is None
    note = bucket_check(ddp_buckets(model, same, "2.3.1"), same, "2.3.1")
    assert (
        note == "25 MiB cap: torch 2.3.1's DDP formed buckets of 16 MiB, commsim's rule 2, 14 MiB"
    )


def test_strict_refuses_a_doubtful_fit_and_writes_nothing(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from commsim.calibrate.records import record_line
    from commsim.cli.app import app

    res = _node_results(1)
    run = res.runs["syn"]
    records = [run.meta.model_dump()] + [
        rec.model_dump() | ({"time_s": rec.time_s * 1.2} if rec.op == "all-gather" else {})
        for _, rec in run.collectives
    ]
    results, cluster = tmp_path / "r.jsonl", tmp_path / "c.yaml"
    results.write_text("".join(record_line(r) for r in records))
    cluster.write_text(yaml.safe_dump(ONE_NODE.model_dump(mode="json")))
    prof = tmp_path / "p.yaml"
    args = ["calibrate", "fit", str(results), "--cluster", str(cluster), "-o", str(prof)]
    refused = CliRunner().invoke(app, [*args, "--strict"])
    assert refused.exit_code == 2 and not prof.exists()
    assert "warning: residuals are structured by op: all-gather" in refused.output
    assert "1 warning and --strict: nothing written" in refused.output
    written = CliRunner().invoke(app, args)
    assert written.exit_code == 0 and prof.exists()
    assert "warning: residuals are structured by op: all-gather" in written.output
