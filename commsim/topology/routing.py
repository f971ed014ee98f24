"""Routes for flows (ECMP over the Clos), link loads, and max-min fair bandwidth sharing.

A step of a collective is a set of concurrent flows. Each flow's route is a list of edge
ids; flows share every edge's capacity max-min fairly (progressive filling), and as flows
finish the rest speed up (a fluid model). A flow's time is its latency plus the time its
bytes take under that sharing; the step ends with its slowest flow. Its latency is its
path's, plus LogP's per-message overhead o for each further peer its endpoints handle in
the step (alpha_with_fanin): an endpoint sends and receives its messages one by one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from commsim.topology import symmetry
from commsim.topology.build import Cluster

_MAX_HOPS = 12  # gpu-hub-gpu-nic-leaf-spine-core-spine-leaf-nic-gpu-hub-gpu


def _ecmp_hash(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A deterministic flow hash (like a switch's 5-tuple hash) of source and destination."""
    h = a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ b.astype(np.uint64) * np.uint64(
        0xC2B2AE3D27D4EB4F
    )
    h ^= h >> np.uint64(29)
    return (h * np.uint64(0xBF58476D1CE4E5B9) >> np.uint64(32)).astype(np.int64)


def _owner_gpu(cluster: Cluster, port: np.ndarray) -> np.ndarray:
    """The first GPU attached (over PCIe) to a global port's NIC: where PXN hands data over."""
    gpn, ports = cluster.gpus_per_node, cluster.nics_per_node
    nics = ports // cluster.ports_per_nic
    node, nic = port // ports, port % ports // cluster.ports_per_nic
    return node * gpn + (nic * gpn + nics - 1) // nics


def _same_plane(cluster: Cluster, nic_s: np.ndarray, nic_d: np.ndarray) -> np.ndarray:
    """The far port a flow arrives on: nic_d, or where it is in another plane (planes meet
    only inside nodes) the far node's port of nic_s's plane, the hop to the GPU then over
    NVLink (PXN on the far side, as DeepSeek's multi-plane network crosses planes)."""
    if cluster.planes == 1:
        return nic_d
    nics = cluster.nics_per_node
    other = cluster.plane_of(nic_s) != cluster.plane_of(nic_d)
    return np.where(other, nic_d - nic_d % nics + nic_s % nics, nic_d)


