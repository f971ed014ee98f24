"""Goodput of a run under failures: the analytical model against a Monte-Carlo simulation of
the same run, the badput breakdown, checkpoint sizes and times by hand, the recovery
strategies side by side, and spare nodes against the queueing formula and a simulation."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import poisson

from commsim import catalog, whatif
from commsim.reliability import checkpoint as ck
from commsim.reliability.adapter import job_state
from commsim.reliability.goodput import (
    analytical_goodput,
    best_checkpoint_interval,
    best_spares,
    expected_goodput,
    model_for,
)
from commsim.reliability.montecarlo import simulate
from commsim.reliability.rates import rates_for
from commsim.reliability.recovery import Policy, nccl_init_s
from commsim.reliability.spares import nodes_out_pmf, p_full_size, spare_row, spares_for
from commsim.scenario import resolve
from commsim.spec_io import load_spec
from commsim.specs import ClusterSpec
from commsim.step.predict import predict

DAY = 86400.0


def gpt3(gpus: int, **changes):
    """GPT-3 175B, tp 8 x pp 16, on DGX H100s grown to `gpus`; (prediction, setup)."""
    spec = load_spec(ClusterSpec, catalog.topology_path("dgx-h100-ib"))
    spec = spec.model_copy(update={"nodes": max(spec.nodes, gpus // 8)})
    fields = (
        dict(
            model="gpt3-175b",
            gpus=gpus,
            global_batch=1536,
            seq_len=2048,
            tp=8,
            pp=16,
            tokens=300e9,
            price_per_gpu_hour=2.0,
        )
        | changes
    )
    scenario = whatif.load(None, fields).model_copy(update={"cluster": spec})
    setup = resolve(scenario, "test")
    return predict(setup), setup


@pytest.fixture(scope="module")
def jobs():
    return {n: gpt3(n) for n in (4096, 16384, 32768)} | {"zero1": gpt3(16384, zero=1)}


@pytest.mark.parametrize("gpus", [4096, 16384, 32768])
def test_monte_carlo_agrees_with_the_analytical_goodput(jobs, gpus):
    prediction, setup = jobs[gpus]
    for policy in (Policy("cold"), Policy("in-memory", async_save=True)):
        m = model_for(prediction, setup, policy)
        good, _ = analytical_goodput(m)
        sim = simulate(m, 20 * DAY, runs=6, seed=7)
        assert sim.failures > 100
        assert abs(sim.goodput - good) < 0.02, (policy.strategy, good, sim.goodput)


def test_monte_carlo_agrees_when_failures_dominate(jobs):
    # thirty times the failure rates at 16,384 GPUs: a failure every 6 minutes, restarts
    # themselves interrupted; goodput far from 1, and the model still matches
    prediction, setup = jobs[16384]
    rates = rates_for(setup.cluster.spec).scaled(30)
    for strategy in ("cold", "in-memory", "per-step"):
        m = model_for(prediction, setup, Policy(strategy), rates)
        good, bad = analytical_goodput(m)
        sim = simulate(m, 2 * DAY, runs=1, seed=3)
        assert abs(sim.goodput - good) < 0.02, (strategy, good, sim.goodput)
        if strategy != "per-step":  # same categories: each within 2 points
            for key, share in bad.items():
                assert abs(sim.badput.get(key, 0.0) - share) < 0.02, key
    assert good > 0.5  # per-step recovery keeps most of it


def test_badput_accounts_for_the_rest_of_the_wall_time(jobs):
    prediction, setup = jobs[16384]
    for strategy in ("cold", "hot-spare", "in-memory", "per-step"):
        r = expected_goodput(prediction, setup, Policy(strategy))
        assert r.goodput + sum(r.badput.values()) == pytest.approx(1.0, abs=1e-9)
        assert all(v >= 0 for v in r.badput.values())
    cold = expected_goodput(prediction, setup, Policy("cold"))
    assert 0.9 < cold.goodput < 0.99  # Llama 3 kept "more than 90%" at this scale
    assert cold.time_to_train_s == pytest.approx(cold.ideal_time_to_train_s / cold.goodput)
    assert cold.cost == pytest.approx(cold.gpu_hours * 2.0)
    assert cold.mtti_s / 3600 == pytest.approx(3.1, abs=0.1)


def test_checkpoint_size_and_times_by_hand(jobs):
    prediction, setup = jobs[16384]
    job = job_state(prediction, setup)
    mem = prediction.memory
    # ZeRO 0: weights and optimizer replicated over dp = 128: written once
    assert job.held_bytes == mem.params + mem.optimizer
    assert job.unique_bytes == pytest.approx(setup.workload.params * 14)  # 2 + 12 B a param
    assert job.unique_bytes == pytest.approx(175e9 * 14, rel=0.01)
    # the fullest stage (embedding on the first) holds a little more than an even share
    assert job.unique_bytes / 128 < job.held_bytes < 1.1 * job.unique_bytes / 128
    m = model_for(prediction, setup, Policy("cold"))
    assert m.costs.stall_s == pytest.approx(job.unique_bytes / 2e12)  # Tectonic's 2 TB/s
    assert m.costs.lag_s == 0.0
    load = job.unique_bytes / 2e12 + job.held_bytes * 127 / 128 / 50e9  # 8 x 400G a node
    assert m.costs.load_s == pytest.approx(load)
    hw = m.costs.restart["gpu"]
    assert hw["initialization"] == pytest.approx(265 * 16384 / 96000)
    assert sum(hw.values()) == pytest.approx(10 + 300 + nccl_init_s(16384) + load + 60)
    assert m.costs.restart["software"]["reschedule"] == 0.0  # the node is fine
    asyn = model_for(prediction, setup, Policy("cold", async_save=True)).costs
    assert asyn.stall_s == pytest.approx(job.unique_bytes / 16384 / 64e9)  # PCIe 5 share
    assert asyn.lag_s == pytest.approx(job.unique_bytes / 2e12)
    zero1 = job_state(*jobs["zero1"])  # optimizer states sharded over dp
    assert zero1.unique_bytes == job.unique_bytes
    assert zero1.held_bytes < job.held_bytes / 5


def test_checkpoint_size_follows_the_states_kept(jobs):
    """bf16 Adam moments save 2 x 2 bytes a parameter (2 + 4 + 4 = 10 B); FSDP's fp32 shards
    are the master weights (4 + 8 = 12 B); the held share follows the memory model."""
    prediction, setup = jobs[16384]
    strategy = prediction.strategy
    for changes, per_param in (
        ({"optimizer_moments": "bf16"}, 10),
        ({"states": "fsdp", "zero": 3}, 12),
    ):
        other = strategy.model_copy(update=changes)
        job = job_state(predict(setup, other), setup)
        assert job.unique_bytes == pytest.approx(setup.workload.params * per_param)


def test_checkpoint_interval_search(jobs):
    prediction, setup = jobs[16384]
    best = best_checkpoint_interval(prediction, setup, Policy("cold"))
    assert best["optimal_s"] == pytest.approx(best["daly_s"], rel=0.05)
    assert best["young_s"] == pytest.approx(math.sqrt(2 * best["stall_s"] * best["mtti_s"]))
    m = model_for(prediction, setup, Policy("cold"))
    at = {t: analytical_goodput(replace(m, interval_s=t))[0] for t in (60, m.interval_s, 3600)}
    assert at[m.interval_s] > at[60] and at[m.interval_s] > at[3600]
    with pytest.raises(ValueError, match="no periodic checkpoints"):
        best_checkpoint_interval(prediction, setup, Policy("per-step"))


def test_strategies_side_by_side(jobs):
    prediction, setup = jobs[32768]
    good = {
        s: expected_goodput(prediction, setup, Policy(s)).goodput
        for s in ("cold", "hot-spare", "in-memory", "per-step")
    }
    # spares remove rescheduling; peer memory cheapens checkpoints; per-step avoids restarts
    assert good["cold"] < good["hot-spare"] < good["in-memory"] < good["per-step"]
    hot = expected_goodput(prediction, setup, Policy("hot-spare"))
    assert hot.badput["reschedule"] < 0.001 and hot.spares > 0
    assert hot.gpu_hours == pytest.approx(hot.time_to_train_s * (32768 + hot.spares * 8) / 3600)
    with pytest.raises(ValueError, match="ring rebuild drops a node"):
        expected_goodput(prediction, setup, Policy("ring-rebuild"))
    with pytest.raises(ValueError, match="ZeRO stage 1"):
        expected_goodput(*jobs["zero1"], Policy("per-step"))


def test_per_step_loss_by_hand(jobs):
    # one failure: detection + the step in flight + a quorum change over the dp ranks, and
    # a quorum change when the replacement joins; 1 replica of 256 out meanwhile
    prediction, setup = jobs[32768]
    m = model_for(prediction, setup, Policy("per-step", spares=1000))
    init = 265 * 256 / 96000
    assert sum(m.costs.stall["gpu"].values()) == pytest.approx(10 + prediction.step_time_s + init)
    assert m.costs.rejoin_s == pytest.approx(init)
    shares = {part: share for part, _, _, share in m.events}
    assert shares["gpu"] == pytest.approx(1 / 256) and shares["software"] == pytest.approx(1 / 256)
    assert shares["leaf"] == pytest.approx(32 / 256)  # a rail leaf: 32 nodes, one replica each
    good, _ = analytical_goodput(m)
    stall = sum(rate * (sum(m.costs.stall[c].values()) + init) for _, c, rate, _ in m.events)
    assert 1 - good == pytest.approx(stall, rel=0.05)  # first order: the stalls dominate


def test_spares_by_hand():
    # one kind of failure, one node each: nodes out is Poisson(rate x repair)
    repairs = [(0.2 / 3600, 1.0, 72 * 3600)]  # 0.2 node failures an hour, 72 h repair
    pmf = nodes_out_pmf(repairs)
    assert pmf[:20] == pytest.approx(poisson.pmf(np.arange(20), 14.4))
    need = spares_for(repairs, 2048, 0.999)
    # spares fail too: the mean grows with (2048 + s) / 2048
    assert poisson.cdf(need, 14.4 * (2048 + need) / 2048) >= 0.999
    assert poisson.cdf(need - 1, 14.4 * (2047 + need) / 2048) < 0.999
    # more nodes out on average than the job has: refused at once (goodput --rate-scale 1e5
    # searched spares one by one over ~92,000 nodes' distributions for over half an hour)
    with pytest.raises(ValueError, match="keep 14 nodes out of service on average"):
        spares_for(repairs, 14, 0.999)
    row = spare_row(repairs, 2048, 0, 1 / 256)
    assert row.p_full == pytest.approx(math.exp(-14.4))
    assert row.nodes_short == pytest.approx(14.4)
    assert row.capacity == pytest.approx(1 - 14.4 / 256)


def test_full_size_without_spares_needs_no_distribution():
    # two kinds, a leaf taking 4 nodes out: P(X = 0) = exp(-sum of rate x repair)
    repairs = [(0.1 / 3600, 1.0, 72 * 3600.0), (0.05 / 3600, 4.0, 6 * 3600.0)]
    assert p_full_size(repairs, 512, 0) == pytest.approx(math.exp(-(7.2 + 0.3)), rel=1e-12)
    assert p_full_size(repairs, 512, 0) == pytest.approx(nodes_out_pmf(repairs)[0], rel=1e-12)
    with_two = nodes_out_pmf(repairs, 514 / 512)[:3].sum()  # the spares fail too
    assert p_full_size(repairs, 512, 2) == pytest.approx(with_two, rel=1e-12)


def test_nodes_out_match_a_simulated_repair_queue():
    # two kinds: single nodes (72 h) and a leaf of 4 nodes (6 h); count nodes out at
    # random moments of a long simulated history
    repairs = [(0.1 / 3600, 1.0, 72 * 3600.0), (0.05 / 3600, 4.0, 6 * 3600.0)]
    rng = np.random.default_rng(5)
    horizon = 2e5 * 3600
    probes = rng.uniform(1e3 * 3600, horizon, 4000)
    out = np.zeros(probes.size)
    for rate, batch, repair in repairs:
        t = np.sort(rng.uniform(0, horizon, rng.poisson(rate * horizon)))
        lo = np.searchsorted(t, probes - repair)
        out += batch * (np.searchsorted(t, probes) - lo)
    pmf = nodes_out_pmf(repairs)
    for s in (3, 7, 12):
        assert np.mean(out <= s) == pytest.approx(pmf[: s + 1].sum(), abs=0.03)


def test_spare_count_search(jobs):
    prediction, setup = jobs[16384]
    best = best_spares(prediction, setup, Policy("hot-spare"), 80)
    cost = (16384 + best.spares * 8) / (16384 * best.goodput)
    for s in (0, 80):
        r = expected_goodput(prediction, setup, Policy("hot-spare", spares=s))
        assert cost <= (16384 + s * 8) / (16384 * r.goodput) + 1e-12
    assert 0 < best.spares < 80
    assert best_spares(prediction, setup).spares == best.spares  # default range covers it


def test_no_failures_no_badput(jobs):
    prediction, setup = jobs[4096]
    m = model_for(prediction, setup, Policy("cold"), rates_for(setup.cluster.spec).scaled(0))
    assert analytical_goodput(m) == (1.0, {})
    assert simulate(m, DAY, runs=1).goodput == 1.0
    assert ck.goodput(100.0, 1.0, 0.0, 1e15, [(1.0, 60.0)]) == pytest.approx(100 / 101)


def test_nodes_out_equal_the_dense_convolution():
    # kinds that take 1, 4 and 64 nodes out at once: the sparse sum of shifted copies
    # gives what a convolution with the whole (mostly zero) kernel gives
    repairs = [(2.0 / 3600, 1.0, 10 * 3600.0), (0.3 / 3600, 4.0, 6 * 3600.0)]
    repairs += [(0.01 / 3600, 64.0, 24 * 3600.0)]
    n = nodes_out_pmf(repairs).size - 1
    pmf = np.zeros(n + 1)
    pmf[0] = 1.0
    for rate, b, repair_s in repairs:
        k = np.arange(n // int(b) + 1)
        kernel = np.zeros(n + 1)
        kernel[k * int(b)] = poisson.pmf(k, rate * repair_s)
        pmf = np.convolve(pmf, kernel)[: n + 1]
    assert nodes_out_pmf(repairs) == pytest.approx(pmf, rel=1e-12, abs=1e-300)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)


def test_a_strategy_ignores_exactly_the_fields_it_is_said_not_to_use(jobs):
    # recovery.UNUSED is what `plan --gpus LOW:HIGH` and `goodput` refuse as an ignored flag:
    # changing such a field leaves the strategy's report as it was, any other field moves it
    from commsim.reliability.recovery import STRATEGIES, UNUSED

    prediction, setup = jobs[4096]
    changes = dict(interval_s=3600.0, async_save=True, spares=5, spare_target=0.5)
    for strategy in STRATEGIES:
        if strategy == "ring-rebuild":  # tp x pp = 128 spans nodes: priced like per-step
            continue
        base = expected_goodput(prediction, setup, Policy(strategy)).to_dict()
        for name, value in changes.items():
            moved = expected_goodput(prediction, setup, Policy(strategy, **{name: value}))
            same = moved.to_dict() == base
            assert same == (name in UNUSED[strategy] if strategy in UNUSED else False), name


def test_simulation_progress_changes_no_draw(jobs):
    # `goodput --monte-carlo N` drives a progress bar from simulate's `done`: told every
    # RUNS_PER_REPORT runs and at the end, adding up to N; the runs draw one after another
    # from one generator, so the figures are those of a silent run with the same seed
    from commsim.reliability.montecarlo import RUNS_PER_REPORT

    prediction, setup = jobs[4096]
    rates = rates_for(setup.cluster.spec).scaled(30)  # failures in every run
    for strategy in ("cold", "per-step"):
        m = model_for(prediction, setup, Policy(strategy), rates)
        told: list[int] = []
        runs = 2 * RUNS_PER_REPORT + 7
        watched = simulate(m, DAY / 4, runs=runs, seed=5, done=told.append)
        assert watched == simulate(m, DAY / 4, runs=runs, seed=5)
        assert told == [RUNS_PER_REPORT, RUNS_PER_REPORT, 7] and watched.failures > runs
    told = []
    simulate(m, DAY / 4, runs=RUNS_PER_REPORT, seed=5, done=told.append)
    assert told == [RUNS_PER_REPORT]
