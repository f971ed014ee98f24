"""NCCL's cost model for one communicator: the latency and bandwidth tables
ncclTopoTuneModel fills (src/graph/tuning.cc), the per-call time ncclTopoGetAlgoTime
computes from them, the tuner's choice (the cheapest algorithm x protocol, enqueue.cc
topoGetAlgoInfo) and the channels the chosen kernel then runs, all vectorised over sizes.

    time(us) = latency x (1.4 for a large multi-node Ring/Simple all-reduce)
               + bytes / (1000 x bandwidth(GB/s) x tree correction)

Sizes are nccl-tests' S, which is NCCL's nBytes (ncclFuncMaxSendRecvCount: the whole
gathered buffer for all-gather and reduce-scatter). Latencies come out in seconds,
bandwidths in bytes/s. NCCL_ALGO / NCCL_PROTO (overrides) restrict the candidates as NCCL's
tuner does. What this does not model: tuner plugins, fp8's ring penalty (the dtype is not
known here), aggregated launches (numPipeOps = 1), CollNet and multi-node NVLS for
all-gather / reduce-scatter (they need a CollNet plugin with iallgather), and the
symmetric-memory kernels of 2.27+.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from commsim.collectives.nccl.overrides import DEFAULT, Overrides
from commsim.collectives.nccl.tables import (
    ALGORITHMS,
    BLACKWELL,
    COLLNET_CHAIN,
    COLLNET_DIRECT,
    HOPPER,
    LL,
    LL128,
    NET,
    NVLINK,
    NVLS,
    NVLS_TREE,
    PAT,
    PCI,
    PROTOCOLS,
    RING,
    SIMPLE,
    TREE,
    Tables,
)
from commsim.collectives.nccl.topo import PCI_BW, Graph, Graphs, Machine, search

OPS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast")  # what NCCL's tuner prices
LINK_CLASSES = ("nvlink", "pci", "net")
# comm.h thread thresholds, device.h thread counts
_THRESHOLD = {LL: 8, LL128: 8, SIMPLE: 64}
_LL_THREADS, _LL128_THREADS, _SIMPLE_THREADS, _MAX_THREADS = 512, 640, 512, 640


@dataclass(frozen=True)
class Candidate:
    """One enabled algorithm x protocol of an op: its latency (s) and bandwidth (B/s)
    before the per-call adjustments."""

    algorithm: int
    protocol: int
    latency: float
    bandwidth: float

    @property
    def name(self) -> str:
        return f"{ALGORITHMS[self.algorithm]}/{PROTOCOLS[self.protocol]}"


def log2i(x: int) -> int:
    """NCCL's log2i: floor(log2 x) for x >= 1, -1 for 0."""
    return int(x).bit_length() - 1


