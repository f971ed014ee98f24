"""Spare nodes: how many keep the job at full size, and what running smaller costs instead.

Failed parts are repaired in parallel, each out of service for the repair time T_k. Failures
of kind k arrive as a Poisson process of rate lambda_k, each taking b_k nodes out (one for a
GPU, a NIC or a host; every node under a leaf for a leaf switch). The number of kind-k
failures under repair at any moment is then Poisson with mean lambda_k T_k, whatever the
repair time's distribution (the M/G/infinity queue, Palm's theorem; Kleinrock, Queueing
Systems vol. 1, 1975), so the nodes out are a compound Poisson sum X = sum_k b_k N_k. A job
with s warm spares runs at full size while X <= s, and a failure finds no free spare with
probability P(X > s) (Poisson arrivals see time averages, Wolff 1982). Spares are powered
and fail like the job's own nodes: with s of them the rates grow by (nodes + s) / nodes.

Running smaller instead: an elastic job (per-step fault tolerance) loses the replicas of the
nodes it is short of, E[(X - s)+] nodes on average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import poisson

# (failures per second, nodes out per failure, seconds out of service) of each kind
Repairs = list[tuple[float, float, float]]


def _support(repairs: Repairs, scale: float) -> int:
    mean = sum(r * b * t * scale for r, b, t in repairs)
    var = sum(r * b * b * t * scale for r, b, t in repairs)
    biggest = max((b for _, b, _ in repairs), default=1.0)
    return int(mean + 12.0 * math.sqrt(var) + 4 * biggest) + 8


def nodes_out_pmf(repairs: Repairs, scale: float = 1.0) -> np.ndarray:
    """P(X = x) for x = 0, 1, ...: nodes out of service at a random moment (X above), the
    failure rates multiplied by `scale`. Batch sizes are rounded to whole nodes."""
    n = _support(repairs, scale)
    pmf = np.zeros(n + 1)
    pmf[0] = 1.0
    for rate, batch, repair_s in repairs:
        b = max(1, round(batch))
        weights = poisson.pmf(np.arange(n // b + 1), rate * repair_s * scale)
        pmf = _convolve(pmf, np.trim_zeros(weights, "b"), b)
    return pmf


def _convolve(pmf: np.ndarray, weights: np.ndarray, b: int) -> np.ndarray:
    """pmf convolved with weights[k] at k x b, cut to pmf's length. The weights' tail
    (underflowed to 0) is left out; a kind that takes b > 1 nodes out at once adds its few
    shifted copies rather than a convolution with a kernel that is mostly zeros (O(n^2)
    at 131,072 GPUs, where a plane's switch takes thousands of nodes out)."""
    if b == 1:
        return np.convolve(pmf, weights)[: pmf.size]
    out = np.zeros(pmf.size)
    for k in np.flatnonzero(weights).tolist():
        if k * b < pmf.size:
            out[k * b :] += weights[k] * pmf[: pmf.size - k * b]
    return out


@dataclass(frozen=True)
class SpareRow:
    """The job with `spares` warm spare nodes."""

    spares: int
    p_full: float  # probability the job is at full size (X <= spares)
    nodes_short: float  # E[(X - spares)+]
    capacity: float  # elastic job: share of the replicas it keeps, on average
    cost_factor: float  # (GPUs + spare GPUs) / (GPUs x capacity): paid per useful GPU-hour


def spare_row(repairs: Repairs, nodes: int, spares: int, lost_per_node: float) -> SpareRow:
    """One row of the trade-off: `lost_per_node` is the share of the job's capacity one
    missing node costs an elastic job (its replicas / dp)."""
    pmf = nodes_out_pmf(repairs, (nodes + spares) / nodes)
    x = np.arange(pmf.size)
    short = float((pmf * np.maximum(x - spares, 0)).sum())
    capacity = max(0.0, 1.0 - short * lost_per_node)
    return SpareRow(
        spares=spares,
        p_full=float(pmf[: spares + 1].sum()),
        nodes_short=short,
        capacity=capacity,
        cost_factor=(nodes + spares) / (nodes * capacity) if capacity > 0 else math.inf,
    )


def p_full_size(repairs: Repairs, nodes: int, spares: int) -> float:
    """P(X <= spares), the spares failing like the job's nodes. Without spares that is
    P(X = 0) = exp(-sum_k lambda_k T_k), every kind's Poisson count at 0: no distribution
    to build (it spans tens of thousands of nodes at 131,072 GPUs)."""
    if spares == 0:
        return math.exp(-sum(rate * repair_s for rate, _, repair_s in repairs))
    return float(nodes_out_pmf(repairs, (nodes + spares) / nodes)[: spares + 1].sum())


def spares_for(repairs: Repairs, nodes: int, target: float) -> int:
    """The fewest spares that keep the job at full size with probability `target`; a
    ValueError where the nodes out of service outnumber the job's on average (each spare
    then fails as often as it helps, and the search would span all of those nodes)."""
    out = sum(r * b * t for r, b, t in repairs)
    if out >= nodes:
        raise ValueError(
            f"failures keep {out:,.0f} nodes out of service on average (rate x nodes x repair "
            f"time), more than the job's {nodes:,}: no spare count keeps it at full size "
            "(are the failure rates, or --rate-scale, this high?)"
        )
    spares, most = 0, _support(repairs, 1.0)
    while p_full_size(repairs, nodes, spares) < target and spares <= most:
        spares += 1
    return spares


def tradeoff(repairs: Repairs, nodes: int, lost_per_node: float, most: int) -> list[SpareRow]:
    """Rows for 0..most spares: the cheapest per useful GPU-hour is where spares pay."""
    return [spare_row(repairs, nodes, s, lost_per_node) for s in range(most + 1)]
