"""Data-parallel gradient sync of ZeRO 0-2 (and a DDP comm hook's), vectorised over
layouts: each layout's stage gradients in PyTorch DDP's buckets (step.buckets), what each
bucket costs on its group (step.sync), and the closed-form serial schedule under the last
backward (sync.Tail), cached per distinct sync: a search meets each a few hundred times.
ZeRO-3 / FSDP syncs per unit instead (step.fsdp).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsim.collectives.algorithms import ALGORITHMS as OP_ALGORITHMS
from commsim.compression import parse_compressor
from commsim.specs import GPUSpec
from commsim.step.buckets import MIB, STAGE_KINDS, BucketPlan, stage_buckets
from commsim.step.groups import Groups, _group_rows
from commsim.step.layouts import RANK_ORDERS, Layouts
from commsim.step.shape import Shape, expert_shards, slowest, stage_layers
from commsim.step.sync import BucketCosts, Tail, allreduce_costs, compressed_costs, tail
from commsim.topology.placement import PLACEMENTS
from commsim.workload.model import BACKWARD_FACTOR, Workload


@dataclass(frozen=True)
class SyncPlan:
    """One stage's data-parallel sync under one way of reducing: its buckets, their costs,
    and the closed-form schedule (ZeRO 0-2) or the per-micro-batch volume (ZeRO-3)."""

    buckets: BucketPlan
    costs: BucketCosts
    tail: Tail


class DataParallel:
    """The ZeRO 0-2 data-parallel sync of one workload's layouts on one cluster."""

    def __init__(self, workload: Workload, shape: Shape, gpu: GPUSpec, groups: Groups):
        self.workload, self.shape, self.gpu, self.groups = workload, shape, gpu, groups
        self._sync: dict[tuple, SyncPlan] = {}

    def sync(self, L: Layouts, span: np.ndarray):
        """(network seconds, seconds from the end of the last backward (of length `span`)
        to the optimizer's start, codec seconds, parameters the optimizer steps) of each
        layout's ZeRO 0-2 sync on the stage with the most parameters: the buckets' serial
        stream under that backward (sync.Tail), a comm hook's encodes stretching it. ZeRO-3
        rows are left at 0 (step.fsdp prices them) but for their optimizer's parameters."""
        sh = self.shape
        ends = (sh.pre_params + sh.post_params, sh.pre_params, sh.post_params)
        which, held, params = slowest(
            *stage_layers(sh.blocks, L.pp, L.first_layers, L.last_layers),
            sh.block_params,
            L.pp == 1,
            *ends,
        )
        kind = np.where(L.pp == 1, 0, which + 1)  # STAGE_KINDS
        inverse, firsts = _group_rows(_sync_columns(L, kind, held))
        plans = [self._sync_plan(L, int(i), int(kind[i]), int(held[i])) for i in firsts]
        network = np.array([p.tail.network for p in plans])[inverse]
        encode = np.array([p.tail.encode for p in plans])[inverse]
        codec = np.array([p.tail.codec for p in plans])[inverse]
        width = max((len(p.tail.slopes) for p in plans), default=1)
        slopes = np.zeros((len(plans), width))
        cuts = np.full((len(plans), width), -np.inf)
        for k, p in enumerate(plans):
            slopes[k, : len(p.tail.slopes)] = p.tail.slopes
            cuts[k, : len(p.tail.intercepts)] = p.tail.intercepts
        hidden = np.max(cuts[inverse] + slopes[inverse] * span[:, None], axis=1)
        serial = np.array([p.tail.serial for p in plans])[inverse]
        sync_exposed = encode + np.where(L.overlap, hidden, serial)
        # ZeRO shards optimizer states over dp (and cp), expert ones over the expert-data-
        # parallel ranks holding the same expert shard (step.shape.expert_shards); hybrid
        # sharding over its shard groups
        etp = L.expert_tp
        sparse = held * sh.expert_params / (etp * L.ep)
        dense = (params - held * sh.expert_params) / L.tp
        zeroed = L.zero >= 1
        shard = np.where((L.zero == 3) & (L.fsdp_shard > 0), L.fsdp_shard, L.dp) * L.cp
        local = dense / np.where(zeroed, shard, 1)
        local = local + sparse / np.where(zeroed, expert_shards(shard, L.tp, L.ep, etp), 1)
        return network, sync_exposed, codec, local

    def sync_plan(self, L: Layouts, i: int) -> SyncPlan:
        """Layout i's data-parallel sync (for drawing its buckets)."""
        sh = self.shape
        stages = stage_layers(sh.blocks, L.pp[i], L.first_layers[i], L.last_layers[i])
        ends = (sh.pre_params + sh.post_params, sh.pre_params, sh.post_params)
        which, held, _ = slowest(*stages, sh.block_params, L.pp[i] == 1, *ends)
        kind = 0 if L.pp[i] == 1 else int(which) + 1
        return self._sync_plan(L, i, kind, int(held))

    def _sync_plan(self, L: Layouts, i: int, kind: int, blocks: int) -> SyncPlan:
        """The sync of layout i's stage (STAGE_KINDS[kind], `blocks` blocks), cached: a
        search meets each a few hundred times."""
        key = (kind, blocks, *_sync_key(L, i))
        if key in self._sync:
            return self._sync[key]
        r = L.row(i)
        g = int(L.grad_bytes[i])
        if r["zero"] == 3:  # ZeRO-3 syncs per unit (step.fsdp)
            none = BucketPlan(np.zeros(0), np.zeros(0, bool), np.zeros(0), (), np.zeros(0))
            zero = np.zeros(0)
            costs = BucketCosts(zero, zero, zero)
            self._sync[key] = plan = SyncPlan(none, costs, tail(costs, zero))
            return plan
        buckets = stage_buckets(
            self.workload,
            STAGE_KINDS[kind],
            blocks,
            r["tp"],
            r["ep"],
            g,
            r["bucket_mb"] * MIB,
            r["first_bucket_mb"] * MIB,
            self.layer_weights(r["recompute"]),
            r["etp"],
        )
        costs = self.bucket_costs(r, buckets.bytes, buckets.expert, g)
        self._sync[key] = plan = SyncPlan(buckets, costs, tail(costs, buckets.ready))
        return plan

    def bucket_costs(
        self, r: dict, nbytes: np.ndarray, expert: np.ndarray, grad_bytes: int
    ) -> BucketCosts:
        """Network and codec seconds of buckets of `nbytes` (expert: on the expert-data-
        parallel group) under one layout (a Layouts.row)."""
        dp, ep = r["dp"], r["ep"]
        shape = (
            r["tp"],
            dp,
            r["pp"],
            ep,
            r["ps_shards"],
            r["cp"],
            1,
            RANK_ORDERS.index(r["order"]),
            r["etp"],
        )
        placement = PLACEMENTS.index(r["placement"])

        def price(op, algorithm, sizes, expert):
            kind = "edp" if expert else "dp"
            return self.groups.time(op, algorithm, sizes, placement, kind, *shape)

        none = np.zeros(len(nbytes))
        if dp * r["cp"] == 1:
            return BucketCosts(none, none, none)
        alg = r["algorithm"]
        if r["compression"] != "none":
            return compressed_costs(
                price,
                alg,
                lambda op: OP_ALGORITHMS[op],
                parse_compressor(r["compression"]),
                np.rint(nbytes / grad_bytes),
                dp * r["cp"],
                self.gpu,
                r["error_feedback"],
            )
        network = allreduce_costs(price, alg, nbytes, expert, r["zero"], grad_bytes)
        return BucketCosts(network, none, none)

    def layer_weights(self, recompute: str) -> tuple[float, ...]:
        """Each workload layer's share of a backward (any scale): 2x its forward FLOPs, and
        in the blocks what selective (the attention core) or op-level checkpointing replays."""
        replays = {"selective": self.shape.attention_core_flops, "op": self.shape.op_replay_flops}
        core = replays.get(recompute, 0.0)
        return tuple(
            BACKWARD_FACTOR * layer.forward_flops
            + (core if layer.name.startswith("block.") else 0.0)
            for layer in self.workload.layers
        )


# what a data-parallel sync depends on besides its stage: a Layouts.row's fields
_SYNC_KEY = (
    "tp",
    "ep",
    "etp",
    "dp",
    "pp",
    "grad_dtype",
    "bucket_mb",
    "first_bucket_mb",
    "recompute",
    "zero",
    "algorithm",
    "placement",
    "ps_shards",
    "compression",
    "error_feedback",
    "cp",
    "order",
)


def _sync_key(L: Layouts, i: int) -> tuple:
    """Layout i's values of the _SYNC_KEY columns (the compressor by name: codes index each
    Layouts' own list), without building its row."""
    values = [getattr(L, name)[i].item() for name in _SYNC_KEY]
    at = _SYNC_KEY.index("compression")
    values[at] = L.compressions[values[at]]
    return tuple(values)


def _sync_columns(L: Layouts, kind: np.ndarray, held: np.ndarray) -> list[np.ndarray]:
    """The columns _SYNC_KEY names, as integer codes, with the stage's kind and blocks."""
    cols = [kind, held.astype(np.int64)]
    for name in _SYNC_KEY:
        col = getattr(L, name)
        if col.dtype.kind == "f":
            col = np.unique(col, return_inverse=True)[1]
        cols.append(col)
    return cols
