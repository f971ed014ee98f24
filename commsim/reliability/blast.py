"""What a job runs on, part by part, and what each part's failure takes down: its blast radius.

A GPU, HBM, NIC or host failure takes its node out; a software failure kills the processes of
one rank. Switches and cables are places in the cluster graph (commsim.topology.build):

  leaf              its NICs' nodes go down (all of a node's NICs on a plain fabric; one rail
                    of every node in the scalable unit on a rail-optimised one: the node
                    cannot run its rail, so it is out too)
  NIC cable         its node goes down

A node is out when one of its NICs loses every port: a dual-port NIC whose ports go to two
ToRs (Alibaba HPN's dual-ToR, dual-plane design) keeps running on the other port at half its
bandwidth, so a ToR or a port cable degrades the job instead of stopping it.
  leaf uplink       degrades the leaf's uplink bandwidth (the fabric routes around it), or,
                    when it is the leaf's only uplink, cuts the leaf's nodes off
  spine, spine uplink, core
                    degrade likewise while another path remains; a pod's only spine or a
                    fabric's only core cuts off what hangs below it

These rules read the structure tables; tests check them on small fabrics against the graph
itself (remove the part, see which NICs can no longer reach the others).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsim.topology.build import Cluster


@dataclass(frozen=True)
class Blast:
    """What one failure does: nodes out of service, or links that lose their capacity."""

    nodes: np.ndarray  # node ids taken down (empty: the job keeps running)
    edges: np.ndarray  # directed edge ids that fail (a degraded fabric routes around them)

    @property
    def interrupts(self) -> bool:
        return self.nodes.size > 0


@dataclass(frozen=True)
class Exposure:
    """One kind of part the job runs on: how many, of which failure class, and how many of
    them stop the job when they fail (the rest degrade it)."""

    part: str  # gpu, hbm, software, nic, host, leaf, spine, core, nic cable, leaf uplink, ...
    cls: str  # failure class (commsim.reliability.rates.CLASSES)
    units: int
    interrupting: int
    nodes_out: float  # nodes out of service per interrupting failure (0: software)


def physical_nics(cluster: Cluster) -> int:
    """NIC cards per node (a dual-port card is one NIC of two ports)."""
    return cluster.nics_per_node // cluster.ports_per_nic


def cut_off(cluster: Cluster, dead_ports: np.ndarray) -> np.ndarray:
    """Nodes with a NIC all of whose ports are dead (a boolean per global port; a NIC's
    ports are consecutive, topology.build)."""
    nic_dead = dead_ports.reshape(-1, cluster.ports_per_nic).all(axis=1)
    return np.unique(np.nonzero(nic_dead)[0] // physical_nics(cluster))


def leaf_nodes(cluster: Cluster, leaf: int) -> np.ndarray:
    return cut_off(cluster, cluster.leaf_of_nic == leaf)


def _pod_nodes(cluster: Cluster, pod: int) -> np.ndarray:
    leaves = np.nonzero(cluster.pod_of_leaf == pod)[0]
    return cut_off(cluster, np.isin(cluster.leaf_of_nic, leaves))


def _leaf_edges(cluster: Cluster, leaf: int) -> np.ndarray:
    """A leaf's links: its ports' cables and its uplinks (a failed leaf that cuts no node
    off leaves the fabric without them)."""
    edges = [cluster.nic_leaf[cluster.leaf_of_nic == leaf].ravel()]
    if cluster.leaf_spine[0, 0, 0] >= 0:
        edges.append(cluster.leaf_spine[leaf].ravel())
    return np.concatenate(edges)


def _switch_counts(cluster: Cluster) -> tuple[int, int, int, int]:
    """(leaves, pods, spines per pod, cores); spines and cores are 0 where the fabric has none."""
    leaves = cluster.pod_of_leaf.size
    pods = int(cluster.pod_of_leaf.max()) + 1
    spines = cluster.spines_per_pod if cluster.leaf_spine[0, 0, 0] >= 0 else 0
    cores = cluster.spine_core.shape[1] if cluster.spine_core is not None else 0
    return leaves, pods, spines, cores


def blast_radius(cluster: Cluster, part: str, index: int | tuple[int, int]) -> Blast:
    """The blast radius of one switch or cable: `part` is leaf, spine, core (index: its id),
    nic cable (the NIC's global index), leaf uplink (leaf, j) or spine uplink (spine, k)."""
    none = np.array([], dtype=np.int64)
    _, pods, spines, cores = _switch_counts(cluster)
    if part == "leaf":
        nodes = leaf_nodes(cluster, int(index))
        return Blast(nodes, none if nodes.size else _leaf_edges(cluster, int(index)))
    if part == "nic cable":
        port = int(index)  # type: ignore[arg-type]
        dead = np.arange(cluster.n_nodes * cluster.nics_per_node) == port
        return Blast(cut_off(cluster, dead), cluster.nic_leaf[port])
    if part == "leaf uplink":
        leaf, j = index  # type: ignore[misc]
        if spines == 1:
            return Blast(leaf_nodes(cluster, leaf), cluster.leaf_spine[leaf, j])
        return Blast(none, cluster.leaf_spine[leaf, j])
    if part == "spine":
        spine = int(index)  # type: ignore[arg-type]
        pod, j = divmod(spine, cluster.spines_per_pod)
        leaves = np.nonzero(cluster.pod_of_leaf == pod)[0]
        edges = [cluster.leaf_spine[leaves, j].ravel()]
        if cluster.spine_core is not None:
            edges.append(cluster.spine_core[spine].ravel())
        edges = np.concatenate(edges)
        return Blast(_pod_nodes(cluster, pod) if spines == 1 else none, edges)
    if part == "spine uplink":
        spine, k = index  # type: ignore[misc]
        pod = spine // cluster.spines_per_pod
        edges = cluster.spine_core[spine, k]  # type: ignore[index]
        cut = spines == 1 and cores == 1
        return Blast(_pod_nodes(cluster, pod) if cut else none, edges)
    if part == "core":
        edges = cluster.spine_core[:, int(index)].ravel()  # type: ignore[index]
        cut = cores == 1 and pods > 1
        return Blast(np.arange(cluster.n_nodes) if cut else none, edges)
    raise ValueError(f"unknown part {part!r}")


def fabric_parts(cluster: Cluster) -> list[tuple[str, str, list]]:
    """(part, class, indices) of every switch and cable of the fabric the job uses."""
    leaves, pods, spines, cores = _switch_counts(cluster)
    parts: list[tuple[str, str, list]] = [
        ("leaf", "switch", list(range(leaves))),
        ("nic cable", "cable", list(range(cluster.n_nodes * cluster.nics_per_node))),
    ]
    if spines:
        parts.append(("spine", "switch", list(range(pods * spines))))
        links = [(leaf, j) for leaf in range(leaves) for j in range(spines)]
        parts.append(("leaf uplink", "cable", links))
    if cores:
        parts.append(("core", "switch", list(range(cores))))
        ups = [(s, k) for s in range(pods * spines) for k in range(cores)]
        parts.append(("spine uplink", "cable", ups))
    return parts


def _fabric_exposure(cluster: Cluster, part: str, cls: str, indices: list) -> Exposure:
    """Count the interrupting units of one kind of fabric part. Within a kind every unit
    behaves alike (the rules above depend on the kind and the fabric's redundancy), except
    for how many nodes hang below it; the cheap kinds are walked in full."""
    k = cluster.ports_per_nic
    if part == "nic cable":  # a port's cable stops its node only when it is the NIC's only one
        return Exposure(part, cls, len(indices), len(indices) if k == 1 else 0, float(k == 1))
    if part == "leaf":  # nodes with a NIC whose every port is on the leaf
        ports = cluster.leaf_of_nic.reshape(-1, k)
        whole = (ports == ports[:, :1]).all(axis=1)  # NICs with all their ports on one leaf
        node = np.arange(ports.shape[0]) // physical_nics(cluster)
        pairs = np.unique(ports[whole, 0] * cluster.n_nodes + node[whole])
        sizes = np.bincount(pairs // cluster.n_nodes, minlength=len(indices))
        hit = sizes[sizes > 0]
        return Exposure(part, cls, len(indices), hit.size, float(hit.mean()) if hit.size else 0.0)
    first = blast_radius(cluster, part, indices[0])
    if not first.interrupts:
        return Exposure(part, cls, len(indices), 0, 0.0)
    sizes = [blast_radius(cluster, part, i).nodes.size for i in indices]
    return Exposure(part, cls, len(indices), len(indices), float(np.mean(sizes)))


def exposures(cluster: Cluster, n_gpus: int) -> list[Exposure]:
    """Every kind of part a job of n_gpus runs on (the cluster built for its GPUs)."""
    nodes = -(-n_gpus // cluster.gpus_per_node)
    out = [
        Exposure("gpu", "gpu", n_gpus, n_gpus, 1.0),
        Exposure("hbm", "hbm", n_gpus, n_gpus, 1.0),
        Exposure("software", "software", n_gpus, n_gpus, 0.0),
        Exposure("nic", "nic", nodes * physical_nics(cluster), nodes * physical_nics(cluster), 1.0),
        Exposure("host", "host", nodes, nodes, 1.0),
    ]
    if nodes > 1:  # a single node never touches the fabric
        out += [_fabric_exposure(cluster, *p) for p in fabric_parts(cluster)]
    return out