def routes(
    cluster: Cluster, src: np.ndarray, dst: np.ndarray, rail: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Edge ids of each flow's path (padded with -1) and each path's latency in seconds.

    Inside a node: GPU -> hub -> GPU. Between nodes: GPU -> NIC -> leaf [-> spine [-> core
    -> spine] -> leaf] -> NIC -> GPU. A flow with a rail (NCCL's PXN) first moves over the
    hub to the GPU that owns that rail's NIC, and arrives on the same rail at the far end.
    Uplinks are chosen by destination-mod-k (balanced, as InfiniBand's fat-tree routing
    does) or by a flow hash (ECMP on Ethernet/RoCE).
    """
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    n = src.size
    paths = np.full((n, _MAX_HOPS), -1, dtype=np.int64)
    col = np.zeros(n, dtype=np.int64)
    lat = np.zeros(n)
    spec = cluster.spec

    def push(mask: np.ndarray, edge: np.ndarray) -> None:
        idx = np.nonzero(mask)[0]
        paths[idx, col[idx]] = edge[idx]
        col[idx] += 1

    node_s, node_d = cluster.node_of(src), cluster.node_of(dst)
    real = src != dst
    intra = real & (node_s == node_d)
    inter = real & ~intra
    push(intra, cluster.gpu_hub[src, 0])
    push(intra, cluster.gpu_hub[dst, 1])
    lat[intra] = spec.node.intra_latency
    if not inter.any():
        return paths, lat

    nics = cluster.nics_per_node
    if rail is None:
        rail = np.full(n, -1, dtype=np.int64)
    rail = np.asarray(rail, dtype=np.int64)
    pinned = rail >= 0
    home_s, home_d = cluster.nic_of(src), cluster.nic_of(dst)
    nic_s = np.where(pinned, node_s * nics + rail % nics, home_s)
    nic_d = _same_plane(cluster, nic_s, np.where(pinned, node_d * nics + rail % nics, home_d))
    own_s = np.where(nic_s == home_s, src, _owner_gpu(cluster, nic_s))
    own_d = np.where(nic_d == home_d, dst, _owner_gpu(cluster, nic_d))
    hop_s = inter & (own_s != src)
    hop_d = inter & (own_d != dst)
    push(hop_s, cluster.gpu_hub[src, 0])
    push(hop_s, cluster.gpu_hub[own_s, 1])
    push(inter, cluster.gpu_nic[own_s, 0])
    push(inter, cluster.nic_leaf[nic_s, 0])

    leaf_s, leaf_d = cluster.leaf_of_nic[nic_s], cluster.leaf_of_nic[nic_d]
    cross = inter & (leaf_s != leaf_d)
    if cross.any():
        k_sp = cluster.spines_per_pod
        if spec.fabric.routing == "balanced":
            key = cluster.port_of_nic[nic_d]
        else:
            key = _ecmp_hash(src, dst)
        j = key % k_sp
        pod_s, pod_d = cluster.pod_of_leaf[leaf_s], cluster.pod_of_leaf[leaf_d]
        push(cross, cluster.leaf_spine[leaf_s, j, 0])
        via_core = cross & (pod_s != pod_d)
        if via_core.any():
            cores = cluster.spine_core.shape[1]
            k = (key // k_sp + leaf_d) % cores
            spine_s, spine_d = pod_s * k_sp + j, pod_d * k_sp + j
            push(via_core, cluster.spine_core[spine_s, k, 0])
            push(via_core, cluster.spine_core[spine_d, k, 1])
        push(cross, cluster.leaf_spine[leaf_d, j, 1])

    push(inter, cluster.nic_leaf[nic_d, 1])
    push(inter, cluster.gpu_nic[own_d, 1])
    push(hop_d, cluster.gpu_hub[own_d, 0])
    push(hop_d, cluster.gpu_hub[dst, 1])
    safe = np.where(paths >= 0, paths, 0)
    lat_edges = np.where(paths >= 0, cluster.edge_latency[safe], 0.0).sum(axis=1)
    lat[inter] = spec.node.nics.latency + lat_edges[inter]
    return paths, lat


def endpoint_overhead(cluster: Cluster, src, dst) -> np.ndarray:
    """LogP's per-message overhead o of each flow: half its endpoint latency (a message
    costs o at the sender and o at the receiver), the NIC's between nodes and the node's
    intra-node latency inside one; switch and cable latency are not part of it. 0 for a
    self-send."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    node = cluster.spec.node
    intra = cluster.node_of(src) == cluster.node_of(dst)
    o = np.where(intra, node.intra_latency, node.nics.latency) / 2
    return np.where(src != dst, o, 0.0)


def peer_counts(src, dst) -> np.ndarray:
    """k of each flow in one step: max(distinct GPUs its source sends to, distinct GPUs its
    destination receives from). Flows of one (src, dst) pair on several rails (NCCL's
    channels) count once: they run in parallel. 1 for a self-send."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    real = src != dst
    if not real.any():
        return np.ones(src.shape, dtype=np.int64)
    width = int(max(src.max(), dst.max())) + 1
    pairs = np.sort(src[real] * width + dst[real])
    pairs = pairs[np.concatenate([[True], pairs[1:] != pairs[:-1]])]
    fan_out = np.bincount(pairs // width, minlength=width)
    fan_in = np.bincount(pairs % width, minlength=width)
    return np.where(real, np.maximum(fan_out[src], fan_in[dst]), 1)


def link_loads(cluster: Cluster, paths: np.ndarray) -> np.ndarray:
    """How many flows cross each edge (by edge id)."""
    used = paths[paths >= 0]
    return np.bincount(used, minlength=cluster.capacity.size)


def maxmin_rates(
    paths: np.ndarray, capacity: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """Max-min fair rate of each flow (paths: flows x hops of edge ids, -1 padded).

    Water-filling by local bottlenecks: an edge whose fair share (remaining capacity /
    unfrozen flows) is the smallest on every unfrozen flow through it is a bottleneck; all
    such edges freeze their flows at their share at once, their rates leave the other
    edges, repeat. Each round is one vectorised pass; rounds are the depth of the
    bottleneck structure, not the number of distinct rates (Bertsekas & Gallager 6.5.2
    give the sequential form, which tests/test_topology.py checks this against).
    A flow with no edges (a self-send) gets an infinite rate. weights (paths' shape): how
    many flows each hop stands for on its edge (topology.symmetry's orbits; default 1).
    The passes run over the real hops only, flow by flow (most flows of a step stay in
    their node: 2 hops of up to 12), which is also the order every edge sums its terms in."""
    used = paths >= 0
    rate = np.full(paths.shape[0], np.inf)
    hops = used.sum(axis=1)
    live = np.nonzero(hops)[0]  # the active flows, shrinking every round
    length, edge = hops[live], paths[used].astype(np.intp)
    weight = np.ones(edge.size) if weights is None else np.asarray(weights, dtype=float)[used]
    remaining = capacity.astype(float).copy()
    counts = np.bincount(edge, weights=weight, minlength=capacity.size)
    while live.size:
        start, owner = np.cumsum(length) - length, np.repeat(np.arange(live.size), length)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(counts > 0, remaining / counts, np.inf)
        hop_share = share[edge]
        least = np.minimum.reduceat(hop_share, start)  # each active flow's tightest share
        not_least = hop_share > least[owner] * (1 + 1e-12)
        bottleneck = (counts > 0) & (np.bincount(edge[not_least], minlength=capacity.size) == 0)
        frozen = np.logical_or.reduceat(bottleneck[edge], start)
        rate[live[frozen]] = least[frozen]
        gone = frozen[owner]
        freed = (least[owner] * weight)[gone]
        remaining = np.maximum(
            remaining - np.bincount(edge[gone], weights=freed, minlength=capacity.size), 0.0
        )
        counts -= np.bincount(edge[gone], weights=weight[gone], minlength=capacity.size)
        live, length = live[~frozen], length[~frozen]
        edge, weight = edge[~gone], weight[~gone]
    return rate


def flow_times(
    cluster: Cluster,
    src: np.ndarray,
    dst: np.ndarray,
    nbytes: np.ndarray,
    rail: np.ndarray | None = None,
) -> np.ndarray:
    """Completion time of each concurrent flow: latency + fluid max-min transfer time.

    The latency is the path's plus (k - 1) o, with k from peer_counts and o from
    endpoint_overhead (alpha_with_fanin, the closed forms' rule). Scaling every flow's bytes
    by c scales every fluid finishing time by c (the rates and the order of finishing do
    not change), so a step is solved once per pattern of relative sizes (step_time caches
    that)."""
    src, dst, shape, scale = _unit_step(src, dst, nbytes)
    lat, unit = _solve(cluster, src, dst, rail, shape)
    return lat + scale * unit


def _unit_step(src, dst, nbytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(src, dst, relative sizes, scale): the step's sizes as scale x shape, max(shape) 1."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), src.shape)
    scale = float(nbytes.max(initial=0.0))
    return src, dst, nbytes / scale if scale > 0 else nbytes, scale


_CACHE_SIZE = 512
_CACHE_PAIRS = 4_000_000  # (latency, time) pairs kept in all (16 bytes each): 64 MB
FLUID_BAND = 0.05  # flows finishing within 5% of the first are released together
FLUID_ROUNDS = 4


def grid_step_time(cluster: Cluster, gpu: np.ndarray, src, dst, nbytes, rail) -> float:
    """step_time of every group (a row of gpu: its GPUs in rank order) running one step,
    ranks src -> dst with nbytes on rail. Keyed by the grid and the step's ranks, so a
    step asked again (at another size, or by another op with the same flows) builds no
    flows: at 131,072 GPUs most of a plan's questions are such repeats."""
    src, dst, shape, scale = _unit_step(src, dst, nbytes)
    if src.size == 0:
        return 0.0
    rail = np.full(src.shape, -1, dtype=np.int64) if rail is None else np.asarray(rail)
    key = _digest(b"grid", gpu, src, dst, rail, shape)
    if key not in cluster.solved_steps:
        flows = (gpu[:, src].ravel(), gpu[:, dst].ravel(), np.tile(rail, gpu.shape[0]))
        _store(cluster, key, _solved(cluster, *flows, np.tile(shape, gpu.shape[0])))
    pairs = cluster.solved_steps[key]
    return float(np.max(pairs[:, 0] + scale * pairs[:, 1]))


def _digest(*parts) -> bytes:
    """A 128-bit digest of arrays' contents, read in place (no copies of the flows)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(part if isinstance(part, bytes) else np.ascontiguousarray(part).data)
    return digest.digest()


def _store(cluster: Cluster, key: bytes, pairs: np.ndarray) -> None:
    """Cache a step's slowest flows, the oldest steps leaving first past the limits."""
    cache = cluster.solved_steps
    while cache and (
        len(cache) >= _CACHE_SIZE
        or sum(v.shape[0] for v in cache.values()) + pairs.shape[0] > _CACHE_PAIRS
    ):
        del cache[next(iter(cache))]
    cache[key] = pairs


def _solved(cluster, src, dst, rail, shape) -> np.ndarray:
    """The step's slowest flows at every scale, (latency, finishing time at unit scale)
    rows (_frontier), cached on the cluster: a symmetric step has a few, so the cache
    holds hundreds of steps at 131,072 GPUs rather than dozens."""
    key = _digest(src, dst, np.full(src.shape, -1) if rail is None else np.asarray(rail), shape)
    if key not in cluster.solved_steps:
        _store(cluster, key, _frontier(*_solve(cluster, src, dst, rail, shape)))
    return cluster.solved_steps[key]


def _frontier(lat: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """The flows no other flow beats on both latency and unit time, as (lat, unit) rows:
    for every scale s >= 0 the largest lat + s x unit is one of theirs, to the last bit
    (a + s x b rounds monotonically in a and b)."""
    order = np.argsort(-lat, kind="stable")
    lat, unit = lat[order], unit[order]
    keep = np.concatenate([[True], unit[1:] > np.maximum.accumulate(unit)[:-1]])
    return np.stack([lat[keep], unit[keep]], axis=1)


@dataclass(frozen=True)
class Background:
    """Flows of other jobs that hold their share of the links for as long as this job's
    steps run (their collectives on the wire at the same time: topology.jobs)."""

    src: np.ndarray
    dst: np.ndarray
    rail: np.ndarray


def _solve(cluster, src, dst, rail, nbytes) -> tuple[np.ndarray, np.ndarray]:
    """Route the flows (and the cluster's background flows, which never finish) and run
    the fluid max-min model until the step's own flows are done, once per orbit of the
    step's symmetries (topology.symmetry) unless the cluster says otherwise."""
    own = src.size
    rail = np.full(src.shape, -1, dtype=np.int64) if rail is None else np.asarray(rail)
    nbytes = np.asarray(nbytes, dtype=float)
    bg = cluster.background
    if bg is not None:
        src, dst = np.concatenate([src, bg.src]), np.concatenate([dst, bg.dst])
        rail = np.concatenate([rail, bg.rail])
        nbytes = np.concatenate([nbytes, np.full(bg.src.size, np.inf)])
    paths, lat = routes(cluster, src, dst, rail)
    paths = paths[:, : int((paths >= 0).sum(axis=1).max(initial=0))]
    lat = alpha_with_fanin(lat, peer_counts(src, dst), endpoint_overhead(cluster, src, dst))
    big = cluster.symmetry and src.size >= symmetry.MIN_FLOWS
    r = symmetry.reduce(cluster, src, dst, rail, nbytes, paths) if big else None
    if r is None:
        finish = _fluid(paths, cluster.capacity, None, nbytes)
    else:
        finish = _fluid(r.paths, r.capacity, r.weights, nbytes[r.reps])[r.orbit]
    return lat[:own], finish[:own]


def _fluid(paths, capacity, weights, nbytes) -> np.ndarray:
    """Finishing time of each flow of `nbytes` sharing the edges max-min fairly, the rest
    speeding up as flows finish (weights: see maxmin_rates). A flow of infinite bytes
    never finishes (inf): it holds its share throughout."""
    paths = paths.astype(np.int32)
    remaining = np.array(nbytes, dtype=float)
    finish = np.where(np.isfinite(remaining), 0.0, np.inf)
    alive = (remaining > 0) & (paths[:, 0] >= 0)
    now, rounds = 0.0, 0
    while (alive & np.isfinite(remaining)).any():
        idx = np.nonzero(alive)[0]
        rates = maxmin_rates(paths[idx], capacity, None if weights is None else weights[idx])
        left = np.where(np.isfinite(remaining[idx]), remaining[idx] / rates, np.inf)
        rounds += 1
        # Flows due within FLUID_BAND of the first finish together (each at its own time);
        # the rest keep their rates that long. After FLUID_ROUNDS rounds all finish at their
        # current rates. Both only ever slow survivors down, and bound the rounds when
        # hash collisions give every flow its own rate.
        band = np.inf if rounds >= FLUID_ROUNDS else left.min() * (1.0 + FLUID_BAND)
        done = (left <= band) & np.isfinite(left)
        finish[idx[done]] = now + left[done]
        dt = left[done].max()
        remaining[idx] -= rates * dt
        alive[idx[done]] = False
        now += dt
    return finish


def step_time(
    cluster: Cluster,
    src: np.ndarray,
    dst: np.ndarray,
    nbytes: np.ndarray,
    rail: np.ndarray | None = None,
) -> float:
    """Time of one step of concurrent flows: the slowest flow's completion (flow_times)."""
    if np.size(src) == 0:
        return 0.0
    src, dst, shape, scale = _unit_step(src, dst, nbytes)
    pairs = _solved(cluster, src, dst, rail, shape)
    return float(np.max(pairs[:, 0] + scale * pairs[:, 1]))


def path_params(cluster: Cluster, src: int, dst: int, rail: int = -1) -> tuple[float, float]:
    """(latency, bottleneck bandwidth) of one flow's path, alone on the fabric: the closed
    forms' alpha and B; their per-message overhead is endpoint_overhead(cluster, src, dst)."""
    paths, lat = routes(cluster, np.array([src]), np.array([dst]), np.array([rail]))
    edges = paths[0][paths[0] >= 0]
    return float(lat[0]), float(cluster.capacity[edges].min())


def alpha_with_fanin(alpha, peers, overhead=None) -> np.ndarray:
    """Latency of a step in which a rank exchanges messages with `peers` distinct peers.

    LogP (Culler et al. 1993, "LogP: towards a realistic model of parallel computation",
    PPoPP) and LogGP (Alexandrov et al. 1995, SPAA): a message costs its sender an overhead
    o and its receiver an o, and an endpoint handles its messages one after another, so
    when a rank sends to (or receives from) k peers the last message is handled (k - 1) o
    after the first: alpha + (k - 1) o. The end-to-end latency is o + L + o, so with no
    wire/switch part L the overhead is o = alpha / 2, the default; where L is not zero
    pass the endpoint part (the graph takes half the NIC's or the node's latency). A peer
    reached over several channels (NCCL's rails) counts once: those run in parallel. The
    graph form (topology.routing.flow_times) applies this per flow with k = max(distinct
    destinations of its source, distinct sources of its destination) in the step.
    """
    alpha = np.asarray(alpha, dtype=float)
    o = alpha / 2 if overhead is None else np.asarray(overhead, dtype=float)
    return alpha + o * np.maximum(np.asarray(peers) - 1, 0)
