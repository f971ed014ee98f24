"""Stragglers: a slow rank in a synchronous job, a degraded link on the graph, per-rank jitter
(expected maximum of N draws, analytical against closed forms and Monte Carlo), and what
each mitigation leaves."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_spec
from scipy import stats

from commsim import whatif
from commsim.reliability import jitter as jt
from commsim.reliability.adapter import collective_time, degraded
from commsim.reliability.blast import blast_radius
from commsim.reliability.stragglers import (
    degraded_link,
    dp_groups,
    jitter,
    slow_rank,
    slow_rank_step,
    tp_groups,
)
from commsim.scenario import resolve
from commsim.specs import Scenario
from commsim.step.predict import predict


@pytest.fixture(scope="module")
def dp1024():
    """GPT-2 XL, 1,024-way data parallel on DGX H100s: compute-bound (exposed comm ~1%)."""
    scenario = whatif.load(
        None,
        dict(
            model="gpt2-xl",
            cluster="dgx-h100-ib",
            gpus=1024,
            global_batch=8192,
            micro_batch=4,
            seq_len=1024,
            grad_dtype="bf16",
        ),
    )
    setup = resolve(scenario, "test")
    return setup, predict(setup)


def test_one_slow_rank_in_1024_way_data_parallel(dp1024):
    setup, p = dp1024
    assert p.fits and p.parts["exposed_comm_s"] < 0.02 * p.step_time_s  # compute-bound
    step = slow_rank_step(setup, p, 1.2)
    # by hand: forward and backward 20% longer on the slow rank, every replica waits for
    # its gradients; the optimizer (HBM-bound) and what little comm is exposed do not grow
    fwd_bwd = p.parts["forward_s"] + p.parts["backward_s"]
    assert step == pytest.approx(p.step_time_s + 0.2 * fwd_bwd, abs=p.parts["exposed_comm_s"])
    rows = {r.name: r for r in slow_rank(setup, p, 1.2, duration_s=3600)}
    # about 20% slower: all but the optimizer's share (HBM-bound, ~13% of the step) grows
    by_hand = 1 + 0.2 * fwd_bwd / p.step_time_s
    assert 1.15 < by_hand < 1.2
    assert 1 - rows["wait"].throughput == pytest.approx(1 - 1 / by_hand, abs=0.01)
    assert step / p.step_time_s == pytest.approx(by_hand, abs=0.01)
    assert rows["drop"].throughput == pytest.approx(1023 / 1024)
    slow = step / p.step_time_s
    assert rows["rebalance"].throughput == pytest.approx((1023 + 1 / slow) / 1024)
    # local SGD (8 steps a sync) against itself without the straggler: the sync it sends once
    # in 8 no longer dilutes the slow compute, so a persistent straggler costs it more than wait
    saved = p.parts["dp_exposed_s"] * 7 / 8
    assert saved > 0
    by_hand_sgd = (p.step_time_s - saved) / (step - saved)
    assert rows["local-sgd"].throughput == pytest.approx(by_hand_sgd, rel=1e-12)
    assert rows["local-sgd"].throughput < rows["wait"].throughput
    one = {r.name: r for r in slow_rank(setup, p, 1.2, local_steps=1)}
    assert one["local-sgd"].throughput == pytest.approx(one["wait"].throughput)  # H 1: DDP
    assert rows["wait"].lost_s == pytest.approx(3600 * (1 - rows["wait"].throughput))
    for bad in (0.5, float("inf"), float("nan")):  # nan passed a `< 1` check
        with pytest.raises(ValueError, match="must be finite and at least 1"):
            slow_rank_step(setup, p, bad)


def test_a_slow_stage_costs_less_than_all_stages_slow():
    scenario = whatif.load(
        None,
        dict(
            model="gpt3-175b",
            cluster="dgx-a100-ib",
            gpus=1024,
            global_batch=1536,
            seq_len=2048,
            tp=8,
            pp=16,
        ),
    )
    setup = resolve(scenario, "test")
    p = predict(setup)
    one = slow_rank_step(setup, p, 1.5)
    from commsim.reliability.adapter import with_compute_slowed

    every = predict(with_compute_slowed(setup, 1.5), p.strategy)
    # 1F1B with one slow stage: fill and drain run at the others' pace
    assert one == pytest.approx(every.step_time_s - (every.parts["bubble_s"] - p.parts["bubble_s"]))
    assert p.step_time_s < one < every.step_time_s


def _rack_scenario(**strategy):
    # ring all-reduces, as degraded_link finds the groups that cross a link ('auto' may
    # pick another algorithm per bucket, whose flows take other uplinks)
    strategy = {"algorithm": "ring"} | strategy
    spec = make_spec(nodes=8, gpus_per_node=8, nics=8, nodes_per_leaf=2)
    scenario = Scenario.model_validate(
        dict(
            model="llama2-7b",
            cluster=spec.model_dump(),
            gpus=64,
            global_batch=64,
            seq_len=1024,
            strategy=strategy,
        )
    )
    setup = resolve(scenario, "test")
    return setup, predict(setup)


def test_a_degraded_uplink_slows_exactly_the_groups_that_cross_it():
    setup, p = _rack_scenario(tp=8)
    cluster = setup.cluster
    groups = dp_groups(64, 8, 1)  # 8 data-parallel groups: one GPU of each node, one rail
    seen = set()
    for j in range(cluster.spines_per_pod):
        edges = blast_radius(cluster, "leaf uplink", (0, j)).edges
        worse = degraded(cluster, edges, 4.0)
        slowed = [
            i
            for i, g in enumerate(groups)
            if collective_time(worse, g, "all-reduce", "ring", 2.0**28)
            > collective_time(cluster, g, "all-reduce", "ring", 2.0**28) * (1 + 1e-9)
        ]
        report = degraded_link(setup, p, edges, 4.0)
        assert report.crossing["dp"] == slowed, j
        assert report.crossing["tp"] == []  # tensor-parallel traffic stays in the node
        seen.update(slowed)
        if slowed:
            assert report.degraded_step_s > report.healthy_step_s
        else:
            assert report.degraded_step_s == pytest.approx(report.healthy_step_s)
    assert 0 < len(seen) <= len(groups)
    # each group's ring uses one rail and its own uplink: one group per degraded uplink
    assert all(
        len(
            degraded_link(
                setup, p, blast_radius(cluster, "leaf uplink", (0, j)).edges, 4.0
            ).crossing["dp"]
        )
        <= 1
        for j in (0, 1)
    )


def test_group_layout_is_megatrons_order():
    dp = dp_groups(16, 2, 2)  # tp 2, dp 4, pp 2: rank = t + 2 (d + 4 p)
    assert dp.tolist()[0] == [0, 2, 4, 6] and dp.tolist()[1] == [8, 10, 12, 14]
    assert dp.tolist()[2] == [1, 3, 5, 7]
    assert tp_groups(8, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_hierarchical_fallback_is_priced_on_the_degraded_graph():
    setup, p = _rack_scenario(algorithm="ring", grad_dtype="bf16")
    edges = blast_radius(setup.cluster, "leaf uplink", (0, 0)).edges
    r = degraded_link(setup, p, edges, 8.0)
    s = r.sync_s
    assert s["ring_degraded"] > s["ring_healthy"] and s["hierarchical_degraded"] > 0
    recovered = r.hierarchical_recovers
    assert recovered == pytest.approx(
        (s["ring_degraded"] - s["hierarchical_degraded"]) / (s["ring_degraded"] - s["ring_healthy"])
    )


@pytest.mark.parametrize("dist", jt.DISTRIBUTIONS)
@pytest.mark.parametrize("n", [8, 1024])
def test_expected_max_against_monte_carlo(dist, n):
    for h in (1, 4):
        exact = jt.expected_max(n, dist, 0.05, h)
        sim = jt.expected_max_mc(n, dist, 0.05, h, draws=400 if n > 100 else 3000, seed=2)
        assert exact == pytest.approx(sim, abs=0.003), (dist, n, h)


def test_expected_max_closed_forms():
    # exponential: H_N (Renyi); normal: Blom's approximation; both grow with N
    for n in (2, 16, 1024):
        assert jt.expected_max(n, "exponential", 0.1) == pytest.approx(
            1 + 0.1 * (jt.harmonic(n) - 1)
        )
        blom = 1 + 0.1 * jt.blom_normal_max(n)  # Blom's is good to a few hundredths of sigma
        assert jt.expected_max(n, "normal", 0.1) == pytest.approx(blom, abs=0.1 * 0.03)
    assert jt.harmonic(3) == pytest.approx(1 + 1 / 2 + 1 / 3)
    grows = [jt.expected_max(n, "lognormal", 0.05) for n in (8, 64, 1024, 16384)]
    assert grows == sorted(grows) and grows[0] > 1
    assert jt.expected_max(2, "normal", 0.1) == pytest.approx(
        1 + 0.1 / np.sqrt(np.pi)
    )  # 1/sqrt(pi)
    assert jt.expected_max(64, "normal", 0.0) == 1.0
    with pytest.raises(ValueError, match="unknown distribution"):
        jt.expected_max(8, "cauchy", 0.1)


def test_local_sgd_averages_jitter_away(dp1024):
    _, p = dp1024
    sync = jitter(p, "exponential", 0.1)
    local = jitter(p, "exponential", 0.1, local_steps=8)
    assert sync["throughput"] < local["throughput"] < 1.0 + 0.02
    compute = p.parts["compute_s"] - p.parts["optimizer_s"]
    assert sync["step_time_s"] == pytest.approx(
        p.step_time_s + compute * 0.1 * (jt.harmonic(1024) - 1)
    )


@pytest.mark.parametrize("dist", jt.DISTRIBUTIONS)
def test_grouped_jitter_against_monte_carlo(dist):
    # 64 replicas of 16 ranks (tensor x pipeline) meeting every 8 steps; the normal
    # approximation of the 8-step mean is within 5% of the simulated excess over 1 (the
    # exponential's skew is what it misses most)
    exact = jt.expected_max_grouped(64, 16, dist, 0.05, 8)
    sim = jt.expected_max_mc(64, dist, 0.05, 8, draws=300, seed=4, group=16)
    assert exact - 1 == pytest.approx(sim - 1, rel=0.05)
    # every step: the slowest of all 1,024 ranks
    assert jt.expected_max_grouped(64, 16, dist, 0.05) == jt.expected_max(1024, dist, 0.05)
    assert jt.expected_max_grouped(64, 1, dist, 0.05, 8) == jt.expected_max(64, dist, 0.05, 8)


def test_a_spread_that_cannot_be_priced_is_named():
    # jitter.spread_problem: a shifted exponential X = 1 - cv + cv E starts at 1 - cv, so a cv
    # above 1 draws negative compute times; nan and inf spreads are no spread at all
    from commsim.reliability import jitter as jt

    assert jt._frozen("exponential", 1.0).ppf(0.0) == pytest.approx(0.0)
    assert jt._frozen("exponential", 1.5).ppf(0.0) == pytest.approx(-0.5)
    assert jt.spread_problem("exponential", 1.0) == ""
    assert "draws negative times" in jt.spread_problem("exponential", 1.5)
    assert jt.spread_problem("lognormal", 3.0) == ""  # positive whatever its cv
    for cv in (-0.1, float("nan"), float("inf")):
        assert "finite and not negative" in jt.spread_problem("normal", cv)
    with pytest.raises(ValueError, match="finite and not negative"):
        jt.expected_max(8, "normal", float("nan"))


def test_a_normal_spread_that_draws_negative_times_is_refused():
    # X ~ N(1, cv^2) is negative with probability Phi(-1/cv); refused above 1e-4. By hand
    # (normal tables): Phi^-1(1 - 1e-4) = 3.7190, so the largest cv is 1/3.7190 = 0.26889;
    # Phi(-4) = 3.167e-5 (cv 0.25 passes), Phi(-3.3333) = 4.29e-4 (cv 0.3 is refused),
    # Phi(-0.1) = 0.4602 (cv 10 draws a negative time almost every other step)
    assert pytest.approx(1 / 3.7190, rel=1e-4) == jt.MAX_NORMAL_CV
    assert jt.spread_problem("normal", 0.25) == ""
    assert jt.spread_problem("normal", jt.MAX_NORMAL_CV * (1 - 1e-9)) == ""
    assert "probability 0.000429, over 0.0001" in jt.spread_problem("normal", 0.3)
    assert "probability 0.46" in jt.spread_problem("normal", 10.0)
    # the bound as the message states it is accepted; 0.269, just above, is refused
    assert jt.SHOWN_NORMAL_CV == 0.2688 and jt.spread_problem("normal", 0.2688) == ""
    assert "probability 0.000101, over 0.0001 (cv at most 0.2688)" in jt.spread_problem(
        "normal", 0.269
    )
    assert jt.spread_problem("lognormal", 10.0) == ""  # the way out the refusal names
    with pytest.raises(ValueError, match="draws a negative time"):
        jt.expected_max(8, "normal", 10.0)
    # Monte Carlo: the share of negative draws is Phi(-1/cv) (4e6 draws at cv 0.3: ~1,716
    # negatives, sd 41), and at the bound the negative tail E[X^-] is the comment's 6.4e-6
    rng = np.random.default_rng(11)
    x = rng.normal(1.0, 0.3, 4_000_000)
    assert (x < 0).mean() == pytest.approx(4.29e-4, rel=0.1)
    tail = np.maximum(-rng.normal(1.0, jt.MAX_NORMAL_CV, 4_000_000), 0.0).mean()
    assert tail == pytest.approx(6.4e-6, rel=0.3)


def test_grouped_local_sgd_needs_the_standard_normal_maximum_not_a_refused_spread():
    # expected_max_grouped's E[max of standard normals] (cv 1 would be refused as a spread)
    # by quadrature against a simulation (20,000 maxima: standard error about 0.003) and
    # Blom's approximation (within 0.03 here)
    rng = np.random.default_rng(5)
    for n in (16, 256):
        simulated = rng.standard_normal((20_000, n)).max(axis=1).mean()
        assert jt._mean_max(n, stats.norm()) == pytest.approx(simulated, abs=0.015)
        assert jt._mean_max(n, stats.norm()) == pytest.approx(jt.blom_normal_max(n), abs=0.03)
    assert jt.expected_max_grouped(64, 8, "normal", 0.05, 8) > 1.0


def test_local_sgd_over_100_percent_is_the_saved_sync(dp1024):
    # local SGD against the synchronous step without jitter: H steps of a timeline take
    # H (step - dp sync exposed) + one sync, plus each step's wait for the slowest rank; so
    # with no jitter at all it is over 100% by exactly the sync it sends H - 1 times less,
    # and against local SGD without jitter it is 100%
    _, p = dp1024
    dp_sync = p.parts["dp_exposed_s"]
    assert dp_sync > 0
    h = 8
    calm = jitter(p, "normal", 0.0, local_steps=h)
    timeline = (h * (p.step_time_s - dp_sync) + dp_sync) / h
    assert calm["step_time_s"] == pytest.approx(timeline)
    assert calm["saved_sync_s"] == pytest.approx(dp_sync * (h - 1) / h)
    assert calm["throughput"] == pytest.approx(p.step_time_s / timeline) and calm["throughput"] > 1
    assert calm["throughput_same_schedule"] == pytest.approx(1.0)
    noisy = jitter(p, "lognormal", 0.1, local_steps=h)
    assert noisy["throughput_same_schedule"] == pytest.approx(timeline / noisy["step_time_s"])
    assert noisy["step_time_s"] == pytest.approx(timeline + noisy["jitter_s"])
    assert noisy["throughput"] == pytest.approx(p.step_time_s / noisy["step_time_s"])
    assert noisy["throughput_same_schedule"] < 1  # here (~1% exposed sync) jitter outweighs it
    sync = jitter(p, "lognormal", 0.1)
    assert sync["saved_sync_s"] == 0 and sync["throughput_same_schedule"] == sync["throughput"]
