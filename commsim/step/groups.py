"""The communicating groups of a layout on the cluster, and what their collectives cost.

Ranks follow Megatron-core's order (tp-cp-ep-dp-pp): tensor-parallel rank fastest, then
context-parallel, then data-parallel, then pipeline stage, so a tensor-parallel group is
consecutive GPUs (inside a node when tp is at most the node's GPUs); or, by the layout's
order, tp-cp-ep-pp-dp, the pipeline's stages inside each data-parallel replica. Gradients
are reduced over the data-parallel ranks and the context-parallel ones (they hold the same weights).
Expert layers (MoE) run on their own grid over the same ranks, MoE parallel folding
(Megatron-core; Liu et al. 2025, arXiv:2504.14960): each stage's tp x cp x dp ranks, in the
attention grid's order, are read as [edp, ep, etp], the expert tensor-parallel rank fastest
(Megatron-core's expert RankGenerator: tp=etp, ep, dp=edp, cp=1, the same pp groups), so ep
may span tp, cp and dp ranks. The edp ranks holding the same expert shard reduce their
gradients; with etp = tp and cp = 1 that is ep carved out of dp (DeepSpeed-MoE,
Rajbhandari et al. 2022, arXiv:2201.05596). Hybrid sharding (HSDP) shards over `shard` consecutive
data-parallel ranks and replicates across the dp / shard groups. Every group of one kind
runs its collective at the same time, sharing NICs and uplinks; the graph prices that, once
per distinct group and cached.
"""

from __future__ import annotations

import numpy as np

from commsim.collectives import nccl
from commsim.collectives.algorithms import ALGORITHMS as OP_ALGORITHMS
from commsim.collectives.group import GroupCost
from commsim.step.layouts import ALGORITHMS, RANK_ORDERS, Layouts
from commsim.topology.build import Cluster
from commsim.topology.placement import PLACEMENTS, place, rank_grid
from commsim.topology.routing import step_time

# tensor, context, data (with cp), expert, expert-data, expert-tensor, hybrid-shard and
# replica groups
KINDS = ("tp", "cp", "dp", "ep", "edp", "etp", "shard", "replica")
EXPERT_KINDS = ("ep", "edp", "etp")


def op_algorithm(op: str, algorithm: str) -> str:
    """The algorithm `op` runs under a layout's algorithm: it, where the op has it (or it is
    'auto' / 'nccl'), else ring (ZeRO's reduce-scatter and all-gather under 'tree')."""
    if algorithm in ("auto", "nccl") or algorithm in OP_ALGORITHMS[op]:
        return algorithm
    return "ring" if "ring" in OP_ALGORITHMS[op] else OP_ALGORITHMS[op][0]


