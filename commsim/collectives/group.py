"""What a collective costs among one group of ranks placed on the cluster, by any
registered algorithm (gloo's own too), 'auto', a backend table's 'a|b' or 'nccl'.

Under the NCCL backend (the cluster's `backend`, nccl on GPUs) NCCL prices what it runs:
'auto' and 'nccl' are its tuner's choice of algorithm x protocol per size, 'ring' and
'tree' its Ring and Tree (its tuner picking the protocol), for all-reduce, all-gather,
reduce-scatter and broadcast. The time is NCCL's latency for the choice plus the bytes
over the smaller of NCCL's algorithm bandwidth and the graph's: what the group's flows get
on the fabric: what commsim's ring (NCCL's Ring: its channels on the NIC rails) gets there,
for every NCCL algorithm (NCCL's own model counts Ring, Tree, NVLSTree and PAT alike, as
about half the channels' bandwidth), and 2(N-1)/N times that for the all-reduces that move
S a GPU rather than 2(N-1)/N S (the in-switch reductions NVLS, NVLSTree, CollNet). So
oversubscribed uplinks, a placement, a degraded link or groups sharing links cap it; on a
fabric that gives every flow its links' rate NCCL's own bandwidth is the lower one. commsim's
algorithms NCCL does not have (rhd, ps, hierarchical, ...), all-to-all and send-recv
keep their graph schedules. Under gloo everything runs on the graph as below.

The algorithm's schedule is evaluated on the graph (routes, link sharing, oversubscription)
at powers of two of the size, cached, and interpolated linearly in between. Within a step
every flow scales with the size, so rates and finishing order do not change and the time
is affine in the size: the interpolation is exact for every unpipelined algorithm. The
pipelined ones (tree, ring broadcast) change their chunk count with the size; between
powers of two they are within 1.5% (tested). A planner asks one group about hundreds
of bucket sizes: this turns each question into two cached graph evaluations.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from commsim.collectives import backends, nccl
from commsim.collectives.algorithms import SEARCHED, algorithms_for, lookup, pipelined, runs_on
from commsim.collectives.evaluate import graph_time
from commsim.collectives.nccl.tables import (
    ALGORITHMS as NCCL_ALGORITHMS,
)
from commsim.collectives.nccl.tables import (
    COLLNET_CHAIN,
    COLLNET_DIRECT,
    NVLS,
    NVLS_TREE,
    PROTOCOLS,
    TREE,
)
from commsim.topology.build import Cluster

ALL = -1  # NCCL's choice among all its algorithms


class NcclUnavailable(ValueError):
    """NCCL's tuner has nothing to run for a collective under the NCCL_ALGO / NCCL_PROTO set
    (NCCL's "No algorithm/protocol available"): the settings' fault, not the algorithm's."""


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

    def __init__(
        self,
        cluster: Cluster,
        gpu_of_rank: np.ndarray,
        ps_shards: int = 1,
        backend: str | None = None,
    ):
        """gpu_of_rank: one group's GPUs in rank order, or a 2-D array of groups that run
        the same collective at the same time (they share the fabric; all are priced).
        backend: "nccl" or "gloo" (default: the cluster's, ClusterSpec.comm_backend)."""
        self.cluster = cluster
        self.backend = backend or cluster.spec.comm_backend
        self.gpus = np.asarray(gpu_of_rank, dtype=np.int64)
        self.n = self.gpus.shape[-1]
        self.ps_shards = ps_shards
        # The schedules treat consecutive groups of gpus_per_node ranks as one node and run
        # one ring channel per NIC rail, as NCCL does. Like NCCL, read the node structure off
        # where the ranks are: runs of equal length on one node each, else one rank a node.
        self.gpus_per_node = _ranks_per_node(cluster, np.atleast_2d(self.gpus)[0])
        self.channels = cluster.nics_per_node if self.gpus_per_node > 1 else 1
        self._cache: dict[tuple[str, str, float], float] = {}
        self.overhead = self._overhead(cluster.spec)
        self._comm: nccl.CommModel | None = None
        self._caps: dict[tuple[str, int], float] = {}  # the graph's, whatever NCCL's settings
        self._choices: dict[tuple[str, int], tuple] = {}  # of this NCCL communicator
        self._algorithms: dict[str, tuple[str, ...]] = {}  # what runs each op here

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
        """The algorithms that run `op` on this group (algorithms.SEARCHED, what `--algorithm
        all` shows): those needing whole nodes only where the group is whole
        nodes (algorithms.runs_on), but NCCL's own (its Tree) run on any group under NCCL,
        unless NCCL_ALGO / NCCL_PROTO leave NCCL none of that algorithm's candidates."""
        if op not in self._algorithms:
            algorithms_for(op)
            self._algorithms[op] = tuple(a for a in SEARCHED[op] if self._runs(op, a))
        return self._algorithms[op]

    def _runs(self, op: str, algorithm: str) -> bool:
        only = self._nccl_priced(op, algorithm)
        if only is None:
            return runs_on(op, algorithm, self.n, self.gpus_per_node)
        return any(only in (ALL, c.algorithm) for c in self.comm().candidates[op])

    def is_affine(self, op: str, algorithm: str) -> bool:
        """Whether the time of `op` by `algorithm` is intercept + slope x size (affine()),
        so a planner may price it with one multiply-add: not 'auto', 'nccl' or 'a|b' (a
        choice per size), nor what NCCL prices (its protocol and algorithm change with the
        size), nor a pipelined schedule (algorithms.pipelined)."""
        if algorithm in ("auto", "nccl") or "|" in algorithm:
            return False
        return self._nccl_priced(op, algorithm) is None and not pipelined(op, algorithm)

    def _times(self, op: str, algorithm: str, sizes: np.ndarray) -> np.ndarray:
        """Graph time of one algorithm at each size. Unpipelined schedules are affine in the
        size (see the module docstring): two cached graph evaluations give every size. A
        pipelined one (tree, ring broadcast) is interpolated between the powers of two
        around each size (exact at a power of two), each evaluated once and cached."""
        if not pipelined(op, algorithm):
            intercept, slope = self._graph_affine(op, algorithm)
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
        """What `algorithm` names: 'auto' what the backend runs (under gloo its own
        algorithm, backends.ALGORITHMS: ring all-reduce, binomial broadcast, ...); 'a|b' (a
        backend table's "the faster of") those of a, b that run on it (algorithms.runs_on);
        else the one algorithm."""
        if algorithm == "auto":  # what NCCL's tuner prices never reaches here
            algorithm = backends.ALGORITHMS[self.backend][op]
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
        """The algorithm NCCL runs for each size. Under NCCL its tuner's choice ("Ring/LL128",
        nccl.model) for the ops it prices; otherwise (gloo, or all-to-all and send-recv)
        NCCL's kernels as commsim's schedules, the faster on the graph where NCCL has two
        (all-reduce on whole nodes: ring or tree), else the one it has for the op (ring;
        all-to-all, send-recv: direct)."""
        algorithms_for(op)  # a ValueError naming the collectives for an unknown op
        if self._nccl_priced(op, "nccl") is not None:
            return self._nccl_price(op, np.atleast_1d(sizes), ALL, detail=True)[1]
        spelled = backends.ALGORITHMS["nccl"][op]
        if spelled == "nccl":  # NCCL's kernels as commsim schedules: ring, or ring|tree
            spelled = "ring|tree" if op == "all-reduce" else "ring"
        names = self._candidates(op, spelled)
        if len(names) == 1:
            return [names[0]] * np.atleast_1d(sizes).size
        return list(self.time_and_choice(op, "|".join(names), sizes)[1])

    # ------------------------------------------------------------------ NCCL's pricing

    def _nccl_priced(self, op: str, algorithm: str) -> int | None:
        """What NCCL runs for `algorithm` under the NCCL backend: ALL for 'auto' / 'nccl',
        NCCL's algorithm index for a commsim name it has for the op (nccl.NAMES: ring, its
        Tree for all-reduce), None where the graph prices it (gloo, other algorithms,
        all-to-all, send-recv)."""
        if self.backend != "nccl" or op not in nccl.OPS:
            return None
        if algorithm in ("auto", "nccl"):
            return ALL
        index = nccl.NAMES.get(algorithm)
        if index is None or (index == TREE and op != "all-reduce"):
            return None
        return index

    def with_nccl(self, spec) -> GroupCost:
        """This group priced with `spec`'s NCCL settings (its version, fitted latencies and
        channel bandwidths; the same fabric): a calibration fit's model. The graph's times
        and caps are shared."""
        other = copy.copy(self)
        other.cluster = dataclasses.replace(self.cluster, spec=spec)
        other._comm, other._choices, other._algorithms = None, {}, {}
        other.overhead = other._overhead(spec)
        return other

    def _overhead(self, spec) -> float:
        """Seconds every call of a collective on two or more ranks costs in software before
        any data moves (ClusterSpec.call_overhead: a calibration fit's per-call term)."""
        return float(spec.call_overhead) if self.n > 1 else 0.0

    def comm(self) -> nccl.CommModel:
        """NCCL's model of this group's communicator (ranks, nodes, GPUs per node)."""
        if self._comm is None:
            _, counts = np.unique(
                self.cluster.node_of(np.atleast_2d(self.gpus)[0]), return_counts=True
            )
            self._comm = nccl.comm_model(self.cluster.spec, self.n, counts.size, int(counts.max()))
        return self._comm

    def _cap(self, op: str, algorithm: int) -> float:
        """The graph's bandwidth (bytes of S a second) for NCCL's `algorithm` on this group
        (see the module docstring): what commsim's ring (NCCL's Ring, channels on the NIC
        rails) gets on the fabric, times 2(N-1)/N for the all-reduces that move S rather
        than 2(N-1)/N S a GPU (the in-switch reductions NVLS, NVLSTree, CollNet); for
        broadcast, which moves S through every GPU, the ring all-gather's links; cached."""
        key = (op, algorithm)
        if key not in self._caps:
            if op == "broadcast":  # S through every GPU: the ring all-gather's (N-1)/N S links
                slope = self._graph_affine("all-gather", "ring")[1] * self.n / (self.n - 1)
            else:
                slope = self._graph_affine(op, "ring")[1]
            cap = 1.0 / slope if slope > 0 else np.inf
            switch = (NVLS, NVLS_TREE, COLLNET_DIRECT, COLLNET_CHAIN)
            if op == "all-reduce" and algorithm in switch:
                cap *= 2 * (self.n - 1) / self.n
            self._caps[key] = cap
        return self._caps[key]

    def _nccl_candidates(self, op: str, only: int) -> tuple[list, np.ndarray, np.ndarray]:
        """NCCL's candidates for `op` (its algorithm `only`'s, or ALL), their indices among
        the communicator's, and the graph's cap for each; cached."""
        key = (op, only)
        if key not in self._choices:
            every = self.comm().candidates[op]
            keep = np.array([k for k, c in enumerate(every) if only in (ALL, c.algorithm)])
            if keep.size == 0:
                what = "algorithm/protocol" if only == ALL else NCCL_ALGORITHMS[only]
                nccl_env = self.cluster.spec.nccl
                env = [f"NCCL_ALGO={nccl_env.algo}"] * (nccl_env.algo is not None)
                env += [f"NCCL_PROTO={nccl_env.proto}"] * (nccl_env.proto is not None)
                under = f" under {' '.join(env)}" if env else ""
                raise NcclUnavailable(f"NCCL runs no {what} for {op} on this group{under}")
            cands = [every[k] for k in keep]
            caps = np.array([self._cap(op, c.algorithm) for c in cands])
            self._choices[key] = (cands, keep, caps)
        return self._choices[key]

    def _nccl_price(
        self, op: str, sizes: np.ndarray, only: int, detail: bool = False
    ) -> tuple[np.ndarray, list[str] | None, dict | None]:
        """Seconds per size of NCCL's choice (among its algorithm `only`'s protocols, or
        ALL); with `detail` also its names ("Tree/LL128") and what the CLI shows: the
        protocol, channels, NCCL's own estimate, the graph's cap, the runner-up."""
        if self.n == 1:
            return np.zeros(sizes.shape), ["-"] * sizes.size, None
        model = self.comm()
        cands, keep, caps = self._nccl_candidates(op, only)
        lat, bw = model.terms(op, sizes, keep)
        estimate = lat + sizes / bw
        best = np.argmin(estimate, axis=0)
        cols = np.arange(sizes.size)
        chosen_bw = bw[best, cols] if bw.shape[1] > 1 else bw[best, 0]
        chosen_lat = lat[best, cols] if lat.shape[1] > 1 else lat[best, 0]
        times = chosen_lat + sizes / np.minimum(chosen_bw, caps[best])
        if not detail:
            return times, None, None
        names = [cands[k].name for k in best]
        order = np.argsort(estimate, axis=0, kind="stable")
        second = order[1] if len(cands) > 1 else None
        channels = np.empty(sizes.shape, dtype=int)
        for k in np.unique(best):
            mine = best == k
            channels[mine] = model.channels(op, cands[k], sizes[mine])
        info = {
            "nccl_algorithm": [NCCL_ALGORITHMS[cands[k].algorithm] for k in best],
            "protocol": [PROTOCOLS[cands[k].protocol] for k in best],
            "channels": channels.tolist(),
            "nccl_time_s": estimate[best, cols].tolist(),
            "nccl_algbw_Bps": chosen_bw.tolist(),
            "graph_algbw_Bps": caps[best].tolist(),
            "runner_up": [None] * sizes.size if second is None else [cands[k].name for k in second],
            "runner_up_nccl_time_s": [None] * sizes.size
            if second is None
            else estimate[second, cols].tolist(),
        }
        return times, names, info

    def nccl_detail(self, op: str, algorithm: str, sizes) -> dict | None:
        """Per size, what NCCL runs and why (see _nccl_price), or None where NCCL does not
        price `op` by `algorithm` here."""
        only = self._nccl_priced(op, algorithm)
        if only is None:
            return None
        return self._nccl_price(op, np.atleast_1d(np.asarray(sizes, dtype=float)), only, True)[2]

    def _named_times(self, op: str, algorithm: str, sizes: np.ndarray) -> np.ndarray:
        """Seconds of one named algorithm: NCCL's pricing where it runs it, else the graph."""
        only = self._nccl_priced(op, algorithm)
        if only is not None:
            return self._nccl_price(op, sizes, only)[0]
        return self._times(op, algorithm, sizes)

    def time_and_choice(
        self, op: str, algorithm: str, sizes: np.ndarray | float
    ) -> tuple[np.ndarray, list[str]]:
        """Seconds per size, and which algorithm ran: any registered one, 'auto' (what the
        backend runs: NCCL's choice under NCCL, gloo's own algorithm under gloo), 'a|b' (the
        faster of those that run here), 'nccl' (what NCCL's tuner picks)."""
        sizes = np.atleast_1d(np.asarray(sizes, dtype=float))
        times, names = self._time_and_choice(op, algorithm, sizes)
        return times + self.overhead, names

    def _time_and_choice(
        self, op: str, algorithm: str, sizes: np.ndarray
    ) -> tuple[np.ndarray, list[str]]:
        """time_and_choice without the per-call overhead."""
        only = self._nccl_priced(op, algorithm)
        if only == ALL:
            times, names, _ = self._nccl_price(op, sizes, ALL, detail=True)
            return times, names
        if algorithm == "nccl":
            names = np.array(self.nccl_choice(op, sizes))
            times = np.empty(sizes.shape)
            for name in np.unique(names):
                mine = names == name
                times[mine] = self._times(op, str(name), sizes[mine])
            return times, names.tolist()
        candidates = self._candidates(op, algorithm)
        table = np.array([self._named_times(op, a, sizes) for a in candidates])
        best = np.argmin(table, axis=0)
        return table[best, np.arange(sizes.size)], [candidates[i] for i in best]

    def affine(self, op: str, algorithm: str) -> tuple[float, float]:
        """(seconds, seconds per byte): the time as intercept + slope x size, the per-call
        overhead in the intercept (see _graph_affine), so a planner can price millions of
        sizes with one multiply-add."""
        intercept, slope = self._graph_affine(op, algorithm)
        return intercept + self.overhead, slope

    def _graph_affine(self, op: str, algorithm: str) -> tuple[float, float]:
        """The graph's time as intercept + slope x size, from 1 MiB and 256 MiB; exact for
        unpipelined algorithms (see the module docstring)."""
        lo, hi = 2.0**20, 2.0**28
        t_lo, t_hi = self._graph_time(op, algorithm, lo), self._graph_time(op, algorithm, hi)
        slope = (t_hi - t_lo) / (hi - lo)
        return t_lo - slope * lo, slope

    def time(self, op: str, algorithm: str, sizes: np.ndarray | float) -> np.ndarray:
        """Seconds of `op` with `algorithm` (or 'auto', 'a|b', 'nccl') for each size in bytes."""
        only = self._nccl_priced(op, algorithm)
        if only is not None:  # the planner's path: no names
            sizes = np.atleast_1d(np.asarray(sizes, dtype=float))
            return self._nccl_price(op, sizes, only)[0] + self.overhead
        return self.time_and_choice(op, algorithm, sizes)[0]
