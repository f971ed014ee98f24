"""Measured collectives placed on the cluster: where each rank ran (placement), the widest
tier a group crosses (span), every measured collective of two or more ranks as a Point
(collect_points) with why commsim does not price it as measured where it does not
(unmodelled), and how much a parameter must move a point to count as determined
(MIN_SHARE), which both fits use."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsim.calibrate.records import MetaRecord, Results
from commsim.specs import ClusterSpec, SpecError

MIN_SHARE = 1e-3  # a parameter moving no point's time by this much is not fitted


@dataclass(frozen=True)
class Point:
    """One measured collective placed on the cluster."""

    run: str
    line: int
    op: str
    group: tuple[int, ...]  # world ranks
    gpus: tuple[int, ...]  # the GPU each group rank ran on
    bytes: float
    measured_s: float  # the slowest rank's time (per-rank records: the largest)
    span: str  # the widest tier the group crosses
    timing: str = "slowest-rank"  # whose clock (records.Timing)
    repeats: tuple[float, ...] = ()  # each repeat's time in that convention, if recorded
    unmodelled: str = ""  # why commsim does not price it as measured (fits leave it out)


def placement(meta: MetaRecord, spec: ClusterSpec, source: str = "results") -> np.ndarray:
    """GPU of each world rank, from where the ranks ran.

    Racks (COMMSIM_RACK) in order of first appearance take leaves 0, 1, ...; hosts in a
    rack take its nodes in order of first appearance; without rack labels hosts take nodes
    0, 1, ... A host's ranks take its GPUs by LOCAL_RANK (else rank). Only the structure
    matters: which ranks share a node and which nodes share a rack."""
    gpn, per_rack = spec.node.gpus_per_node, spec.fabric.nodes_per_leaf
    ranks = sorted(meta.ranks, key=lambda r: r.rank)
    hosts = meta.hosts
    if all(r.rack is not None for r in ranks):
        rack_of: dict[str, str] = {}
        for r in ranks:
            if rack_of.setdefault(r.host, r.rack) != r.rack:  # type: ignore[arg-type]
                raise SpecError(source, "placement", f"host {r.host!r} is in two racks")
        racks = list(dict.fromkeys(rack_of[h] for h in hosts))
        node_of: dict[str, int] = {}
        for k, rack in enumerate(racks):
            members = [h for h in hosts if rack_of[h] == rack]
            if len(members) > per_rack:
                raise SpecError(
                    source,
                    "placement",
                    f"rack {rack!r} ran {len(members)} hosts but cluster {spec.name!r} has "
                    f"{per_rack} nodes per rack",
                )
            node_of.update({h: k * per_rack + i for i, h in enumerate(members)})
    else:
        node_of = {h: i for i, h in enumerate(hosts)}
    if max(node_of.values()) >= spec.nodes:
        raise SpecError(
            source,
            "placement",
            f"the run needs node {max(node_of.values()) + 1} but cluster {spec.name!r} has "
            f"{spec.nodes} nodes",
        )
    gpu = np.empty(len(ranks), dtype=np.int64)
    for host in hosts:
        mine = sorted(
            (r for r in ranks if r.host == host),
            key=lambda r: (r.local_rank if r.local_rank is not None else r.rank, r.rank),
        )
        if len(mine) > gpn:
            raise SpecError(
                source,
                "placement",
                f"host {host!r} ran {len(mine)} ranks but cluster {spec.name!r} has {gpn} "
                "GPUs per node",
            )
        for local, r in enumerate(mine):
            gpu[r.rank] = node_of[host] * gpn + local
    return gpu


def span(spec: ClusterSpec, gpus) -> str:
    """The widest tier a group crosses: one node, one rack, or several racks."""
    nodes = np.asarray(gpus) // spec.node.gpus_per_node
    if np.unique(nodes).size == 1:
        return "intra-node"
    if np.unique(nodes // spec.fabric.nodes_per_leaf).size == 1:
        return "inter-node"
    return "cross-rack"


# gloo's pairwise exchanges (gloo/alltoall.cc, gloo/allgather.cc, batch_isend_irecv in the
# order given): each rank posts its send to a peer before its receive from that peer. The
# TCP transport (gloo/transport/tcp/pair.cc) sends a payload only once the peer has
# announced the matching receive (NOTIFY_RECV_READY), and announcements queue behind the
# payloads already going out on the pair; so when one rank's payload leaves first, the
# peer's waits for it: the two directions take turns. How much depends on which rank posts
# first (measured on the testbed: a 2-rank send-recv 1x or 2x the one-way time, a 2-rank
# all-gather 1.5x, an all-to-all 1-2x); commsim prices them as concurrent.
PAIRWISE = (
    "gloo posts each send before the receive from the same peer, and its TCP transport "
    "sends only after the peer announces that receive, so the two directions of a pair "
    "take turns by as much as which rank posts first decides (1-2x the concurrent time): "
    "not modelled"
)


def unmodelled(op: str, n: int, timing: str, backend: str) -> str:
    """Why commsim does not price `op` on n ranks as measured (in `timing`), or ""."""
    if backend == "gloo" and op == "all-to-all":
        return f"gloo all-to-all: every pair of ranks exchanges both ways; {PAIRWISE}"
    if backend == "gloo" and n == 2 and op in ("all-gather", "send-recv"):
        return f"gloo {op} on 2 ranks is a pairwise exchange; {PAIRWISE}"
    if timing == "rank0" and op == "broadcast":
        return (
            "rank 0 timed a broadcast it is the root of: the root returns once its sends are "
            "handed to the transport, before the others have the data"
        )
    return ""


def collect_points(results: Results, spec: ClusterSpec) -> tuple[list[Point], list[str]]:
    """Every measured collective of a group of two or more, placed; and notes on what was
    left out (unsupported ops)."""
    points, notes = [], []
    for run_id, run in results.runs.items():
        gpu = placement(run.meta, spec, results.where(run_id))
        for line, rec in run.collectives:
            if rec.status != "ok":
                notes.append(f"{rec.op} unsupported by {run.meta.backend} in run {run_id}")
                continue
            if len(rec.group) < 2:
                continue
            gpus = tuple(int(g) for g in gpu[rec.group])
            measured = max(rec.rank_times_s) if rec.timing == "per-rank" else rec.time_s
            points.append(
                Point(
                    run_id,
                    line,
                    rec.op,
                    tuple(rec.group),
                    gpus,
                    float(rec.bytes),  # type: ignore[arg-type]
                    float(measured),  # type: ignore[arg-type]
                    span(spec, gpus),
                    rec.timing,
                    tuple(rec.times_s or ()),
                    unmodelled(rec.op, len(rec.group), rec.timing, run.meta.backend),
                )
            )
    return points, list(dict.fromkeys(notes))