class CommModel:
    """NCCL's model of a communicator of `ranks` ranks on `nodes` nodes of `machine`."""

    def __init__(
        self,
        machine: Machine,
        tables: Tables,
        ranks: int,
        nodes: int,
        local_ranks: int | None = None,
        latency_scale: dict[str, float] | None = None,
        overrides: Overrides | None = None,
    ) -> None:
        self.m, self.t = machine, tables
        self.overrides = overrides
        self.ranks, self.nodes = int(ranks), int(nodes)
        self.local = int(local_ranks or -(-ranks // nodes))
        self.graphs: Graphs = search(machine, self.local, self.nodes)
        scale = latency_scale or {}
        self._scale = np.array([scale.get(c, 1.0) for c in LINK_CLASSES])
        self.candidates = {op: self._tune(op) for op in OPS}
        self._vector_cache: dict[str, tuple] = {}

    # ------------------------------------------------------------------ the tables

    def _arch_row(self) -> int:
        return self.m.arch if self.m.arch < BLACKWELL or self.t.blackwell else HOPPER

    def _graph(self, a: int) -> Graph | None:
        g = self.graphs
        return {
            TREE: g.tree,
            RING: g.ring,
            COLLNET_DIRECT: g.collnet,
            COLLNET_CHAIN: g.collnet,
            NVLS: g.nvls,
            NVLS_TREE: g.nvls,
            PAT: g.tree,
        }[a]

    def _enabled(self, op: str, a: int, p: int) -> bool:
        """Which algorithm x protocol NCCL prices for `op` here (tuning.cc, enqueue.cc)."""
        n, N, t, m = self.ranks, self.nodes, self.t, self.m
        if op == "broadcast":
            ok = a == RING
        elif op == "all-reduce":
            ok = a not in (PAT,)
        else:
            ok = a in t.ag_rs and a not in (COLLNET_DIRECT, COLLNET_CHAIN)
        if not ok or self._graph(a) is None:
            return False
        if a in (NVLS, NVLS_TREE) and (p != SIMPLE or self._graph(a).channels < 2):
            return False
        if a == NVLS_TREE and N == 1:
            return False
        if a == NVLS and N > 1 and (not m.sharp or op != "all-reduce"):
            return False  # multi-node NVLS needs CollNet ("collnetEnable == 0 && nNodes > 1")
        if a in (COLLNET_DIRECT, COLLNET_CHAIN):
            if N == 1 or p != SIMPLE or self.local > 8:  # NCCL_MAX_DIRECT_ARITY + 1
                return False
            if a == COLLNET_DIRECT and not m.nvlink:  # needs an NVSwitch
                return False
        if a == PAT and (p != SIMPLE or n != N or m.cc < 60 or not t.pat_factor):
            return False
        chosen = DEFAULT if self.overrides is None else self.overrides.protocol(op, p)
        if self.overrides is not None and not self.overrides.algorithm(op, a, m.sharp, N):
            return False
        # LL128 where NCCL enables it by default, or wherever NCCL_PROTO names it
        return chosen != 0 and not (p == LL128 and chosen == DEFAULT and not self.graphs.ll128)

    def _tune(self, op: str) -> list[Candidate]:
        """ncclTopoTuneModel's latency and bandwidth of every enabled algorithm x protocol."""
        out = []
        for a in range(len(ALGORITHMS)):
            for p in range(len(PROTOCOLS)):
                if self._enabled(op, a, p):
                    bus = self._bus_bandwidth(op, a, p)
                    if bus > 0:
                        bw = bus * self._ratio(op, a)
                        out.append(Candidate(a, p, self._latency(op, a, p) * 1e-6, bw * 1e9))
        return out

    def _nvls_bw(self, op: str, a: int, g: Graph) -> float:
        """The per-channel bandwidth of NVLS / NVLSTree, by the version's rule."""
        t, N, ppn = self.t, self.nodes, self.ranks / self.nodes
        rule = t.nvls_bandwidth
        if rule == "generic":
            return g.bw_intra if N <= 2 else g.bw_inter
        if rule == "efficiency":
            intra = g.bw_intra * t.nvls_efficiency[self.m.arch] * (g.channels - 1) / g.channels
            intra *= 2.0 if op == "all-reduce" else (ppn - 1) / ppn
            inter = g.bw_inter * (2 if N <= 2 and a == NVLS_TREE else 1)
            cap = t.nvls_tree_max[self._arch_row(), min(N, 3) - 1] if a == NVLS_TREE else math.inf
            return min(intra, inter, cap)
        if a == NVLS_TREE:
            return min(g.bw_intra, g.bw_inter if N <= 2 else g.bw_inter / 2)
        if rule == "min_agrs" and op != "all-reduce":
            return min(g.bw_intra * (ppn - 1) / ppn, g.bw_inter * 0.9)
        return min(g.bw_intra, g.bw_inter)

    def _bus_bandwidth(self, op: str, a: int, p: int) -> float:
        """busBw (GB/s) after the model refinements, in tuning.cc's order."""
        t, m, N = self.t, self.m, self.nodes
        g = self._graph(a)
        ppn = self.ranks / N
        col, row = min(N, 3) - 1, self._arch_row()
        collnet = a in (COLLNET_DIRECT, COLLNET_CHAIN)
        bw = g.bw_intra if N <= 2 or collnet else g.bw_inter
        if a in (NVLS, NVLS_TREE):
            bw = self._nvls_bw(op, a, g)
        bus = g.channels * bw
        ll_row = row if N == 1 else (1 if m.cpu == "amd" else 0)
        ll_max = t.ll_max[ll_row, col]
        if a == RING and p == LL:
            if t.ring_ll == "half":
                bus = min(ll_max, bus * 0.5)
            else:
                quarter = N > 1 or op == "all-reduce"
                bus = min(ll_max, bus * (0.25 if quarter else 1.0 / 3.0))
        if a == RING and p == LL128:
            low = t.ring_ll128_one_ppn if t.ring_ll128_one_ppn and ppn < 2 else 0.92
            bus = min(bus * low, g.channels * t.ring_ll128_max[row, col])
        if a == TREE:
            bus = min(bus * 0.92, g.channels * t.tree_max[row, col])
        if a == TREE and p == LL:
            bus = min(bus / 3.8, ll_max)
        if a == TREE and p == LL128:
            bus = min(bus * (7.0 / 9.0 if N == 1 else 120.0 / 128.0),
                      g.channels * t.tree_ll128_max[row, col])  # fmt: skip
        if a == PAT:
            bus *= t.pat_factor
        if a == COLLNET_DIRECT:
            factor = ppn / g.channels  # GPUs a NIC
            bus /= factor - (factor - 1) / 2
            if m.cc >= 90:
                bus *= 0.85
        return bus

    def _ratio(self, op: str, a: int) -> float:
        """Bus -> algorithm bandwidth (tuning.cc "Convert bus BW to algorithm BW")."""
        n, N, t = self.ranks, self.nodes, self.t
        if op in ("all-gather", "reduce-scatter") and a != RING and not t.ag_rs_convert:
            return 1.0
        nsteps = self._nsteps(op)
        if a == RING:
            return n / nsteps
        if a in (NVLS, NVLS_TREE):
            if t.nvls_ratio == "n/nsteps":
                return n / nsteps
            if t.nvls_ratio == "2.18" and a == NVLS_TREE:
                return 0.70 * N / (2 * (N - 1))
            return 5.0 / 6.0
        return 0.5

    def _nsteps(self, op: str) -> int:
        n = self.ranks
        return 2 * (n - 1) if op == "all-reduce" else n - 1 if op != "broadcast" else n

    def _latency(self, op: str, a: int, p: int) -> float:
        """comm->latencies[op][a][p] (us), NCCL's composition per algorithm."""
        t, m, n, N = self.t, self.m, self.ranks, self.nodes
        ppn = n // N  # nRanks / nNodes in C integer division
        hw = t.hw * self._scale[:, None, None]
        intra_hw = NVLINK if self.graphs.nvlink else PCI
        intra = hw[intra_hw, a, p]
        inter = hw[NET, TREE, p] if t.ppn1_tree_net and n == N else hw[NET, a, p]
        lat = t.base[a, p]
        if a == RING:
            nsteps = self._nsteps(op)
            if op == "broadcast":  # sameChannels assumed: one step's latency
                return lat + hw[intra_hw if N == 1 else NET, RING, p]
            overhead = 0.0
            if N > 1:
                overhead = (2.0 if m.cpu == "amd" else 1.0) * (3 if p == SIMPLE else 1)
            inter_steps = 0
            if N > 1:
                two = 2 * N if t.ring_ar_inter_steps == "2N" else 2 * (N - 1)
                inter_steps = two if op == "all-reduce" else N - 1
            return lat + (nsteps - inter_steps) * max(intra, overhead) + inter_steps * inter
        if a == TREE:
            return lat + 2 * ((ppn - 1) * intra + log2i(N) * inter)
        if a == COLLNET_DIRECT:
            return lat + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * t.collnet_arity_us) + inter
        if a == COLLNET_CHAIN:
            return lat + 2 * (ppn - 1) * intra + inter
        if a == NVLS:
            if t.nvls_latency == "2.18":
                return lat + (hw[NET, NVLS, p] if N > 1 else 0.0)
            return intra + (inter if N > 1 else 0.0)
        if a == NVLS_TREE:
            if t.nvls_latency == "2.18":
                return lat + 2 * (N - 1) * hw[NET, NVLS_TREE, p]
            return lat + intra + 2 * log2i(N) * inter
        return lat + log2i(N) * inter / 3.5 + 2.8 * n  # PAT

    # ------------------------------------------------------------------ per call

    def terms(
        self, op: str, sizes: np.ndarray, keep: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(latency s, bandwidth B/s) of the candidates of `op` (those `keep` indexes, or
        all) with the per-call adjustments of ncclTopoGetAlgoTime, one row per candidate,
        one column per size: the tree correction of Tree (and on Blackwell x86 hosts
        NVLSTree) all-reduce by log2 of the size over 64 B, and the ring plateau, x1.4 (x1.9
        before sm80) on a multi-node Ring/Simple all-reduce of 64 bytes or more a channel
        and rank. Rows broadcast: a row without an adjustment is one column wide."""
        lat0, bw0, top, rows, plateau = self._vectors(op)
        if keep is not None:
            lat0, bw0, top, rows, plateau = (x[keep] for x in (lat0, bw0, top, rows, plateau))
        sizes = np.asarray(sizes, dtype=float)
        lat, bw = lat0[:, None], bw0[:, None]
        corrected = np.nonzero(top)[0]
        if corrected.size:
            log_size = np.frexp(np.floor(sizes / 64.0))[1] - 1  # log2i(nBytes >> 6)
            bw = np.repeat(bw, sizes.size, axis=1)
            for k in corrected:
                factor = rows[k][np.clip(log_size, 0, rows.shape[1] - 1)]
                bw[k] *= np.where((log_size >= 0) & (log_size < top[k]), factor, 1.0)
        if plateau.any():
            big = np.floor(sizes / (self.graphs.comm_channels * self.ranks)) >= 64
            factor = np.where(plateau[:, None] & big, 1.9 if self.m.cc < 80 else 1.4, 1.0)
            lat = lat * factor
        return lat, bw

    def estimate(self, op: str, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """NCCL's own time (s) of its choice at each size, and the chosen candidate's index
        (the closed form: no graph)."""
        sizes = np.asarray(sizes, dtype=float)
        lat, bw = self.terms(op, sizes)
        table = lat + sizes / bw
        best = np.argmin(table, axis=0)
        return np.take_along_axis(table, best[None], axis=0)[0], best

    def _vectors(self, op: str):
        """Per candidate of `op`: latency, bandwidth, how many tree corrections apply (0:
        none), their row, and whether the ring plateau does; cached."""
        if op not in self._vector_cache:
            cands, t, cc = self.candidates[op], self.t, self.m.cc
            nvls_tree = t.nvls_tree_correction and cc >= 100 and self.m.cpu in ("intel", "amd")
            top = np.array(
                [
                    23
                    if op == "all-reduce" and c.algorithm == TREE
                    else t.tree_correction.shape[1]
                    if op == "all-reduce" and c.algorithm == NVLS_TREE and nvls_tree
                    else 0
                    for c in cands
                ]
            )
            plateau = np.array(
                [
                    op == "all-reduce"
                    and self.nodes > 1
                    and (c.algorithm, c.protocol) == (RING, SIMPLE)
                    for c in cands
                ],
                dtype=bool,
            )
            self._vector_cache[op] = (
                np.array([c.latency for c in cands]),
                np.array([c.bandwidth for c in cands]),
                top,
                t.tree_correction[[c.protocol for c in cands]].reshape(len(cands), -1),
                plateau,
            )
        return self._vector_cache[op]

    def channels(self, op: str, c: Candidate, sizes: np.ndarray) -> np.ndarray:
        """The channels the chosen kernel runs for each size (enqueue.cc
        topoGetAlgoInfo: fewer for small messages; NVLS its own count)."""
        g, sizes = self.graphs, np.asarray(sizes, dtype=float)
        a, p = c.algorithm, c.protocol
        if a == NVLS:
            count = min(g.nvls_channels, g.comm_channels) if self.nodes > 1 else g.nvls_channels
            return np.full(sizes.shape, count)
        if a == NVLS_TREE:
            return np.full(sizes.shape, g.nvls_channels)
        threads = self._threads(a, p)
        threshold = _THRESHOLD[p] * (self.ranks if (a, p) == (RING, LL) else 1)
        if a in (COLLNET_DIRECT, COLLNET_CHAIN) and p == SIMPLE:
            threshold = 512
        if a == COLLNET_DIRECT:
            threads *= g.collnet.channels  # nHeads
        if threads == 0:
            return np.full(sizes.shape, g.comm_channels)
        return np.clip(np.floor(sizes / (threads * threshold)), 1, g.comm_channels).astype(int)

    def _threads(self, a: int, p: int) -> int:
        """comm->maxThreads[a][p] (tuning.cc; PAT's is left unset, 0)."""
        if a == PAT:
            return 0
        if p == LL:
            return _LL_THREADS
        if p == LL128:
            return _LL128_THREADS
        if a == RING:
            ring = self.graphs.ring
            return 256 if ring.bw_intra * ring.channels <= PCI_BW else _SIMPLE_THREADS
        return _SIMPLE_THREADS if a == TREE else _MAX_THREADS
