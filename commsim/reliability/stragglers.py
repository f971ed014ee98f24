"""Stragglers: a slow rank, a degraded link, per-rank jitter, and what each mitigation wins.

A synchronous step waits for its slowest rank in every group: a tensor-parallel group
all-reduces inside every layer, a pipeline runs at its slowest stage, and the data-parallel
gradient sync waits for every replica. So one rank computing k times slower slows its whole
tensor-parallel group and its stage, and through the gradient sync every replica: the step
is the one commsim predicts with every GPU k times slower, except that a pipeline's fill
and drain still run at the other stages' pace (1F1B with one slow stage: (m - 1) slow ticks +
the sum of every stage's tick, Narayanan et al. 2021, Sec. 2.2): the slowed prediction less
the growth of its bubble.

A degraded link carries 1/k of its bandwidth: the step is re-predicted on the changed graph,
and exactly the groups whose flows cross the link get slower (which they are: the routes of
each group's collective). Fail-slow episodes last from tens of seconds to about ten hours and
slowed the average job 1.34x in a 10,000-GPU fleet (Falcon, Wu et al. 2024, arXiv:2410.12588).

Mitigations, each as the throughput it leaves (relative to the healthy step):
  wait        the synchronous job runs at the straggler's pace
  drop        drop the slow replica (TorchFT-style): (dp - 1) / dp, the global batch shrinks
  rebalance   re-plan the work: the slow replica gets a share in proportion to its speed
              (Malleus, Li et al. 2024, arXiv:2410.13333, re-plans per GPU): (dp - 1 + 1/k) / dp
  async       asynchronous SGD: no replica waits, the same (dp - 1 + 1/k) / dp, with stale
              gradients (the convergence cost is not modelled)
  local-sgd   H local steps between syncs: a persistent straggler still holds every sync, and
              its slow compute is a larger share of local SGD's shorter step (the sync is
              sent once in H steps), so against local SGD without it:
              (healthy - saved) / (slowed - saved); jitter averages over the H steps
  hierarchical  seed 002's fallback when an inter-rack link degrades: the gradient sync as a
              hierarchical all-reduce (intra-node reduce-scatter, inter-node all-reduce per
              rail, intra-node all-gather) on the degraded graph
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from commsim.reliability.adapter import (
    collective_time,
    degraded,
    group_edges,
    predict_step,
    with_cluster,
    with_compute_slowed,
)
from commsim.reliability.jitter import expected_max_grouped
from commsim.scenario import Setup
from commsim.step.prediction import Prediction
from commsim.topology.build import Cluster


@dataclass(frozen=True)
class Mitigation:
    """What a mitigation leaves of the healthy throughput, and how long the episode costs."""

    name: str
    throughput: float  # relative to the healthy step
    lost_s: float | None  # seconds of work lost over the episode (duration x (1 - throughput))
    note: str = ""


def _episode(throughput: float, duration_s: float | None) -> float | None:
    return None if duration_s is None else duration_s * (1.0 - throughput)


def slower_problem(factor: float) -> str:
    """Why `factor` cannot slow a rank or a link down (k times slower: finite, at least 1),
    or "" when it can."""
    return "" if 1.0 <= factor < math.inf else "a slowdown factor must be finite and at least 1"


def _check_slower(what: str, factor: float) -> None:
    problem = slower_problem(factor)
    if problem:
        raise ValueError(f"{what} factor {factor}: {problem}")


def slow_rank_step(setup: Setup, prediction: Prediction, factor: float) -> float:
    """Step time with one rank computing `factor` times slower (module docstring)."""
    _check_slower("a straggler's", factor)
    slowed = predict_step(with_compute_slowed(setup, factor), prediction.strategy)
    growth = slowed.parts.get("bubble_s", 0.0) - prediction.parts.get("bubble_s", 0.0)
    return slowed.step_time_s - growth


def saved_sync_s(prediction: Prediction, local_steps: int) -> float:
    """Seconds a step local SGD saves by sending the data-parallel sync once in
    `local_steps` steps: its exposed time on the other H - 1."""
    dp_exposed = prediction.parts.get("dp_exposed_s", prediction.parts["exposed_comm_s"])
    return dp_exposed * (1.0 - 1.0 / local_steps)


def slow_rank(
    setup: Setup,
    prediction: Prediction,
    factor: float,
    duration_s: float | None = None,
    local_steps: int = 8,
) -> list[Mitigation]:
    """One rank `factor` times slower for `duration_s`: each mitigation's throughput
    (local SGD's against local SGD every `local_steps` steps without the straggler)."""
    healthy = prediction.step_time_s
    step = slow_rank_step(setup, prediction, factor)
    saved = saved_sync_s(prediction, local_steps)
    local = (healthy - saved) / (step - saved)
    dp = (prediction.layout or {}).get("dp", setup.n_gpus)
    slow = step / healthy  # the slow replica's own slowdown
    shared = (dp - 1 + 1.0 / slow) / dp
    rows = [
        Mitigation("wait", healthy / step, None, "every group waits for the slowest rank"),
        Mitigation("drop", (dp - 1) / dp, None, "the slow replica leaves; the batch shrinks"),
        Mitigation("rebalance", shared, None, "work in proportion to each replica's speed"),
        Mitigation("async", shared, None, "no waiting; gradients go stale"),
        Mitigation("local-sgd", local, None, "holds every sync; against local SGD without it"),
    ]
    if dp < 2:
        rows = [r for r in rows if r.name in ("wait", "local-sgd")]
    return [
        Mitigation(r.name, r.throughput, _episode(r.throughput, duration_s), r.note) for r in rows
    ]


def dp_groups(gpus: int, tp: int, pp: int) -> np.ndarray:
    """GPUs of each data-parallel group (one row per tensor rank and stage), ranks in
    Megatron's order (tensor-parallel fastest, then data-parallel, then pipeline) placed
    blocked, as commsim.step.groups lays them out."""
    dp = gpus // (tp * pp)
    t, d, p = np.meshgrid(np.arange(tp), np.arange(dp), np.arange(pp), indexing="ij")
    ranks = t + tp * (d + dp * p)  # [tp, dp, pp]
    return ranks.transpose(0, 2, 1).reshape(tp * pp, dp)


def tp_groups(gpus: int, tp: int) -> np.ndarray:
    """GPUs of each tensor-parallel group: tp consecutive ranks."""
    return np.arange(gpus).reshape(-1, tp)


@dataclass(frozen=True)
class LinkReport:
    """A degraded link: the step before and after, which groups' traffic crosses it, and
    the gradient sync by ring and by the hierarchical fallback, healthy and degraded."""

    factor: float
    edges: tuple[str, ...]
    healthy_step_s: float
    degraded_step_s: float
    crossing: dict[str, list[int]]  # group kind -> indices of the groups whose flows cross
    sync_s: dict[str, float]  # ring/hierarchical x healthy/degraded

    @property
    def hierarchical_recovers(self) -> float | None:
        """Share of the ring's slowdown the hierarchical fallback wins back (may exceed 1
        when hierarchical is also faster on the healthy graph)."""
        lost = self.sync_s["ring_degraded"] - self.sync_s["ring_healthy"]
        if lost <= 0:
            return None
        return (self.sync_s["ring_degraded"] - self.sync_s["hierarchical_degraded"]) / lost


def crossing_groups(cluster: Cluster, groups: np.ndarray, edges, op: str, algorithm: str):
    """Indices of the groups whose `op` flows cross any of `edges`."""
    edges = set(np.asarray(edges).tolist())
    return [
        i
        for i, g in enumerate(groups)
        if edges & set(group_edges(cluster, g, op, algorithm).tolist())
    ]


def degraded_link(
    setup: Setup, prediction: Prediction, edges, factor: float, sync_bytes: float | None = None
) -> LinkReport:
    """The step with `edges` (directed edge ids) at 1/factor of their bandwidth."""
    _check_slower("a degraded link's", factor)
    edges = np.atleast_1d(np.asarray(edges, dtype=np.int64))
    cluster = setup.cluster
    worse = degraded(cluster, edges, factor)
    after = predict_step(with_cluster(setup, worse), prediction.strategy)
    s = prediction.strategy
    dps = dp_groups(setup.n_gpus, s.tp, s.pp)
    crossing = {"dp": crossing_groups(cluster, dps, edges, "all-reduce", "ring")}
    if s.tp > 1:
        tps = tp_groups(setup.n_gpus, s.tp)
        crossing["tp"] = crossing_groups(cluster, tps, edges, "all-reduce", "ring")
    size = sync_bytes or 2.0**28
    group = dps[crossing["dp"][0]] if crossing["dp"] else dps[0]
    sync = {}
    for alg in ("ring", "hierarchical"):
        for label, c in (("healthy", cluster), ("degraded", worse)):
            sync[f"{alg}_{label}"] = collective_time(c, group, "all-reduce", alg, size)
    return LinkReport(
        factor,
        tuple(cluster.names[i] for i in edges),
        prediction.step_time_s,
        after.step_time_s,
        crossing,
        sync,
    )


def jitter(prediction: Prediction, dist: str, cv: float, local_steps: int = 1) -> dict:
    """Step time and throughput with per-rank compute jitter: each step's compute waits for
    the slowest rank of every tensor/pipeline group, and the data-parallel replicas wait for
    each other once every local_steps (jitter.expected_max_grouped); local SGD also sends
    the data-parallel sync once in H steps, which saves its exposed time on the other H - 1.
    `throughput` is against the synchronous step without jitter, so local SGD's saved sync
    can lift it over 1; `throughput_same_schedule` is against the same schedule (sync or
    local SGD) without jitter: what jitter alone costs."""
    s = prediction.strategy
    dp = (prediction.layout or {}).get("dp", 1)
    compute = prediction.parts["compute_s"] - prediction.parts.get("optimizer_s", 0.0)
    factor = expected_max_grouped(dp, s.tp * s.pp, dist, cv, local_steps)
    waited = compute * (factor - 1.0)  # the compute the slowest rank adds
    saved = saved_sync_s(prediction, local_steps)
    step = prediction.step_time_s + waited - saved
    return {
        "expected_max": factor,
        "step_time_s": step,
        "throughput": prediction.step_time_s / step,
        "jitter_s": waited,
        "saved_sync_s": saved,
        "throughput_same_schedule": (prediction.step_time_s - saved) / step,
    }
