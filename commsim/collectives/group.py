"""What a collective costs among one group of ranks placed on the cluster, by any
registered algorithm (gloo's own too), 'auto', a backend table's 'a|b' or 'nccl'.

The algorithm's schedule is evaluated on the graph (routes, link sharing, oversubscription)
at powers of two of the size, cached, and interpolated linearly in between. Within a step
every flow scales with the size, so rates and finishing order do not change and the time
is affine in the size: the interpolation is exact for every unpipelined algorithm. The
pipelined ones (tree, ring broadcast) change their chunk count with the size; between
powers of two they are within 1.5% (tested). A planner asks one group about hundreds
of bucket sizes: this turns each question into two cached graph evaluations.
"""

from __future__ import annotations

import numpy as np

from commsim.collectives import backends
from commsim.collectives.algorithms import SEARCHED, algorithms_for, lookup, pipelined, runs_on
from commsim.collectives.evaluate import graph_time
from commsim.collectives.nccl import nccl_like_choice
from commsim.topology.build import Cluster


def _ranks_per_node(cluster: Cluster, gpus: np.ndarray) -> int:
    """g when the ranks come in runs of g consecutive ranks on one node each (the last run
    may be shorter: a partial node, on which whole-node algorithms cannot run), else 1."""
    node = cluster.node_of(gpus)
    run = int(np.argmax(node != node[0])) or node.size
    if node.size % run:
        return run
    rows = node.reshape(-1, run)
    whole = (rows == rows[:, :1]).all() and np.unique(rows[:, 0]).size == rows.shape[0]
    return run if whole else 1


