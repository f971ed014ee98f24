"""Communication priced on a cluster, for replaying an execution graph there.

Ranks take GPUs by a placement (topology.placement); every process group of one
description (the replicas of one parallel dimension) runs a collective at the same time,
so a collective is priced on all of them at once (step.groups.concurrent_cost, as the step
model prices a group kind), with the algorithm a layout names (step.groups.op_algorithm).
Sends are priced as every send pair of their group's description at once (routing
.step_time, as the step model prices stage hand-offs). Compute keeps its recorded time;
ops commsim has no model for (barrier, reduce, gather) and collectives of unknown size or
group keep theirs too, and are counted in `kept`.
"""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms import ALGORITHMS
from commsim.step.groups import concurrent_cost, op_algorithm
from commsim.topology.build import Cluster
from commsim.topology.placement import place
from commsim.topology.routing import step_time
from commsim.traces.graph import Graph, Node


class ClusterPricer:
    """node -> seconds on `cluster` (see the module docstring)."""

    def __init__(
        self,
        graph: Graph,
        cluster: Cluster,
        n_gpus: int,
        algorithm: str = "auto",
        placement: str = "blocked",
        ps_shards: int = 1,
    ):
        self.graph, self.cluster, self.algorithm = graph, cluster, algorithm
        self.ps_shards = ps_shards  # servers of a parameter server ("ps"): on dp groups only
        self.gpu = place(cluster, n_gpus, placement)
        self.n = n_gpus
        self.kept: set[str] = set()
        self._costs: dict[tuple[str, int], object] = {}
        self._pairs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._cache: dict[tuple, float] = {}

    def _gpus(self, ranks) -> np.ndarray:
        ranks = np.asarray(ranks, dtype=np.int64)
        if ranks.size and ranks.max() >= self.n:
            raise ValueError(f"rank {int(ranks.max())} outside the {self.n} GPUs priced")
        return self.gpu[ranks]

    def _cost(self, desc: str, size: int):
        """All groups of one description and size, at once."""
        if (desc, size) not in self._costs:
            rows = [r for d, r in self.graph.groups.values() if d == desc and len(r) == size]
            shards = self.ps_shards if desc == "dp" else 1  # as step.groups.Groups.price
            self._costs[(desc, size)] = concurrent_cost(self.cluster, self._gpus(rows), shards)
        return self._costs[(desc, size)]

    def _send_pairs(self, desc: str) -> tuple[np.ndarray, np.ndarray]:
        """Every pair of ranks that sends within groups of one description, once each, in the
        direction its sender sends first (a pipeline's warm-up forwards: the step model
        prices every stage's hand-off one way at once, interleaved schedules' last-to-first
        stage hand-off too, which a lower-to-higher rule would turn against the others)."""
        if desc not in self._pairs:
            first: dict[tuple[int, int], int] = {}  # (src, dst) -> sender's node index
            for r, nodes in self.graph.ranks.items():
                for j, n in enumerate(nodes):
                    if n.kind == "send" and n.peer is not None and self._desc(n) == desc:
                        first.setdefault((r, n.peer), j)
            pairs = {
                (a, b)
                for (a, b), j in first.items()
                if (j, a) < (first.get((b, a), np.inf), b)  # the pair's first direction
            }
            src, dst = (np.array(x, dtype=np.int64) for x in zip(*sorted(pairs), strict=True))
            self._pairs[desc] = (self._gpus(src), self._gpus(dst))
        return self._pairs[desc]

    def _desc(self, node: Node) -> str:
        return self.graph.groups[node.pg][0] if node.pg in self.graph.groups else ""

    def __call__(self, rank: int, node: Node) -> float:
        if node.kind in ("comp", "recv"):
            return node.duration
        if node.kind == "send":
            if node.peer is None:
                self.kept.add("send without a peer")
                return node.duration
            key = ("send", self._desc(node), node.bytes)
            if key not in self._cache:
                src, dst = self._send_pairs(self._desc(node))
                self._cache[key] = step_time(self.cluster, src, dst, np.full(src.size, node.bytes))
            return self._cache[key]
        if node.op not in ALGORITHMS or node.pg is None or node.bytes <= 0:
            self.kept.add(
                node.op if node.op not in ALGORITHMS else f"{node.op} of unknown size or group"
            )
            return node.duration
        desc, ranks = self.graph.groups[node.pg]
        key = ("coll", desc, len(ranks), node.op, node.bytes)
        if key not in self._cache:
            cost = self._cost(desc, len(ranks))
            alg = op_algorithm(node.op, self.algorithm)
            self._cache[key] = (
                0.0 if cost is None else float(cost.time(node.op, alg, node.bytes)[0])
            )
        return self._cache[key]
