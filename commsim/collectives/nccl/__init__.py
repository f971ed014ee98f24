"""NCCL as a backend of the collective engine: its tuner's cost model by version
(tables), what its topology search gives a communicator (topo), the per-communicator
latency and bandwidth tables, the per-call time, its choice of algorithm x protocol and
channels (model), restricted by NCCL_ALGO / NCCL_PROTO (overrides). GroupCost
(collectives.group) prices a placed group with it."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from commsim.collectives.nccl import overrides
from commsim.collectives.nccl.model import LINK_CLASSES, OPS, Candidate, CommModel
from commsim.collectives.nccl.tables import (
    ALGORITHMS,
    LATEST,
    PROTOCOLS,
    RANGES,
    RING,
    TREE,
    Tables,
    parse_version,
    tables,
)
from commsim.collectives.nccl.topo import Graph, Graphs, Machine, p2p_channels, search

if TYPE_CHECKING:
    from commsim.specs import ClusterSpec

__all__ = [
    "ALGORITHMS",
    "LATEST",
    "LINK_CLASSES",
    "OPS",
    "PROTOCOLS",
    "RANGES",
    "RING",
    "TREE",
    "Candidate",
    "CommModel",
    "Graph",
    "Graphs",
    "Machine",
    "Tables",
    "comm_model",
    "p2p_channels",
    "parse_version",
    "search",
    "tables",
]

# commsim's algorithm names that are NCCL algorithms: under NCCL they run as NCCL's (its
# tuner picks the protocol); commsim's others (rhd, ps, hierarchical, ...) keep their graph
# schedules
NAMES = {"ring": RING, "tree": TREE}


def comm_model(spec: ClusterSpec, ranks: int, nodes: int, local: int | None = None) -> CommModel:
    """NCCL's model of a communicator of `ranks` ranks on `nodes` nodes of the cluster
    (at most `local` on one node), with the spec's NCCL version and fitted parameters;
    cached by what it depends on."""
    nccl = spec.nccl
    return _cached(
        Machine.from_spec(spec),
        nccl.version,
        int(ranks),
        int(nodes),
        int(local or -(-ranks // nodes)),
        tuple(sorted(nccl.latency_scale.items())),
        (nccl.algo, nccl.proto),
    )


@lru_cache(maxsize=4096)
def _cached(machine, version, ranks, nodes, local, scale, env) -> CommModel:
    chosen = overrides.parse(*env, version)
    return CommModel(machine, tables(version), ranks, nodes, local, dict(scale), chosen)