class Groups:
    """GroupCosts of every group kind of every layout on one cluster, cached."""

    def __init__(self, cluster: Cluster, n_gpus: int) -> None:
        self.cluster = cluster
        self.orders = {k: place(cluster, n_gpus, k) for k in PLACEMENTS}
        self._costs: dict[tuple, GroupCost | None] = {}
        self._sends: dict[tuple, tuple[float, float]] = {}

    def _ranks(self, placement: int, tp: int, cp: int, dp: int, pp: int, order=0) -> np.ndarray:
        """GPU of each rank as [stage, data-parallel, context-parallel, tensor-parallel]."""
        gpus = self.orders[PLACEMENTS[placement]]
        return rank_grid(gpus, RANK_ORDERS[order], tp, cp, dp, pp)

    def members(
        self, placement, kind, tp, dp, pp, ep=1, cp=1, shard=1, order=0, etp=0
    ) -> np.ndarray:
        """GPUs of every group of one kind, a row each (see the module docstring); etp 0
        is tp."""
        ranks = self._ranks(placement, tp, cp, dp, pp, order)
        if kind == "tp":
            return ranks.reshape(-1, tp)
        if kind == "cp":
            return ranks.transpose(0, 1, 3, 2).reshape(-1, cp)
        if kind == "dp":
            return ranks.transpose(0, 3, 1, 2).reshape(-1, dp * cp)
        if kind in EXPERT_KINDS:
            etp = etp or tp
            grid = ranks.reshape(pp, -1, ep, etp)  # [stage, edp, ep, etp]
            if kind == "etp":
                return grid.reshape(-1, etp)
            if kind == "ep":
                return grid.transpose(0, 1, 3, 2).reshape(-1, ep)
            return grid.transpose(0, 2, 3, 1).reshape(-1, grid.shape[1])
        split = ranks.reshape(pp, dp // shard, shard, cp, tp)
        if kind == "shard":
            return split.transpose(0, 1, 4, 2, 3).reshape(-1, shard * cp)
        return split.transpose(0, 2, 3, 4, 1).reshape(-1, dp // shard)

    def cost(self, placement, kind, tp, dp, pp, ep=1, ps_shards=1, cp=1, shard=1, order=0, etp=0):
        """The GroupCost of every group of `kind` at once (None: groups of one rank)."""
        key = (placement, kind, tp, dp, pp, ep, ps_shards, cp, shard, order, etp)
        if key not in self._costs:
            groups = self.members(placement, kind, tp, dp, pp, ep, cp, shard, order, etp)
            self._costs[key] = concurrent_cost(self.cluster, groups, ps_shards)
        return self._costs[key]

    def send(self, placement, tp, dp, pp, cp=1, order=0) -> tuple[float, float]:
        """(intercept, slope per byte) of every stage handing activations to the next at
        once, each rank to its peer in the next stage (1F1B's steady state)."""
        if pp == 1:  # one stage: nothing to send
            return 0.0, 0.0
        key = (placement, tp, dp, pp, cp, order)
        if key not in self._sends:
            ranks = self._ranks(placement, tp, cp, dp, pp, order)
            src, dst = ranks[:-1].ravel(), ranks[1:].ravel()
            t0 = step_time(self.cluster, src, dst, np.zeros(src.size))
            t1 = step_time(self.cluster, src, dst, np.full(src.size, 2.0**24))
            self._sends[key] = (t0, (t1 - t0) / 2.0**24)
        return self._sends[key]

    def time(self, op, algorithm: str, sizes: np.ndarray, *key) -> np.ndarray:
        """Seconds of `op` by `algorithm` for each size on the groups `key` names (cost's
        arguments); inf where the groups cannot run it (tree and hierarchical need whole
        nodes), 0 for groups of one."""
        cost = self.cost(*key)
        sizes = np.asarray(sizes, dtype=float)
        if cost is None:
            return np.zeros(sizes.shape)
        alg = op_algorithm(op, algorithm)
        if alg not in ("auto", "nccl") and alg not in cost.algorithms(op):
            return np.full(sizes.shape, np.inf)
        return cost.time(op, alg, sizes)

    def price(self, op: str, kind: str, L: Layouts, nbytes: np.ndarray, algorithm=None):
        """Seconds of each layout's `op` of `nbytes` on its groups of `kind`, by its algorithm
        (or the `algorithm` codes given). Layouts are grouped by the groups they run on; an
        unpipelined algorithm's time is affine in the size (GroupCost), so those groups are
        priced by one multiply-add over all their layouts."""
        alg = L.algorithm if algorithm is None else np.broadcast_to(algorithm, L.dp.shape)
        cols = [alg, *_key_columns(kind, L)]
        inverse, firsts = group_rows(cols)
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), L.dp.shape)
        line = np.zeros((len(firsts), 2))
        general = []
        for k, i in enumerate(firsts.tolist()):
            a, pl, t, d, p, e, s, c, g, o, et = (int(col[i]) for col in cols)
            name, key = op_algorithm(op, ALGORITHMS[a]), (pl, kind, t, d, p, e, s, c, g, o, et)
            cost = self.cost(*key)
            if cost is None:
                continue
            if name not in ("auto", "nccl") and name not in cost.algorithms(op):
                line[k] = np.inf
            elif not cost.is_affine(op, name):
                general.append((k, name, key))
            else:
                line[k] = cost.affine(op, name)
        out = line[inverse, 0] + line[inverse, 1] * nbytes
        if general:
            order = np.argsort(inverse, kind="stable")
            bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=len(firsts)))])
            for k, name, key in general:
                rows = order[bounds[k] : bounds[k + 1]]
                out[rows] = self.cost(*key).time(op, name, nbytes[rows])
        return out

    def channels(self, kind: str, L: Layouts, p2p: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(SMs, whether on the GPU) of a collective on each layout's groups of `kind`: one
        CTA per channel its NCCL communicator runs large messages on (enqueue.cc launches
        nChannels blocks; nccl.topo's comm_channels; `p2p`: a send/recv's, nccl.topo's
        p2p_channels); gloo's run on the CPU (False), and groups of one run nothing."""
        cols = _key_columns(kind, L)
        inverse, firsts = group_rows(cols)
        counts, gpu = np.zeros(len(firsts)), np.zeros(len(firsts), dtype=bool)
        for k, i in enumerate(firsts.tolist()):
            pl, t, d, p, e, s, c, g, o, et = (int(col[i]) for col in cols)
            cost = self.cost(pl, kind, t, d, p, e, s, c, g, o, et)
            if cost is not None and cost.backend == "nccl":
                comm = cost.comm()
                channels = comm.graphs.comm_channels
                if p2p:
                    channels = nccl.p2p_channels(comm.m, channels, comm.ranks, comm.nodes)
                counts[k], gpu[k] = channels, True
        return counts[inverse], gpu[inverse]


def _key_columns(kind: str, L: Layouts) -> list[np.ndarray]:
    """Per layout, Groups.cost's arguments after `kind` for its groups of `kind`."""
    one = np.ones_like(L.dp)
    expert = kind in EXPERT_KINDS
    ep, etp = (L.ep, L.expert_tp) if expert else (one, np.zeros_like(L.dp))
    shards = L.ps_shards if kind == "dp" else one
    shard = np.maximum(L.fsdp_shard, 1) if kind in ("shard", "replica") else one
    return [L.placement, L.tp, L.dp, L.pp, ep, shards, L.cp, shard, L.order, etp]


def concurrent_cost(cluster: Cluster, groups: np.ndarray, ps_shards: int = 1) -> GroupCost | None:
    """The GroupCost of groups (a row of GPUs each) running one collective at the same time;
    None for groups of one rank. Also what a trace replay prices a process group with."""
    if groups.shape[1] == 1:
        return None
    nodes = cluster.node_of(groups)
    if (nodes == nodes[:, :1]).all():
        groups = groups[:1]  # each group inside its own node: they share no link
    return GroupCost(cluster, groups, ps_shards=min(ps_shards, groups.shape[1]))


def group_rows(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(group index of each row, first row of each group) of rows equal in every column:
    the columns as one mixed-radix integer, then np.unique."""
    code = np.zeros(len(cols[0]), dtype=np.int64)
    for col in cols:
        col = np.asarray(col).astype(np.int64)
        code = code * (int(col.max(initial=0)) + 1) + col
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return inverse, first
