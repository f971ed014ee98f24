"""Rank orderings: which GPU each rank of a job runs on.

The job holds the first ceil(n / gpus_per_node) nodes. Rank order decides which ranks
are ring neighbours, so it decides how many ring edges cross a node or a rack.
"""

from __future__ import annotations

import numpy as np

from commsim.topology.build import Cluster

PLACEMENTS = ("blocked", "interleaved", "topology-aware")
PLACEMENT_KINDS = ("blocked", "interleaved")  # the placements hybrid layouts take


def place(cluster: Cluster, n_ranks: int, kind: str) -> np.ndarray:
    """GPU id of each rank for a placement kind.

    blocked: fill a node, then the next node of the same rack (the scheduler's order).
    interleaved: consecutive ranks go round-robin to different racks, then different
      nodes, then different local GPUs: the worst order a scheduler can hand out.
    topology-aware: sorted by (pod, rack, node, local GPU) so a ring crosses each node and
      each rack boundary once; equal to blocked when the nodes are already in rack order.
    """
    gpus = np.arange(n_ranks)
    node = cluster.node_of(gpus)
    rack = cluster.rack_of_node[node]
    local = gpus % cluster.gpus_per_node
    if kind == "blocked":
        return gpus
    if kind == "interleaved":
        first_node_of_rack = np.searchsorted(rack, rack)  # node ids are rack-ordered
        node_in_rack = node - node[first_node_of_rack]
        return gpus[np.lexsort((rack, node_in_rack, local))]
    if kind == "topology-aware":
        pod = cluster.pod_of_leaf[cluster.leaf_of_nic[cluster.nic_of(gpus)]]
        return gpus[np.lexsort((local, node, rack, pod))]
    raise ValueError(f"unknown placement {kind!r} (choose from {', '.join(PLACEMENTS)})")
