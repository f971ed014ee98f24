"""The shape of a fabric as arithmetic: where each NIC port attaches (plane, leaf, pod), how
many uplinks each tier has, what the routing delivers, and the physical switch and link
counts a published design states.

Conventions (Clos / fat tree, as in NVIDIA's SuperPOD and Meta's and Alibaba's papers):
each leaf has one link to every spine of its pod, each spine one link to every core group
of its plane, so a leaf with U uplinks sits under U spines, and a spine with C uplinks sees
C cores; a plane is a whole independent fabric, its switches and links its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from commsim.specs import ClusterSpec, SpecError

# Effective throughput of the network links by routing model: what a collective sees of the
# line rate once load balancing and congestion control have done their work.
# - adaptive (adaptive routing / packet spraying with congestion control): 0.95, NVIDIA on
#   xAI Colossus's Spectrum-X fabric: "It has maintained 95% data throughput" across its
#   three tiers (NVIDIA, quoted by tweaktown.com, Oct 2024; shared/research/wave2-notes.md 5.1).
# - hash (static ECMP): 1.0 on the graph, because the graph routes every flow by its hash and
#   so prices the collisions themselves; NVIDIA's figure for "standard Ethernet" with flow
#   collisions, 60%, is what those collisions cost there (tests/test_fabrics.py checks that a
#   random permutation through hashed uplinks keeps about 1 - 1/e = 63% of the bisection).
#   Set `throughput: 0.6` to impose NVIDIA's figure instead.
# - balanced (destination-mod-k, InfiniBand's fat-tree routing): 1.0, its collisions too are
#   routed on the graph.
ROUTING_THROUGHPUT = {"adaptive": 0.95, "hash": 1.0, "balanced": 1.0}


def throughput(spec: ClusterSpec) -> float:
    """The fabric's effective-throughput factor: its own `throughput`, else its routing's."""
    fab = spec.fabric
    return fab.throughput if fab.throughput is not None else ROUTING_THROUGHPUT[fab.routing]


@dataclass(frozen=True)
class Attachment:
    """Where every NIC port of the job's nodes attaches: arrays indexed by global port
    (node * ports_per_node + local port)."""

    ports_per_node: int  # NICs x ports per NIC: what routing calls a node's "NICs" (rails)
    plane: np.ndarray  # plane of each port
    leaf: np.ndarray  # global leaf id (plane-major)
    position: np.ndarray  # the port's index among its leaf's ports (destination-mod-k key)
    leaves_per_plane: int
    pods_per_plane: int
    leaves_per_pod: int

    @property
    def n_leaves(self) -> int:
        return self.leaves_per_plane * int(self.plane.max() + 1)

    @property
    def pod_of_leaf(self) -> np.ndarray:
        """Global pod of each leaf: plane * pods_per_plane + its pod in the plane."""
        leaf = np.arange(self.n_leaves)
        plane, local = np.divmod(leaf, self.leaves_per_plane)
        return plane * self.pods_per_plane + local // self.leaves_per_pod


def attachment(spec: ClusterSpec, n_nodes: int, source: str = "") -> Attachment:
    """Plane, leaf and leaf position of every NIC port of n_nodes nodes.

    Port p of a node (NIC p // nic_ports, port p % nic_ports) is in plane p % planes. Inside
    a plane, a unit of nodes_per_leaf nodes has one leaf (plain) or one leaf per NIC rail
    that has ports in the plane (rail-optimised); a plain dual-ToR rack (nic_ports > planes)
    has one leaf per port of a NIC."""
    node, fab = spec.node, spec.fabric
    ports = node.nics.count * fab.nic_ports
    if ports % fab.planes:
        raise SpecError(
            source or spec.name,
            "fabric.planes",
            f"{fab.planes} planes do not divide the {ports} NIC ports of a node",
        )
    p = np.arange(n_nodes * ports) % ports
    unit = (np.arange(n_nodes * ports) // ports) // fab.nodes_per_leaf
    plane = p % fab.planes
    if node.rail_optimized:
        cols, col = ports // fab.planes, p // fab.planes
    else:
        cols = max(1, fab.nic_ports // fab.planes)
        col = (p % fab.nic_ports) // fab.planes if fab.nic_ports > fab.planes else 0 * p
    units = int(unit.max()) + 1
    per_plane = units * cols
    leaf = plane * per_plane + unit * cols + col
    order = np.argsort(leaf, kind="stable")
    position = np.empty(leaf.size, dtype=np.int64)
    position[order] = np.arange(leaf.size) - np.searchsorted(leaf[order], leaf[order])
    per_pod = fab.leaves_per_pod if fab.tiers == 3 else per_plane
    return Attachment(ports, plane, leaf, position, per_plane, -(-per_plane // per_pod), per_pod)


def leaf_uplinks(spec: ClusterSpec, down_ports: int) -> tuple[int, float]:
    """(physical uplinks, uplink bandwidth in bytes/s) of a leaf with down_ports NIC ports:
    its down bandwidth over the first tier's oversubscription, in links of
    uplink_bandwidth (default: a NIC port's), or uplinks_per_leaf of them when given."""
    fab = spec.fabric
    port_bw = spec.node.nics.bandwidth / fab.nic_ports
    link_bw = fab.uplink_bandwidth or port_bw
    if fab.uplinks_per_leaf is not None:
        return fab.uplinks_per_leaf, fab.uplinks_per_leaf * link_bw
    up_bw = down_ports * port_bw / fab.oversubscription[0]
    return max(1, math.ceil(up_bw / link_bw - 1e-9)), up_bw


def spine_uplinks(spec: ClusterSpec, leaves_per_pod: int) -> int:
    """Uplinks of a spine that has one link down to each of its pod's leaves, over the
    second tier's oversubscription."""
    over = spec.fabric.oversubscription
    return max(1, math.ceil(leaves_per_pod / (over[1] if len(over) > 1 else 1.0) - 1e-9))


def physical_counts(spec: ClusterSpec, n_nodes: int, source: str = "") -> dict[str, int]:
    """Switches and links of the fabric under n_nodes nodes, as built physically (the graph
    merges parallel switches; these are the counts a design publishes)."""
    at = attachment(spec, n_nodes, source)
    planes = spec.fabric.planes
    down = int(np.bincount(at.leaf).max())
    uplinks, _ = leaf_uplinks(spec, down)
    leaves = at.n_leaves
    multi = at.leaves_per_plane > 1
    spines = planes * at.pods_per_plane * uplinks if multi else 0
    pods_used = at.pods_per_plane
    three = spec.fabric.tiers == 3 and pods_used > 1
    per_spine = spine_uplinks(spec, at.leaves_per_pod) if three else 0
    cores = planes * uplinks * per_spine if three else 0
    return {
        "gpus": n_nodes * spec.node.gpus_per_node,
        "nodes": n_nodes,
        "nics": n_nodes * spec.node.nics.count,
        "nic_ports": at.plane.size,
        "planes": planes,
        "pods": planes * pods_used,
        "leaves": leaves,
        "spines": spines,
        "cores": cores,
        "switches": leaves + spines + cores,
        "nic_leaf_links": at.plane.size,
        "leaf_spine_links": leaves * uplinks if multi else 0,
        "spine_core_links": spines * per_spine,
        "leaf_uplinks": uplinks if multi else 0,
        "spine_uplinks": per_spine,
    }
