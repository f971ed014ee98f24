"""Which GPU each rank of a job runs on, and which nodes each job of a shared cluster gets.

A job holds the first ceil(n / gpus_per_node) nodes, or the nodes a scheduler allocated it
(Cluster.allocation). Rank order decides which ranks are ring neighbours, so it decides how
many ring edges cross a node, a rack or a pod.
"""

from __future__ import annotations

import numpy as np

from commsim.topology.build import Cluster

PLACEMENTS = ("blocked", "interleaved", "topology-aware")  # orders of the job's GPUs
PLACEMENT_KINDS = ("blocked", "interleaved")  # the placements hybrid layouts take
ALLOCATIONS = ("packed", "random", "fragmented")


def job_gpus(cluster: Cluster, n_ranks: int) -> np.ndarray:
    """The GPUs a job of n_ranks holds, in the scheduler's order."""
    if cluster.allocation is None:
        return np.arange(n_ranks)
    if n_ranks > cluster.allocation.size:
        raise ValueError(f"{n_ranks} ranks on an allocation of {cluster.allocation.size} GPUs")
    return np.asarray(cluster.allocation[:n_ranks], dtype=np.int64)


def place(cluster: Cluster, n_ranks: int, kind: str) -> np.ndarray:
    """GPU id of each rank for a placement kind.

    blocked: fill a node, then the next node the scheduler gave (on a fresh cluster, the
      next node of the same rack).
    interleaved: consecutive ranks go round-robin to different racks, then different
      nodes, then different local GPUs: the worst order a scheduler can hand out.
    topology-aware: sorted by (pod, rack, node, local GPU) so a ring crosses each node and
      each rack boundary once; equal to blocked when the nodes are already in rack order.
    """
    gpus = job_gpus(cluster, n_ranks)
    if kind == "blocked":
        return gpus
    node = cluster.node_of(gpus)
    rack = cluster.rack_of_node[node]
    local = gpus % cluster.gpus_per_node
    if kind == "interleaved":
        tidy = np.lexsort((local, node, rack))  # by rack, node, local GPU
        node_t, rack_t = node[tidy], rack[tidy]
        new_node = np.concatenate([[True], node_t[1:] != node_t[:-1]])
        new_rack = np.concatenate([[True], rack_t[1:] != rack_t[:-1]])
        count = np.cumsum(new_node)
        node_in_rack = count - 1 - np.maximum.accumulate(np.where(new_rack, count - 1, 0))
        return gpus[tidy][np.lexsort((rack_t, node_in_rack, local[tidy]))]
    if kind == "topology-aware":
        pod = cluster.pod_of_leaf[cluster.leaf_of_nic[cluster.nic_of(gpus)]]
        return gpus[np.lexsort((local, node, rack, pod))]
    raise ValueError(f"unknown placement {kind!r} (choose from {', '.join(PLACEMENTS)})")


def rank_grid(gpus: np.ndarray, order: str, tp: int, cp: int, dp: int, pp: int) -> np.ndarray:
    """GPU of each rank of a hybrid layout as [stage, data-parallel, context, tensor], from
    the placement's GPU order and the rank order (fastest-varying first). Megatron-core's
    tp-cp-ep-dp-pp puts the pipeline stages outermost, on the most distant GPUs;
    tp-cp-ep-pp-dp (--use-tp-pp-dp-mapping; Llama 3's [TP, CP, PP, DP], arXiv:2407.21783
    Sec. 3.3.2) the data-parallel replicas: tensor parallelism in the node, the pipeline
    across nearby nodes, data parallelism across racks and pods."""
    if order == "tp-cp-ep-pp-dp":
        return gpus.reshape(dp, pp, cp, tp).transpose(1, 0, 2, 3)
    if order != "tp-cp-ep-dp-pp":
        raise ValueError(f"unknown rank order {order!r}")
    return gpus.reshape(pp, dp, cp, tp)


def pod_of_node(cluster: Cluster) -> np.ndarray:
    """The pod (of plane 0) each node's first port hangs under."""
    first_port = np.arange(cluster.n_nodes) * cluster.nics_per_node
    return cluster.pod_of_leaf[cluster.leaf_of_nic[first_port]]


def allocate(
    cluster: Cluster, nodes: list[int], policy: str, seed: int = 0, exclude=None
) -> list[np.ndarray]:
    """Node ids of each job, asking for nodes[j] nodes, as a scheduler would hand them out
    from the nodes not in `exclude`.

    packed: consecutive nodes in rack and pod order (each job as few pods as it can);
    random: nodes in a random order (seeded), as a busy cluster's free list looks;
    fragmented: round-robin over the pods, so every job spreads over every pod and its
      traffic crosses the aggregation tier."""
    free = np.ones(cluster.n_nodes, dtype=bool)
    free[np.asarray([] if exclude is None else exclude, dtype=np.int64)] = False
    if sum(nodes) > free.sum():
        raise ValueError(f"the jobs need {sum(nodes)} nodes; {free.sum()} are free")
    all_nodes = np.arange(cluster.n_nodes)
    if policy == "packed":
        order = all_nodes
    elif policy == "random":
        order = np.random.default_rng(seed).permutation(cluster.n_nodes)
    elif policy == "fragmented":
        pod = pod_of_node(cluster)
        first = np.searchsorted(pod, pod)  # nodes are numbered pod by pod
        order = all_nodes[np.lexsort((pod, all_nodes - first))]
    else:
        raise ValueError(f"unknown allocation {policy!r} (choose from {', '.join(ALLOCATIONS)})")
    order = order[free[order]]
    bounds = np.concatenate([[0], np.cumsum(nodes)]).astype(np.int64)
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def gpus_of_nodes(cluster: Cluster, nodes: np.ndarray) -> np.ndarray:
    """The GPUs of the given nodes, node by node."""
    g = cluster.gpus_per_node
    return (np.asarray(nodes)[:, None] * g + np.arange(g)).ravel()


LEVELS = ("node", "rack", "pod", "fabric")  # "fabric": across pods, through the top tier


def group_level(cluster: Cluster, groups: np.ndarray) -> str:
    """The highest level of the fabric any group (a row of GPUs) spans: all in one node,
    under one leaf (rack), in one pod, or across pods (through the aggregation tier, e.g.
    Meta's 7:1 one)."""
    groups = np.atleast_2d(groups)
    node = cluster.node_of(groups)
    port = node * cluster.nics_per_node
    for level, where in zip(
        LEVELS[:3],
        (node, cluster.leaf_of_nic[port], cluster.pod_of_leaf[cluster.leaf_of_nic[port]]),
        strict=True,
    ):
        if (where == where[:, :1]).all():
            return level
    return LEVELS[3]
