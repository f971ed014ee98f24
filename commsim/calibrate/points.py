"""Measured collectives placed on the cluster: where each rank ran (placement), the widest
tier a group crosses (span), every measured collective of two or more ranks as a Point
(collect_points), and what the fits share: which points are outliers (inliers) and how much
a parameter must move a point to count as determined (MIN_SHARE)."""

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
    measured_s: float
    span: str  # the widest tier the group crosses


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


def collect_points(results: Results, spec: ClusterSpec) -> tuple[list[Point], list[str]]:
    """Every measured collective of a group of two or more, placed; and notes on what was
    left out (unsupported ops)."""
    points, notes = [], []
    for run_id, run in results.runs.items():
        gpu = placement(run.meta, spec, f"run {run_id}")
        for line, rec in run.collectives:
            if rec.status != "ok":
                notes.append(f"{rec.op} unsupported by {run.meta.backend} in run {run_id}")
                continue
            if len(rec.group) < 2:
                continue
            gpus = tuple(int(g) for g in gpu[rec.group])
            points.append(
                Point(
                    run_id,
                    line,
                    rec.op,
                    tuple(rec.group),
                    gpus,
                    float(rec.bytes),  # type: ignore[arg-type]
                    float(rec.time_s),  # type: ignore[arg-type]
                    span(spec, gpus),
                )
            )
    return points, list(dict.fromkeys(notes))


def inliers(resid: np.ndarray) -> np.ndarray:
    """Points within 4 robust standard deviations (1.4826 x the median absolute deviation,
    Rousseeuw & Croux 1993), or within 5%, of the median residual."""
    dev = np.abs(resid - np.median(resid))
    return dev <= max(4 * 1.4826 * float(np.median(dev)), 0.05)
