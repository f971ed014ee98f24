"""The evaluators that read an algorithm: the closed form on uniform links, and the graph.

Closed form: a message of m bytes costs alpha + m / B, where alpha (seconds) is the
per-step latency and B (bytes/s) the bandwidth of one GPU per direction; when several
messages leave (or enter) one GPU at once they share its B, and the GPU handles them one
after another, each costing it a per-message overhead o (alpha_with_fanin). Sizes follow
nccl-tests: S is the bytes of the full buffer per rank (all-gather: output;
reduce-scatter: input; all-to-all: bytes each rank sends in total). Each algorithm's
closed form is its schedule collapsed on uniform links, as terms (algorithms/base.py);
the tests check the two against each other on the graph. The closed-form functions
broadcast over numpy arrays of group sizes, sizes, alphas and bandwidths.

Graph: each step's flows are routed on the cluster graph and share links max-min fairly;
a step ends with its slowest flow. Routed on a uniform network every schedule costs
exactly its closed form; on a real fabric the graph shows what the closed form cannot:
shared links, oversubscription, and what a rank order does to them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commsim.collectives.algorithms import build_schedule, lookup
from commsim.collectives.algorithms.base import (
    Rounds,
    Schedule,
    Step,
    Term,
    pipeline_chunks,
    pipeline_time,
)
from commsim.topology.build import Cluster
from commsim.topology.routing import alpha_with_fanin, grid_step_time
from commsim.topology.routing import step_time as routed_step_time

StepTimeFn = Callable[..., float]
Link = tuple[np.ndarray, np.ndarray, np.ndarray]  # alpha, bandwidth, per-message overhead


def collective_time(
    op: str,
    algorithm: str,
    n,
    size,
    alpha,
    bandwidth,
    *,
    ps_shards=1,
    chunks=None,
    overhead=None,
) -> np.ndarray:
    """Seconds for `op` by a flat `algorithm` over n ranks on uniform links; broadcasts.

    alpha: seconds per step; bandwidth: bytes/s per GPU per direction; ps_shards: servers
    of "ps" (1 <= k <= n); chunks: pipeline depth of the pipelined algorithms (default:
    pipeline_chunks' optimum); overhead: LogP's per-message o that a rank pays for each
    further peer in a step (alpha_with_fanin; default alpha / 2, right when alpha has no
    switch/cable part). A group of one costs 0. A two-tier algorithm ("hierarchical")
    needs both link tiers: see hierarchical_time.
    """
    alg = lookup(op, algorithm)
    if alg.two_tier:
        raise ValueError(f"{algorithm} needs intra- and inter-node links: use hierarchical_time")
    n = _group_sizes(n)
    size = _sizes(size)
    link = _link(alpha, bandwidth, overhead)
    shards = np.asarray(ps_shards)
    alg.check(n, ps_shards=shards)
    if chunks is not None and np.any(np.asarray(chunks) < 1):
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    terms = alg.forms[op].terms(op, n, ps_shards=shards)
    return np.where(n > 1, _sum_terms(terms, size, {"net": link}, chunks), 0.0)


def hierarchical_time(
    op: str,
    n_nodes,
    gpus_per_node,
    size,
    intra_alpha,
    intra_bw,
    inter_alpha,
    inter_bw,
    *,
    intra_overhead=None,
    inter_overhead=None,
) -> np.ndarray:
    """Seconds for the two-level `op`: rings inside each node at size S, and rings across
    nodes among the GPUs of each rail at S / g, one phase after another (hierarchical.py).

    All rails run at once, each on its own NIC, so inter_bw is one GPU's share of the
    network (e.g. one NIC per GPU). The overheads are each tier's per-message o (see
    collective_time); a ring rank has one peer each way, so today they do not change the
    result, but they travel with the phases so every phase follows the same rule."""
    alg = lookup(op, "hierarchical")
    g = _group_sizes(gpus_per_node)
    n = _group_sizes(n_nodes) * g
    links = {
        "intra": _link(intra_alpha, intra_bw, intra_overhead),
        "inter": _link(inter_alpha, inter_bw, inter_overhead),
    }
    terms = alg.forms[op].terms(op, n, gpus_per_node=g)
    return np.where(n > 1, _sum_terms(terms, _sizes(size), links, None), 0.0)


def _sum_terms(terms: list[Term], size: np.ndarray, links: dict[str, Link], chunks):
    """Seconds of a closed form's terms, each on its tier's uniform link.

    Rounds add up per tier before touching the size grid (latencies over group sizes,
    loads over group sizes), so a flat algorithm costs one multiply-add over the grid;
    a Pipeline picks its chunk count per element (pipeline_chunks) unless given."""
    total, latency, load = None, {}, {}
    for term in terms:
        alpha, bandwidth, o = links[term.tier]
        a_step = alpha_with_fanin(alpha, term.peers, o)
        if isinstance(term, Rounds):
            latency[term.tier] = latency.get(term.tier, 0.0) + term.count * a_step
            load[term.tier] = load.get(term.tier, 0.0) + term.load
            continue
        work = term.load / bandwidth * size
        k = pipeline_chunks(term.stages, a_step, work, size) if chunks is None else chunks
        total = _plus(total, pipeline_time(k, term.stages, a_step, work))
    for tier, lat in latency.items():
        total = _plus(total, lat + load[tier] / links[tier][1] * size)
    return 0.0 if total is None else total


def _plus(total, part):
    return part if total is None else total + part


def _link(alpha, bandwidth, overhead) -> Link:
    """(alpha, bandwidth, o) as arrays; o defaults to alpha / 2 (alpha all endpoint)."""
    alpha, bandwidth = np.asarray(alpha, dtype=float), np.asarray(bandwidth, dtype=float)
    if (alpha < 0).any() or (bandwidth <= 0).any():
        raise ValueError("need size >= 0, alpha >= 0 and bandwidth > 0")
    o = alpha / 2 if overhead is None else np.asarray(overhead, dtype=float)
    if (o < 0).any():
        raise ValueError(f"overhead must be >= 0, got {overhead}")
    return alpha, bandwidth, o


def _sizes(size) -> np.ndarray:
    """Bytes as a float array, refusing negative sizes."""
    size = np.asarray(size, dtype=float)
    if (size < 0).any():
        raise ValueError("need size >= 0, alpha >= 0 and bandwidth > 0")
    return size


def _group_sizes(n) -> np.ndarray:
    """n as an int64 array, refusing non-integers and groups smaller than one rank."""
    arr = np.asarray(n)
    as_int = arr.astype(np.int64)
    if (as_int != arr).any() or (as_int < 1).any():
        raise ValueError(f"group sizes must be integers >= 1, got {n}")
    return as_int


def evaluate(
    schedule: Schedule, cluster: Cluster, gpu_of_rank, step_time: StepTimeFn = routed_step_time
) -> float:
    """Seconds the schedule takes on the cluster: sum of rounds x step time, where a step
    ends with its slowest flow under max-min fair sharing (topology.routing.step_time).

    gpu_of_rank may be 2-D, one row per group: groups that run the same schedule at the
    same time (every data-parallel group of a hybrid layout), sharing the fabric."""
    gpu = np.atleast_2d(np.asarray(gpu_of_rank, dtype=np.int64))
    return float(sum(s.rounds * _concurrent(step_time, cluster, gpu, s) for s in schedule))


def _concurrent(step_time: StepTimeFn, cluster: Cluster, gpu: np.ndarray, s: Step, scale=1.0):
    """One step run by every group (row of gpu) at once (the routed default asked by the
    grid and the step: grid_step_time)."""
    if step_time is routed_step_time:
        return grid_step_time(cluster, gpu, s.src, s.dst, s.nbytes * scale, s.rail)
    groups = gpu.shape[0]
    return step_time(
        cluster,
        gpu[:, s.src].ravel(),
        gpu[:, s.dst].ravel(),
        np.tile(s.nbytes * scale, groups),
        np.tile(s.rail, groups),
    )


def graph_time(
    op: str,
    algorithm: str,
    size: float,
    cluster: Cluster,
    gpu_of_rank,
    *,
    gpus_per_node: int = 1,
    channels: int = 1,
    ps_shards: int = 1,
    chunks: int | None = None,
    step_time: StepTimeFn = routed_step_time,
) -> float:
    """Seconds for `op` over the GPUs gpu_of_rank (rank order; 2-D for concurrent groups)
    routed on the cluster graph.

    With chunks None a pipelined algorithm picks its chunk count by pipeline_chunks from
    the graph itself: alpha = its steady-state step with empty flows (path latency plus
    the per-message overhead of every further peer, topology.routing.flow_times), work =
    the same step with the whole buffer minus alpha. On a uniform network these are the
    closed form's."""
    gpu = np.atleast_2d(np.asarray(gpu_of_rank, dtype=np.int64))
    n = gpu.shape[1]
    shape = dict(gpus_per_node=gpus_per_node, channels=channels, ps_shards=ps_shards)
    steps = build_schedule(op, algorithm, n, size, chunks=chunks or 1, **shape)
    piped = [s for s in steps if s.stages > 1]
    if chunks is None and piped:
        s = piped[0]  # built with one chunk: its flows carry the whole buffer
        alpha = _concurrent(step_time, cluster, gpu, s, scale=0.0)
        work = _concurrent(step_time, cluster, gpu, s) - alpha
        chunks = int(pipeline_chunks(s.stages, alpha, work, size))
        steps = build_schedule(op, algorithm, n, size, chunks=chunks, **shape)
    return evaluate(steps, cluster, gpu, step_time)