class GroupCost:
    """Collective times for ranks 0..n-1 running on GPUs `gpu_of_rank` of `cluster`."""

    def __init__(self, cluster: Cluster, gpu_of_rank: np.ndarray, ps_shards: int = 1):
        """gpu_of_rank: one group's GPUs in rank order, or a 2-D array of groups that run
        the same collective at the same time (they share the fabric; all are priced)."""
        self.cluster = cluster
        self.gpus = np.asarray(gpu_of_rank, dtype=np.int64)
        self.n = self.gpus.shape[-1]
        self.ps_shards = ps_shards
        # The schedules treat consecutive groups of gpus_per_node ranks as one node and run
        # one ring channel per NIC rail, as NCCL does. Like NCCL, read the node structure off
        # where the ranks are: runs of equal length on one node each, else one rank a node.
        self.gpus_per_node = _ranks_per_node(cluster, np.atleast_2d(self.gpus)[0])
        self.channels = cluster.nics_per_node if self.gpus_per_node > 1 else 1
        self._cache: dict[tuple[str, str, float], float] = {}

    def _graph_time(self, op: str, algorithm: str, size: float) -> float:
        key = (op, algorithm, float(size))
        if key not in self._cache:
            self._cache[key] = graph_time(
                op,
                algorithm,
                float(size),
                self.cluster,
                self.gpus,
                gpus_per_node=self.gpus_per_node,
                channels=self.channels,
                ps_shards=self.ps_shards,
            )
        return self._cache[key]

    def algorithms(self, op: str) -> tuple[str, ...]:
        """The algorithms `auto` chooses among for `op` on this group (algorithms.SEARCHED):
        those needing whole nodes only where the group is whole nodes (algorithms.runs_on)."""
        algorithms_for(op)
        return tuple(a for a in SEARCHED[op] if runs_on(op, a, self.n, self.gpus_per_node))

    def _times(self, op: str, algorithm: str, sizes: np.ndarray) -> np.ndarray:
        """Graph time of one algorithm at each size. Unpipelined schedules are affine in the
        size (see the module docstring): two cached graph evaluations give every size. A
        pipelined one (tree, ring broadcast) is interpolated between the powers of two
        around each size (exact at a power of two), each evaluated once and cached."""
        if not pipelined(op, algorithm):
            intercept, slope = self.affine(op, algorithm)
            return intercept + slope * sizes
        out = np.empty(sizes.shape)
        tiny = sizes <= 1.0
        for i in np.nonzero(tiny)[0]:
            out[i] = self._graph_time(op, algorithm, sizes[i])
        big = sizes[~tiny]
        lo = 2.0 ** np.floor(np.log2(big))
        points = np.unique(np.concatenate([lo, 2 * lo]))
        at = np.array([self._graph_time(op, algorithm, float(x)) for x in points])
        t_lo, t_hi = at[np.searchsorted(points, lo)], at[np.searchsorted(points, 2 * lo)]
        out[~tiny] = t_lo + (t_hi - t_lo) * (big - lo) / lo
        return out

    def _candidates(self, op: str, algorithm: str) -> tuple[str, ...]:
        """What `algorithm` names: 'auto' every algorithm auto chooses among that runs on
        this group; 'a|b' (a backend table's "the faster of") those of a, b that run on it
        (algorithms.runs_on); else the one algorithm."""
        if algorithm == "auto":
            return self.algorithms(op)
        names = tuple(algorithm.split("|"))
        for name in names:
            lookup(op, name)  # a ValueError naming the choices for an unknown one
        if len(names) == 1:
            return names
        runnable = tuple(a for a in names if runs_on(op, a, self.n, self.gpus_per_node))
        if not runnable:
            raise ValueError(
                f"none of {algorithm} runs on {self.n} ranks, {self.gpus_per_node} per node"
            )
        return runnable

    def nccl_choice(self, op: str, sizes: np.ndarray) -> list[str]:
        """The algorithm NCCL runs for each size (backends.ALGORITHMS["nccl"]): for
        all-reduce on whole nodes its tuner's ring-or-tree pick (nccl.nccl_like_choice, fed
        this group's ring bus bandwidth from the graph); otherwise the one it has for the
        op (ring; all-to-all, send-recv: direct)."""
        algorithms_for(op)  # a ValueError naming the collectives for an unknown op
        names = self._candidates(op, backends.ALGORITHMS["nccl"][op])
        if len(names) == 1:
            return [names[0]] * sizes.size
        big = 2.0**28
        busbw = 2 * (self.n - 1) / self.n * big / self._graph_time(op, "ring", big)
        names, _ = nccl_like_choice(
            self.n // self.gpus_per_node,
            self.gpus_per_node,
            sizes,
            busbw,
            channels=self.channels,
            nvlink=self.cluster.spec.node.interconnect == "nvswitch",
        )
        return [str(x) for x in np.atleast_1d(names)]

    def time_and_choice(
        self, op: str, algorithm: str, sizes: np.ndarray | float
    ) -> tuple[np.ndarray, list[str]]:
        """Seconds per size, and which algorithm ran: any registered one, 'auto' (the
        fastest per size), 'a|b' (the faster of those that run here), 'nccl' (what NCCL's
        tuner would pick)."""
        sizes = np.atleast_1d(np.asarray(sizes, dtype=float))
        if algorithm == "nccl":
            names = np.array(self.nccl_choice(op, sizes))
            times = np.empty(sizes.shape)
            for name in np.unique(names):
                mine = names == name
                times[mine] = self._times(op, str(name), sizes[mine])
            return times, names.tolist()
        candidates = self._candidates(op, algorithm)
        table = np.array([self._times(op, a, sizes) for a in candidates])
        best = np.argmin(table, axis=0)
        return table[best, np.arange(sizes.size)], [candidates[i] for i in best]

    def affine(self, op: str, algorithm: str) -> tuple[float, float]:
        """(seconds, seconds per byte): the time as intercept + slope x size, from the graph
        at 1 MiB and 256 MiB; exact for unpipelined algorithms (see the module docstring),
        so a planner can price millions of sizes with one multiply-add."""
        lo, hi = 2.0**20, 2.0**28
        t_lo, t_hi = self._graph_time(op, algorithm, lo), self._graph_time(op, algorithm, hi)
        slope = (t_hi - t_lo) / (hi - lo)
        return t_lo - slope * lo, slope

    def time(self, op: str, algorithm: str, sizes: np.ndarray | float) -> np.ndarray:
        """Seconds of `op` with `algorithm` (or 'auto', 'a|b', 'nccl') for each size in bytes."""
        return self.time_and_choice(op, algorithm, sizes)[0]
