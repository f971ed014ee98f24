"""Routes for flows (ECMP over the Clos), link loads, and max-min fair bandwidth sharing.

A step of a collective is a set of concurrent flows. Each flow's route is a list of edge
ids; flows share every edge's capacity max-min fairly (progressive filling), and as flows
finish the rest speed up (a fluid model). A flow's time is its latency plus the time its
bytes take under that sharing; the step ends with its slowest flow. Its latency is its
path's, plus LogP's per-message overhead o for each further peer its endpoints handle in
the step (alpha_with_fanin): an endpoint sends and receives its messages one by one.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from commsim.collectives.alphabeta import alpha_with_fanin
from commsim.topology.build import Cluster

_MAX_HOPS = 12  # gpu-hub-gpu-nic-leaf-spine-core-spine-leaf-nic-gpu-hub-gpu


def _ecmp_hash(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A deterministic flow hash (like a switch's 5-tuple hash) of source and destination."""
    h = a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ b.astype(np.uint64) * np.uint64(
        0xC2B2AE3D27D4EB4F
    )
    h ^= h >> np.uint64(29)
    return (h * np.uint64(0xBF58476D1CE4E5B9) >> np.uint64(32)).astype(np.int64)


def _owner_gpu(cluster: Cluster, nic: np.ndarray) -> np.ndarray:
    """The first GPU attached (over PCIe) to a global NIC index: where PXN hands data over."""
    gpn, nics = cluster.gpus_per_node, cluster.nics_per_node
    node, rail = nic // nics, nic % nics
    return node * gpn + (rail * gpn + nics - 1) // nics


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
    nic_d = np.where(pinned, node_d * nics + rail % nics, home_d)
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
    pairs = np.unique(src[real] * width + dst[real])
    fan_out = np.bincount(pairs // width, minlength=width)
    fan_in = np.bincount(pairs % width, minlength=width)
    return np.where(real, np.maximum(fan_out[src], fan_in[dst]), 1)


def _incidence(paths: np.ndarray, n_edges: int) -> sp.csr_matrix:
    """Flows x edges 0/1 matrix of which flow crosses which edge."""
    rows, hops = np.nonzero(paths >= 0)
    data = np.ones(rows.size)
    return sp.csr_matrix((data, (rows, paths[rows, hops])), shape=(paths.shape[0], n_edges))


def link_loads(cluster: Cluster, paths: np.ndarray) -> np.ndarray:
    """How many flows cross each edge (by edge id)."""
    used = paths[paths >= 0]
    return np.bincount(used, minlength=cluster.capacity.size)


def maxmin_rates(incidence: sp.csr_matrix, capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rate of each flow by progressive filling (Bertsekas & Gallager, 6.5.2).

    All unfrozen flows grow together until some edge saturates; its flows freeze at that
    rate; repeat. A flow with no edges (a self-send) gets an infinite rate.
    """
    n_flows = incidence.shape[0]
    rate = np.zeros(n_flows)
    active = np.asarray(incidence.sum(axis=1)).ravel() > 0
    rate[~active] = np.inf
    remaining = capacity.astype(float).copy()
    by_edge = incidence.T.tocsr()
    while active.any():
        counts = by_edge @ active.astype(float)
        loaded = counts > 0
        delta = np.min(remaining[loaded] / counts[loaded])
        rate[active] += delta
        remaining[loaded] -= delta * counts[loaded]
        saturated = loaded & (remaining <= 1e-9 * capacity)
        frozen = (incidence @ saturated.astype(float)) > 0
        active &= ~frozen
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
    not change), so a step is solved once per pattern of relative sizes and cached."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), src.shape)
    scale = float(nbytes.max(initial=0.0))
    lat, unit = _solved(cluster, src, dst, rail, nbytes / scale if scale > 0 else nbytes)
    return lat + scale * unit


_CACHE_SIZE = 512


def _solved(cluster, src, dst, rail, shape) -> tuple[np.ndarray, np.ndarray]:
    """(latency, finishing time at unit scale) of each flow, cached on the cluster."""
    parts = (src, dst, np.full(src.shape, -1) if rail is None else np.asarray(rail), shape)
    key = hash(b"".join(np.ascontiguousarray(a).tobytes() for a in parts))
    cache = cluster.solved_steps
    if key not in cache:
        if len(cache) >= _CACHE_SIZE:
            del cache[next(iter(cache))]
        cache[key] = _solve(cluster, src, dst, rail, shape)
    return cache[key]


def _solve(cluster, src, dst, rail, nbytes) -> tuple[np.ndarray, np.ndarray]:
    """Route the flows and run the fluid max-min model to completion."""
    paths, lat = routes(cluster, src, dst, rail)
    lat = alpha_with_fanin(lat, peer_counts(src, dst), endpoint_overhead(cluster, src, dst))
    remaining = np.array(nbytes, dtype=float)
    incidence = _incidence(paths, cluster.capacity.size)
    finish = np.zeros(lat.size)
    alive = (remaining > 0) & (paths[:, 0] >= 0)
    now = 0.0
    while alive.any():
        idx = np.nonzero(alive)[0]
        rates = maxmin_rates(incidence[idx], cluster.capacity)
        dt = np.min(remaining[idx] / rates)
        now += dt
        remaining[idx] -= rates * dt
        done = remaining[idx] <= 1e-9 * np.maximum(1.0, rates * dt)
        finish[idx[done]] = now
        alive[idx[done]] = False
    return lat, finish


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
    return float(np.max(flow_times(cluster, src, dst, nbytes, rail)))


def path_params(cluster: Cluster, src: int, dst: int, rail: int = -1) -> tuple[float, float]:
    """(latency, bottleneck bandwidth) of one flow's path, alone on the fabric: the closed
    forms' alpha and B; their per-message overhead is endpoint_overhead(cluster, src, dst)."""
    paths, lat = routes(cluster, np.array([src]), np.array([dst]), np.array([rail]))
    edges = paths[0][paths[0] >= 0]
    return float(lat[0]), float(cluster.capacity[edges].min())
