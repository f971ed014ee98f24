"""Build the cluster graph: GPUs, node hubs (NVSwitch or PCIe switch), NICs, leaf/spine/core.

Every physical link is two directed edges (full duplex), each with a capacity in bytes/s
and an integer id. Beside the edges the Cluster keeps numpy tables from structural
coordinates (GPU, NIC port, leaf, spine) to edge ids, so routing thousands of flows is
array indexing rather than graph search; tests check those routes against networkx
shortest paths. The edges are built as arrays (a 131,072-GPU fabric in about a second);
the networkx graph and the edge names are made only when asked for.

A NIC port is what routing calls a node's NIC (a rail): a dual-port NIC is two ports behind
one PCIe link, each to its own ToR. Several planes are independent fabrics (their own
leaves, spines, cores); with adaptive routing (packet spraying) a leaf's uplinks, and a
pod's spine uplinks, are evenly loaded, so each set is one edge of their summed capacity.
Network links carry the fabric's effective throughput (topology.fabric.throughput).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx
import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from commsim import catalog
from commsim.specs import ClusterSpec, SpecError
from commsim.topology import fabric as fabric_shape

MAX_PARALLEL_SWITCHES = 64  # beyond this, parallel uplinks are merged into fatter edges
VERTEX_KINDS = ("gpu", "hub", "nic", "leaf", "spine", "core")


@dataclass
class Cluster:
    """A built cluster: its edges plus the index tables that routing reads.

    allocation: the GPUs a job runs on, in the scheduler's order (None: the first GPUs);
    background: other jobs' flows that share the fabric with this one (topology.jobs);
    symmetry: solve max-min once per orbit of the fabric's symmetries (topology.symmetry)."""

    spec: ClusterSpec
    n_nodes: int
    gpus_per_node: int
    nics_per_node: int  # NIC ports per node (NICs x ports per NIC): the rails
    capacity: np.ndarray  # bytes/s per edge id
    edge_latency: np.ndarray  # seconds per edge id (cable + the switch it enters)
    gpu_hub: np.ndarray  # [gpu, 0] gpu->hub, [gpu, 1] hub->gpu
    gpu_nic: np.ndarray  # [gpu, 0] gpu->its NIC, [gpu, 1] NIC->gpu
    nic_leaf: np.ndarray  # [port, 0] port->leaf, [port, 1] leaf->port (port = node*nics + r)
    leaf_of_nic: np.ndarray
    port_of_nic: np.ndarray  # a port's index on its leaf (destination-mod-k routing)
    leaf_spine: np.ndarray  # [leaf, j, 0] up, [leaf, j, 1] down
    pod_of_leaf: np.ndarray
    spine_core: np.ndarray | None  # [spine, k, 0] up, [spine, k, 1] down (3-tier)
    spines_per_pod: int
    rack_of_node: np.ndarray  # the failure/locality domain a "rack" means: leaf or SU
    ports_per_nic: int = 1
    planes: int = 1
    physical: dict = field(default_factory=dict)  # switch and link counts as built physically
    ends: np.ndarray = field(default=None, repr=False)  # [edge] (tail, head) vertex ids
    kinds: np.ndarray = field(default=None, repr=False)  # [edge] index into link_kinds
    link_kinds: tuple = ()
    vertex_base: np.ndarray = field(default=None, repr=False)  # first id of each vertex kind
    solved_steps: dict = field(default_factory=dict, repr=False)  # routing's cache of steps
    allocation: np.ndarray | None = None
    background: object | None = None
    symmetry: bool = True

    @property
    def n_gpus(self) -> int:
        return self.n_nodes * self.gpus_per_node

    def node_of(self, gpu: np.ndarray | int) -> np.ndarray:
        return np.asarray(gpu) // self.gpus_per_node

    def nic_of(self, gpu: np.ndarray | int) -> np.ndarray:
        """Global port a GPU uses by default: the first port of its PCIe-affine NIC."""
        gpu = np.asarray(gpu)
        local = gpu % self.gpus_per_node
        nics = self.nics_per_node // self.ports_per_nic
        return (
            self.node_of(gpu) * self.nics_per_node
            + local * nics // self.gpus_per_node * self.ports_per_nic
        )

    def plane_of(self, port: np.ndarray) -> np.ndarray:
        """Plane of a global port."""
        return np.asarray(port) % self.nics_per_node % self.planes

    def rack_of(self, gpu: np.ndarray | int) -> np.ndarray:
        return self.rack_of_node[self.node_of(gpu)]

    def vertex_name(self, vertex: int) -> str:
        """'gpu3', 'hub0', 'nic1.2', 'leaf4', 'spine0', 'core1' of a vertex id."""
        kind = int(np.searchsorted(self.vertex_base, vertex, side="right")) - 1
        i = int(vertex - self.vertex_base[kind])
        if VERTEX_KINDS[kind] == "nic":
            nics = self.nics_per_node // self.ports_per_nic
            return f"nic{i // nics}.{i % nics}"
        return f"{VERTEX_KINDS[kind]}{i}"

    @cached_property
    def names(self) -> list[str]:
        """Edge id -> 'u->v'."""
        return [f"{self.vertex_name(u)}->{self.vertex_name(v)}" for u, v in self.ends.tolist()]

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The networkx graph (vertices tagged with their kind), made on first use."""
        graph = nx.DiGraph()
        graph.add_edges_from(
            (
                self.vertex_name(u),
                self.vertex_name(v),
                {
                    "id": i,
                    "capacity": float(self.capacity[i]),
                    "latency": float(self.edge_latency[i]),
                    "kind": self.link_kinds[self.kinds[i]],
                },
            )
            for i, (u, v) in enumerate(self.ends.tolist())
        )
        for name in graph.nodes:
            graph.nodes[name]["kind"] = name.rstrip("0123456789.")
        return graph

    def summary(self) -> dict[str, object]:
        """Sizes, physical switch counts and per-direction bandwidths of each tier, for
        `topo show`."""
        spec, fab, phys = self.spec, self.spec.fabric, self.physical
        leaf_up = (
            self.capacity[self.leaf_spine[0, :, 0]].sum() if self.leaf_spine[0, 0, 0] >= 0 else 0.0
        )
        over = ":1, ".join(f"{o:g}" for o in fab.oversubscription) + ":1"
        return {
            "name": spec.name,
            "description": spec.description,
            "gpu": spec.node.gpu,
            "nodes": self.n_nodes,
            "gpus": self.n_gpus,
            "gpus_per_node": self.gpus_per_node,
            "interconnect": spec.node.interconnect,
            "intra_node_Bps": float(self.capacity[self.gpu_hub[0, 0]]),
            "nics_per_node": spec.node.nics.count,
            "ports_per_nic": self.ports_per_nic,
            "nic_Bps": spec.node.nics.bandwidth,
            "nic_per_gpu_Bps": spec.node.nics.bandwidth * spec.node.nics.count / self.gpus_per_node,
            "rail_optimized": spec.node.rail_optimized,
            "fabric": f"{fab.kind}, {fab.tiers}-tier Clos, {fab.routing} routing",
            "planes": self.planes,
            "throughput": fabric_shape.throughput(spec),
            "oversubscription": over,
            "leaf_uplink_Bps": float(leaf_up),
            "pods": phys["pods"],
            "leaves": phys["leaves"],
            "spines": phys["spines"],
            "cores": phys["cores"],
            "switches": phys["switches"],
            "links": len(self.ends) // 2,
            "fabric_links": phys["nic_leaf_links"]
            + phys["leaf_spine_links"]
            + phys["spine_core_links"],
            "racks": int(self.rack_of_node.max()) + 1,
        }


class _EdgeBook:
    """Collects directed edges as arrays while the builder walks the structure."""

    def __init__(self) -> None:
        self.parts: list[tuple] = []
        self.count = 0
        self.link_kinds: list[str] = []

    def links(self, tail, head, capacity, kind: str, lat_up=0.0, lat_down=0.0) -> np.ndarray:
        """Full-duplex links tail[i] <-> head[i] (vertex ids): two directed edges each.
        Returns [..., 0] the tail->head ids and [..., 1] the head->tail ids, in tail's shape.

        An edge's latency is its cable plus the switch it leads into, so a path's latency
        is the sum over its edges."""
        tail, head = np.broadcast_arrays(np.asarray(tail), np.asarray(head))
        shape, m = tail.shape, tail.size
        if kind not in self.link_kinds:
            self.link_kinds.append(kind)
        self.parts.append(
            (tail.ravel(), head.ravel(), capacity, lat_up, lat_down, self.link_kinds.index(kind))
        )
        ids = self.count + 2 * np.arange(m, dtype=np.int64)
        self.count += 2 * m
        return np.stack([ids, ids + 1], axis=-1).reshape(*shape, 2)

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(ends, capacity, latency, kind) of every directed edge, by id."""
        ends = np.empty((self.count, 2), dtype=np.int64)
        cap, lat = np.empty(self.count), np.empty(self.count)
        kind = np.empty(self.count, dtype=np.int8)
        at = 0
        for tail, head, c, up, down, k in self.parts:
            part = slice(at, at + 2 * tail.size)
            ends[part][0::2] = np.stack([tail, head], axis=1)
            ends[part][1::2] = np.stack([head, tail], axis=1)
            cap[part], kind[part] = c, k
            lat[part][0::2], lat[part][1::2] = up, down
            at += 2 * tail.size
        return ends, cap, lat, kind


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
    """Build the edges for the nodes a job of n_gpus uses (all nodes when None)."""
    node, fab = spec.node, spec.fabric
    where = source or spec.name
    catalog.gpu(node.gpu, where, "node.gpu")
    n_nodes = nodes_needed(spec, n_gpus, source)
    gpn, nics = node.gpus_per_node, node.nics.count
    if nics > gpn:
        raise SpecError(where, "node.nics.count", f"{nics} NICs for {gpn} GPUs")
    at = fabric_shape.attachment(spec, n_nodes, source)
    intra_bw = node.intra_bandwidth or (
        catalog.gpu(node.gpu).nvlink_bandwidth
        if node.interconnect == "nvswitch"
        else node.pcie_bandwidth
    )
    factor = fabric_shape.throughput(spec)
    to_switch = fab.link_latency + fab.switch_latency
    ports = at.ports_per_node
    n_gpus_all, n_ports = n_nodes * gpn, n_nodes * ports
    t = _tiers(spec, at)
    counts = [n_gpus_all, n_nodes, n_nodes * nics, at.n_leaves, t.spine_vertices]
    base = np.concatenate([[0], np.cumsum(counts)])  # first vertex id of each kind
    gpu_v, hub_v, nic_v, leaf_v, _, _ = base

    book = _EdgeBook()
    g = np.arange(n_gpus_all)
    gpu_hub = book.links(gpu_v + g, hub_v + g // gpn, intra_bw, node.interconnect)
    nic_of_gpu = (g // gpn) * nics + (g % gpn) * nics // gpn
    gpu_nic = book.links(gpu_v + g, nic_v + nic_of_gpu, node.pcie_bandwidth, "pcie")
    port = np.arange(n_ports)
    port_bw = node.nics.bandwidth / fab.nic_ports * factor
    phys_nic = (port // ports) * nics + (port % ports) // fab.nic_ports
    nic_leaf = book.links(
        nic_v + phys_nic, leaf_v + at.leaf, port_bw, fab.kind, to_switch, fab.link_latency
    )
    leaf_spine, spine_core = _switch_links(book, spec, at, t, base)
    base = np.append(base, base[-1] + (fab.planes * t.cores if spine_core is not None else 0))
    ends, capacity, latency, kind = book.arrays()
    _check_connected(ends, int(base[-1]), where)
    return Cluster(
        spec=spec,
        n_nodes=n_nodes,
        gpus_per_node=gpn,
        nics_per_node=ports,
        capacity=capacity,
        edge_latency=latency,
        gpu_hub=gpu_hub,
        gpu_nic=gpu_nic,
        nic_leaf=nic_leaf,
        leaf_of_nic=at.leaf,
        port_of_nic=at.position,
        leaf_spine=leaf_spine,
        pod_of_leaf=at.pod_of_leaf,
        spine_core=spine_core,
        spines_per_pod=t.spines_per_pod,
        rack_of_node=np.arange(n_nodes) // fab.nodes_per_leaf,
        ports_per_nic=fab.nic_ports,
        planes=fab.planes,
        physical=fabric_shape.physical_counts(spec, n_nodes, source),
        ends=ends,
        kinds=kind,
        link_kinds=tuple(book.link_kinds),
        vertex_base=base[:-1],
    )


@dataclass(frozen=True)
class _Tiers:
    """The logical switch tiers: spines per pod and cores per plane as the graph has them
    (parallel switches merged past MAX_PARALLEL_SWITCHES, one bundle each under adaptive
    routing) and the capacity of each edge between them."""

    spines_per_pod: int
    leaf_spine_bw: float
    cores: int
    spine_core_bw: float
    multi: bool  # several leaves in a plane: spines exist
    three: bool  # several pods in a plane: cores exist
    spine_vertices: int


def _tiers(spec: ClusterSpec, at: fabric_shape.Attachment) -> _Tiers:
    """A leaf's uplink capacity is its downlink capacity / oversubscription, spread over as
    many spines as it has uplink ports; a spine's likewise over the cores."""
    fab = spec.fabric
    uplinks, leaf_up_bw = fabric_shape.leaf_uplinks(spec, int(np.bincount(at.leaf).max()))
    adaptive = fab.routing == "adaptive"
    spines = 1 if adaptive else max(1, min(uplinks, MAX_PARALLEL_SWITCHES))
    leaf_spine_bw = leaf_up_bw / spines
    link_bw = fab.uplink_bandwidth or spec.node.nics.bandwidth / fab.nic_ports
    oversub = fab.oversubscription[1] if len(fab.oversubscription) > 1 else 1.0
    spine_up_bw = at.leaves_per_pod * leaf_spine_bw / oversub
    cores = 1 if adaptive else min(max(1, math.ceil(spine_up_bw / link_bw)), MAX_PARALLEL_SWITCHES)
    multi = at.leaves_per_plane > 1 and uplinks > 0
    three = fab.tiers == 3 and at.pods_per_plane > 1 and uplinks > 0
    n_pods = at.pods_per_plane * fab.planes
    return _Tiers(
        spines, leaf_spine_bw, cores, spine_up_bw / cores, multi, three, n_pods * spines * multi
    )


def _switch_links(book: _EdgeBook, spec: ClusterSpec, at, t: _Tiers, base: np.ndarray):
    """Leaf-spine links (every leaf to each spine of its pod) and spine-core links (every
    spine to each core of its plane), at the fabric's effective throughput."""
    fab = spec.fabric
    factor = fabric_shape.throughput(spec)
    to_switch = fab.link_latency + fab.switch_latency
    leaf_v, spine_v, core_v = base[3], base[4], base[5]
    leaf_spine = np.full((at.n_leaves, t.spines_per_pod, 2), -1, dtype=np.int64)
    if t.multi:
        spine = at.pod_of_leaf[:, None] * t.spines_per_pod + np.arange(t.spines_per_pod)
        leaf_spine = book.links(
            leaf_v + np.arange(at.n_leaves)[:, None],
            spine_v + spine,
            t.leaf_spine_bw * factor,
            fab.kind,
            to_switch,
            to_switch,
        )
    if not t.three:
        return leaf_spine, None
    s = np.arange(at.pods_per_plane * fab.planes * t.spines_per_pod)
    plane = s // (at.pods_per_plane * t.spines_per_pod)
    spine_core = book.links(
        spine_v + s[:, None],
        core_v + plane[:, None] * t.cores + np.arange(t.cores),
        t.spine_core_bw * factor,
        fab.kind,
        to_switch,
        to_switch,
    )
    return leaf_spine, spine_core


def _check_connected(ends: np.ndarray, n_vertices: int, where: str) -> None:
    """Every vertex reaches every other (the edges are duplex): a SpecError otherwise."""
    ones = np.ones(len(ends), dtype=np.int8)
    adjacency = coo_matrix((ones, (ends[:, 0], ends[:, 1])), shape=(n_vertices, n_vertices))
    if connected_components(adjacency, directed=False)[0] > 1:
        raise SpecError(where, "fabric", "the fabric is disconnected")
