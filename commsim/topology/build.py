"""Build the cluster graph: GPUs, node hubs (NVSwitch or PCIe switch), NICs, leaf/spine/core.

Every physical link is two directed edges (full duplex), each with a capacity in bytes/s
and an integer id. Beside the networkx graph the Cluster keeps numpy tables from structural
coordinates (GPU, NIC, leaf, spine) to edge ids, so routing thousands of flows is array
indexing rather than graph search; tests check those routes against networkx shortest paths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from commsim import catalog
from commsim.specs import ClusterSpec, SpecError

MAX_PARALLEL_SWITCHES = 64  # beyond this, parallel uplinks are merged into fatter edges


@dataclass
class Cluster:
    """A built cluster: the graph plus the index tables that routing reads."""

    spec: ClusterSpec
    graph: nx.DiGraph
    n_nodes: int
    gpus_per_node: int
    nics_per_node: int
    capacity: np.ndarray  # bytes/s per edge id
    edge_latency: np.ndarray  # seconds per edge id (cable + the switch it enters)
    gpu_hub: np.ndarray  # [gpu, 0] gpu->hub, [gpu, 1] hub->gpu
    gpu_nic: np.ndarray  # [gpu, 0] gpu->its NIC, [gpu, 1] NIC->gpu
    nic_leaf: np.ndarray  # [nic, 0] nic->leaf, [nic, 1] leaf->nic   (nic = node*nics + r)
    leaf_of_nic: np.ndarray
    port_of_nic: np.ndarray  # a NIC's port index on its leaf (destination-mod-k routing)
    leaf_spine: np.ndarray  # [leaf, j, 0] up, [leaf, j, 1] down
    pod_of_leaf: np.ndarray
    spine_core: np.ndarray | None  # [spine, k, 0] up, [spine, k, 1] down (3-tier)
    spines_per_pod: int
    rack_of_node: np.ndarray  # the failure/locality domain a "rack" means: leaf or SU
    names: list[str] = field(default_factory=list)  # edge id -> "u->v"
    solved_steps: dict = field(default_factory=dict, repr=False)  # routing's cache of steps

    @property
    def n_gpus(self) -> int:
        return self.n_nodes * self.gpus_per_node

    def node_of(self, gpu: np.ndarray | int) -> np.ndarray:
        return np.asarray(gpu) // self.gpus_per_node

    def nic_of(self, gpu: np.ndarray | int) -> np.ndarray:
        """Global NIC index a GPU uses by default (its PCIe-affine NIC)."""
        gpu = np.asarray(gpu)
        local = gpu % self.gpus_per_node
        return (
            self.node_of(gpu) * self.nics_per_node
            + local * self.nics_per_node // self.gpus_per_node
        )

    def rack_of(self, gpu: np.ndarray | int) -> np.ndarray:
        return self.rack_of_node[self.node_of(gpu)]

    def summary(self) -> dict[str, object]:
        """Sizes, switch counts and per-direction bandwidths of each tier, for `topo show`."""
        spec, fab = self.spec, self.spec.fabric
        kinds: dict[str, int] = {}
        for _, kind in self.graph.nodes(data="kind"):
            kinds[kind] = kinds.get(kind, 0) + 1
        leaf_up = (
            self.capacity[self.leaf_spine[0, :, 0]].sum() if self.leaf_spine[0, 0, 0] >= 0 else 0.0
        )
        return {
            "name": spec.name,
            "description": spec.description,
            "gpu": spec.node.gpu,
            "nodes": self.n_nodes,
            "gpus": self.n_gpus,
            "gpus_per_node": self.gpus_per_node,
            "interconnect": spec.node.interconnect,
            "intra_node_Bps": float(self.capacity[self.gpu_hub[0, 0]]),
            "nics_per_node": self.nics_per_node,
            "nic_Bps": spec.node.nics.bandwidth,
            "nic_per_gpu_Bps": spec.node.nics.bandwidth * self.nics_per_node / self.gpus_per_node,
            "rail_optimized": spec.node.rail_optimized,
            "fabric": f"{fab.kind}, {fab.tiers}-tier Clos, {fab.routing} routing",
            "oversubscription": ":1, ".join(f"{o:g}" for o in fab.oversubscription) + ":1",
            "leaf_uplink_Bps": float(leaf_up),
            "leaves": kinds.get("leaf", 0),
            "spines": kinds.get("spine", 0),
            "cores": kinds.get("core", 0),
            "links": self.graph.number_of_edges() // 2,
            "racks": int(self.rack_of_node.max()) + 1,
        }


class _EdgeBook:
    """Collects directed edges with ids while the builder walks the structure."""

    def __init__(self) -> None:
        self.edges: list[tuple[str, str, float, float, str]] = []

    def link(
        self, u: str, v: str, capacity: float, kind: str, lat_uv: float = 0.0, lat_vu: float = 0.0
    ) -> tuple[int, int]:
        """A full-duplex link: two directed edges; returns (u->v id, v->u id).

        An edge's latency is its cable plus the switch it leads into, so a path's latency
        is the sum over its edges."""
        i = len(self.edges)
        self.edges.append((u, v, capacity, lat_uv, kind))
        self.edges.append((v, u, capacity, lat_vu, kind))
        return i, i + 1


def nodes_needed(spec: ClusterSpec, n_gpus: int | None, source: str = "") -> int:
    """How many nodes a job of n_gpus occupies; too many GPUs is a SpecError."""
    if n_gpus is None:
        return spec.nodes
    if n_gpus < 1:
        raise SpecError(source or spec.name, "gpus", f"must be at least 1, got {n_gpus}")
    if n_gpus > spec.total_gpus:
        raise SpecError(
            source or spec.name,
            "gpus",
            f"{n_gpus} GPUs requested but cluster {spec.name!r} has {spec.total_gpus} "
            f"({spec.nodes} nodes x {spec.node.gpus_per_node})",
        )
    return math.ceil(n_gpus / spec.node.gpus_per_node)


def build_cluster(spec: ClusterSpec, n_gpus: int | None = None, source: str = "") -> Cluster:
    """Build the graph for the nodes a job of n_gpus uses (all nodes when None)."""
    node, fab = spec.node, spec.fabric
    catalog.gpu(node.gpu, source or spec.name, "node.gpu")
    n_nodes = nodes_needed(spec, n_gpus, source)
    gpn, nics = node.gpus_per_node, node.nics.count
    if nics > gpn:
        raise SpecError(source or spec.name, "node.nics.count", f"{nics} NICs for {gpn} GPUs")
    intra_bw = node.intra_bandwidth or (
        catalog.gpu(node.gpu).nvlink_bandwidth
        if node.interconnect == "nvswitch"
        else node.pcie_bandwidth
    )
    book = _EdgeBook()
    to_switch = fab.link_latency + fab.switch_latency

    n_gpus_all = n_nodes * gpn
    gpu_hub = np.empty((n_gpus_all, 2), dtype=np.int64)
    gpu_nic = np.empty((n_gpus_all, 2), dtype=np.int64)
    for k in range(n_nodes):
        for i in range(gpn):
            g = k * gpn + i
            gpu_hub[g] = book.link(f"gpu{g}", f"hub{k}", intra_bw, node.interconnect)
            gpu_nic[g] = book.link(
                f"gpu{g}", f"nic{k}.{i * nics // gpn}", node.pcie_bandwidth, "pcie"
            )

    # Leaves: plain, one leaf takes all NICs of nodes_per_leaf nodes; rail-optimised, a
    # scalable unit of nodes_per_leaf nodes has one leaf per rail (NIC index).
    n_nics = n_nodes * nics
    unit = np.arange(n_nodes) // fab.nodes_per_leaf
    nic_node = np.arange(n_nics) // nics
    nic_rail = np.arange(n_nics) % nics
    leaf_of_nic = unit[nic_node] * nics + nic_rail if node.rail_optimized else unit[nic_node]
    n_leaves = int(leaf_of_nic.max()) + 1
    order = np.argsort(leaf_of_nic, kind="stable")
    port_of_nic = np.empty(n_nics, dtype=np.int64)
    port_of_nic[order] = np.arange(n_nics) - np.searchsorted(leaf_of_nic[order], leaf_of_nic[order])
    nic_leaf = np.empty((n_nics, 2), dtype=np.int64)
    for n in range(n_nics):
        nic_leaf[n] = book.link(
            f"nic{nic_node[n]}.{nic_rail[n]}",
            f"leaf{leaf_of_nic[n]}",
            node.nics.bandwidth,
            fab.kind,
            to_switch,
            fab.link_latency,
        )

    # Spines: a leaf's uplink capacity is its downlink capacity / oversubscription, spread
    # over as many spines as it has uplink ports (merged past MAX_PARALLEL_SWITCHES).
    ports_per_leaf = np.bincount(leaf_of_nic, minlength=n_leaves).max()
    if fab.uplinks_per_leaf is None:
        uplinks = max(1, math.ceil(ports_per_leaf / fab.oversubscription[0]))
        leaf_up_bw = ports_per_leaf * node.nics.bandwidth / fab.oversubscription[0]
    else:
        uplinks = fab.uplinks_per_leaf
        leaf_up_bw = uplinks * node.nics.bandwidth
    spines_per_pod = max(1, min(uplinks, MAX_PARALLEL_SWITCHES))
    leaf_spine_bw = leaf_up_bw / spines_per_pod
    leaves_per_pod = fab.leaves_per_pod if fab.tiers == 3 else n_leaves
    pod_of_leaf = np.arange(n_leaves) // leaves_per_pod
    multi_leaf = n_leaves > 1 and uplinks > 0
    leaf_spine = np.full((n_leaves, spines_per_pod, 2), -1, dtype=np.int64)
    if multi_leaf:
        for leaf in range(n_leaves):
            for j in range(spines_per_pod):
                spine = pod_of_leaf[leaf] * spines_per_pod + j
                leaf_spine[leaf, j] = book.link(
                    f"leaf{leaf}", f"spine{spine}", leaf_spine_bw, fab.kind, to_switch, to_switch
                )

    n_pods = int(pod_of_leaf.max()) + 1
    spine_core = None
    if fab.tiers == 3 and n_pods > 1:
        oversub = fab.oversubscription[1] if len(fab.oversubscription) > 1 else 1.0
        spine_up_bw = leaves_per_pod * leaf_spine_bw / oversub
        cores = min(max(1, math.ceil(spine_up_bw / node.nics.bandwidth)), MAX_PARALLEL_SWITCHES)
        spine_core = np.empty((n_pods * spines_per_pod, cores, 2), dtype=np.int64)
        for s in range(n_pods * spines_per_pod):
            for c in range(cores):
                spine_core[s, c] = book.link(
                    f"spine{s}", f"core{c}", spine_up_bw / cores, fab.kind, to_switch, to_switch
                )

    graph = nx.DiGraph()
    graph.add_edges_from(
        (u, v, {"id": i, "capacity": cap, "latency": lat, "kind": kind})
        for i, (u, v, cap, lat, kind) in enumerate(book.edges)
    )
    _label_nodes(graph)
    if not nx.is_weakly_connected(graph):
        raise SpecError(source or spec.name, "fabric", "the fabric is disconnected")
    return Cluster(
        spec=spec,
        graph=graph,
        n_nodes=n_nodes,
        gpus_per_node=gpn,
        nics_per_node=nics,
        capacity=np.array([e[2] for e in book.edges]),
        edge_latency=np.array([e[3] for e in book.edges]),
        gpu_hub=gpu_hub,
        gpu_nic=gpu_nic,
        nic_leaf=nic_leaf,
        leaf_of_nic=leaf_of_nic,
        port_of_nic=port_of_nic,
        leaf_spine=leaf_spine,
        pod_of_leaf=pod_of_leaf,
        spine_core=spine_core,
        spines_per_pod=spines_per_pod,
        rack_of_node=unit,
        names=[f"{u}->{v}" for u, v, *_ in book.edges],
    )


def _label_nodes(graph: nx.DiGraph) -> None:
    """Tag each vertex with its kind (gpu, hub, nic, leaf, spine, core) for drawing and tests."""
    for name in graph.nodes:
        graph.nodes[name]["kind"] = name.rstrip("0123456789.")
