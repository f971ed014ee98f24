"""Data-parallel gradient sync of ZeRO 0-2 (and a DDP comm hook's), vectorised over
layouts: each layout's stage gradients in PyTorch DDP's buckets (step.buckets), one set per
model chunk, what each bucket costs on its group (step.sync), and the closed-form serial
schedule (sync.Tail), cached per distinct sync: a search meets each a few hundred times.
ZeRO-3 / FSDP syncs per unit instead (step.fsdp).

With overlap on, as Megatron-core's distributed optimizer runs with --overlap-grad-reduce
and --overlap-param-gather (distributed_data_parallel.py, param_and_grad_buffer.py,
pipeline_parallel/schedules.py at NVIDIA/Megatron-LM d98e8a64dd):
- one model chunk (v = 1): each bucket's reduction launches once its gradients exist in the
  last micro-batch's backward (register_grad_ready; 1F1B enables it on the first stage for
  the last backward, schedules.py forward_backward_pipelining_without_interleaving);
- v > 1 chunks: each chunk is its own DDP; its buckets all launch when its last backward
  ends (align_grad_reduce, the default: grad_sync_func after the backward step of
  virtual micro-batch id - pp rank, so every stage launches when the first stage finishes
  the chunk). On the first stage chunk c finishes c g backward ops before the pipeline's
  end, g the micro-batches of the last group (pipeline.stage_order): the chunks' reductions
  run during the cool-down, chunk 0's after it;
- ZeRO 1-2's parameter all-gathers leave the step's end for the next step's forward: each
  bucket's gather must be done when the forward reaches its layers (forward pre-hooks;
  aligned per chunk with interleaving), chunk c's first forward c x (first group) forward
  ops in. Read backwards in time that is the reduction's closed form (sync.tail_of_leads).
  Without --overlap-param-gather (Strategy.overlap_param_gather false: Megatron-core's
  default, and DeepSpeed's stage 1-2, whose step() gathers after the optimizer,
  stage_1_and_2.py all_gather_dp_groups) the gathers run one by one after the optimizer.
The stage priced is the one with the most parameters, at the first stage's times (the
latest launches; Megatron aligns the others to them). Under DualPipe a rank holds two stages
(step.dualpipe), so the rank with the most parameters is priced, its two stages' buckets as
two chunks: the far stage's (phase 1) launch ahead of the near one's by the phase-0 backward
ops DualPipe's order runs after them, and are needed that many forwards after the step's
first (dualpipe.phase_leads), on the data-parallel groups of the rank; summing the two
copies' gradients across their ranks (the 2 dp ranks the memory model shards over;
deepseek-ai/DualPipe's example adds them by hand) is not priced. Llama 3's FSDP (arXiv:2407.21783
Sec. 3.3.2: ZeRO-2-like, no reshard after forward) is priced the same way.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from commsim.collectives.algorithms import ALGORITHMS as OP_ALGORITHMS
from commsim.compression import parse_compressor
from commsim.specs import GPUSpec
from commsim.step.activations import RECOMPUTE, replays_core
from commsim.step.buckets import MIB, STAGE_KINDS, BucketPlan, stage_buckets, stage_layer_range
from commsim.step.contention import collective_hbm_bytes, contended_tail, mean_rate
from commsim.step.dualpipe import phase_leads
from commsim.step.groups import Groups, group_rows
from commsim.step.layouts import RANK_ORDERS, Layouts
from commsim.step.shape import Shape, expert_shards, slowest, stage_layers
from commsim.step.sync import (
    PARAM_WIRE_BYTES,
    BucketCosts,
    Price,
    Tail,
    compressed_costs,
    serial_time,
    tail_of_leads,
    zero_costs,
)
from commsim.topology.placement import PLACEMENTS
from commsim.workload.model import BACKWARD_FACTOR, Workload

NO_TAIL = Tail(np.zeros(1), np.zeros(1), 0.0, 0.0, 0.0, 0.0)  # nothing to sync


@dataclass(frozen=True)
class SyncPlan:
    """One stage's data-parallel sync under one way of reducing: its model chunks' buckets
    in launch order (the last chunk first), their costs and the closed forms: `reduce`,
    the gradients' collectives (and a hook's codec) against the backward or the cool-down,
    `gather`, ZeRO 1-2's parameter all-gathers against the next forward, and `serial`, the
    whole sync after the backward (overlap off)."""

    chunks: tuple[BucketPlan, ...]
    chunk: np.ndarray  # each bucket's model chunk on its stage (0: the first)
    leads: np.ndarray  # each bucket's lead in units of Tail.at's x (see chunk_leads)
    costs: BucketCosts  # network: gradient and parameter collectives together
    params: np.ndarray  # of costs.network: the parameter all-gathers (ZeRO 1-2)
    reduce: Tail
    gather: Tail
    serial: float

    @property
    def buckets(self) -> BucketPlan:
        """The buckets of every chunk in launch order (tensors index each chunk's own)."""
        if len(self.chunks) == 1:
            return self.chunks[0]

        def cat(arrays: list[np.ndarray], dtype=float) -> np.ndarray:  # none under ZeRO-3
            return np.concatenate(arrays) if arrays else np.zeros(0, dtype)

        return BucketPlan(
            bytes=cat([c.bytes for c in self.chunks]),
            expert=cat([c.expert for c in self.chunks], bool),
            ready=cat([c.ready for c in self.chunks]),
            tensors=tuple(t for c in self.chunks for t in c.tensors),
            layer_of=cat([c.layer_of for c in self.chunks], np.int64),
        )


def reduce_part(network: np.ndarray, gather: np.ndarray) -> np.ndarray:
    """Each bucket's gradient reduction: its sync's network seconds less the parameter
    all-gather's; inf where the sync cannot run (NCCL_ALGO / NCCL_PROTO leaving NCCL no
    algorithm prices both inf, and inf - inf would be NaN)."""
    runs = np.isfinite(gather)
    return np.where(runs, network - np.where(runs, gather, 0.0), np.inf)


def chunk_blocks(kind: str, blocks: int, v: int) -> list[int]:
    """Blocks in each of a stage's v model chunks (0 first): equal where they divide; on an
    end stage that does not, the chunks beside the embedding (first stage) or the head (last)
    hold one fewer, as Llama 3's first chunk holds only the embedding (arXiv:2407.21783
    Sec. 3.3.2; Megatron-core's first/last-stage layers split evenly over the chunks)."""
    base, extra = divmod(blocks, v)
    if kind == "last":
        return [base + int(c < extra) for c in range(v)]
    return [base + int(c >= v - extra) for c in range(v)]


def chunk_kind(kind: str, c: int, v: int) -> str:
    """What chunk c of a stage of this kind holds (STAGE_KINDS): the embedding with the first
    stage's first chunk, the head with the last stage's last, blocks only elsewhere."""
    if v == 1 or (kind == "first" and c == 0) or (kind == "last" and c == v - 1):
        return kind
    return "middle"


def chunk_leads(chunk: np.ndarray, ready: np.ndarray, v: int) -> np.ndarray:
    """Each bucket's launch before the backward's end (and, reversed, its need after the
    forward's start) in units of the x that model.StepModel passes: 1 - its ready fraction
    of one micro-batch's stage backward (v = 1), or its chunk's index, x being g chunk
    backward (forward) ops (v > 1; see the module docstring)."""
    return 1.0 - ready if v == 1 else chunk.astype(float)


def _chunk_parts(kind: int, blocks: int, far: int, v: int) -> list[tuple[str, int, int]]:
    """(STAGE_KINDS name, blocks, chunk) of each model chunk of the priced rank, in launch
    order: a stage's v chunks, the last first; a DualPipe rank's two stages (priced_rank's
    kinds past STAGE_KINDS: an end rank's first and last, a middle rank's two middle ones),
    chunk 1 the far stage (phase 1: its gradients are done first, step.dualpipe.phase_leads)
    and chunk 0 the near one."""
    if kind >= len(STAGE_KINDS):
        near, far_kind = (("first", "last"), ("middle", "middle"))[kind - len(STAGE_KINDS)]
        return [(far_kind, far, 1), (near, blocks, 0)]
    stage = STAGE_KINDS[kind]
    counts = chunk_blocks(stage, blocks, v)
    return [(chunk_kind(stage, c, v), counts[c], c) for c in reversed(range(v))]


@functools.lru_cache(maxsize=64)
def dualpipe_leads(pp: int, middle: int) -> tuple[int, int]:
    """(after, before) of step.dualpipe.phase_leads, in stage backward and forward ops: for
    the end ranks (middle 0), or the middle ranks' least (middle 1: the last to finish their
    far stage, the first to need it)."""
    if not middle:
        return phase_leads(pp, 0)
    leads = [phase_leads(pp, r) for r in range(1, pp - 1)]
    return min(a for a, _ in leads), min(b for _, b in leads)


class DataParallel:
    """The ZeRO 0-2 data-parallel sync of one workload's layouts on one cluster."""

    def __init__(self, workload: Workload, shape: Shape, gpu: GPUSpec, groups: Groups):
        self.workload, self.shape, self.gpu, self.groups = workload, shape, gpu, groups
        self._sync: dict[tuple, SyncPlan] = {}
        self._holds: dict[tuple[str, int], bool] = {}

    def sync(self, L: Layouts, x_reduce: np.ndarray, x_gather: np.ndarray, slowed=None):
        """(network seconds, exposed seconds, codec seconds, parameters the optimizer steps,
        the rate its backward runs at beside the reductions) of each layout's ZeRO 0-2 sync
        on the stage with the most parameters. Exposed: with overlap, the reductions' tail
        after the backward (sync.Tail at x_reduce) and the gathers' wait before the forward
        (at x_gather), a comm hook's encodes stretching the backward, and what the compute
        loses beside them; without, the whole serial sync. `slowed(rows, part, bytes,
        seconds, kind)` gives the rate the backward ("reduce") or forward ("gather") of layouts
        L.take(rows) runs at beside their collectives on the groups of `kind` ("dp", "edp")
        (step.contention; None: full speed). ZeRO-3 rows are left at 0 (step.fsdp prices
        them) but for their optimizer's parameters."""
        sh = self.shape
        kind, held, far, params = self.priced_rank(L)
        inverse, firsts = group_rows(_sync_columns(L, kind, held, far))
        plans = [
            self._sync_plan(L, int(i), int(kind[i]), int(held[i]), int(far[i])) for i in firsts
        ]
        network = np.array([p.reduce.network + p.gather.network for p in plans])[inverse]
        encode = np.array([p.reduce.encode for p in plans])[inverse]
        codec = np.array([p.reduce.codec for p in plans])[inverse]
        gathers = np.array([p.params.any() for p in plans], dtype=bool)[inverse]
        serial = np.array([p.serial for p in plans])[inverse]
        exposed = serial.copy()
        on = L.overlap
        ahead = on & gathers & L.gather_overlap  # under the next forward
        r_reduce, r_gather = _rates(L, plans, inverse, on, ahead, slowed)
        exposed[on] = _tail(plans, "reduce", inverse[on], x_reduce[on], r_reduce[on])
        exposed[ahead] += _tail(plans, "gather", inverse[ahead], x_gather[ahead], r_gather[ahead])
        after = on & gathers & ~L.gather_overlap  # after the optimizer step, one by one
        exposed[after] += np.array([p.gather.serial for p in plans])[inverse[after]]
        sync_exposed = encode + exposed
        # ZeRO shards optimizer states over dp (and cp), expert ones over the expert-data-
        # parallel ranks holding the same expert shard (step.shape.expert_shards); hybrid
        # sharding over its shard groups; DualPipe's over both copies' holders (step.memory)
        etp, blocks = L.expert_tp, held + far
        sparse = blocks * sh.expert_params / (etp * L.ep)
        dense = (params - blocks * sh.expert_params) / L.tp
        zeroed = L.zero >= 1
        shard = np.where((L.zero == 3) & (L.fsdp_shard > 0), L.fsdp_shard, L.dp) * L.cp
        shard = shard * np.where(L.schedule == 1, 2, 1)
        local = dense / np.where(zeroed, shard, 1)
        local = local + sparse / np.where(zeroed, expert_shards(shard, L.tp, L.ep, etp), 1)
        return network, sync_exposed, codec, local, r_reduce

    def sync_plan(self, L: Layouts, i: int) -> SyncPlan:
        """Layout i's data-parallel sync (for drawing its buckets)."""
        kind, held, far, _ = self.priced_rank(L.take(np.array([i])))
        return self._sync_plan(L, i, int(kind[0]), int(held[0]), int(far[0]))

    def priced_rank(self, L: Layouts):
        """(kind, blocks, far blocks, parameters) of the rank each layout's sync is priced
        on: the stage with the most parameters (kind a STAGE_KINDS index, far 0); under
        DualPipe the rank holding the most of them, whose two stages' gradients it syncs
        (step.dualpipe: rank r holds stage r and stage pp - 1 - r): an end rank's first and
        last stage (kind "ends", blocks the first's, far the last's) or a middle rank's two
        middle stages ("middles")."""
        sh = self.shape
        first, mid, last = stage_layers(sh.blocks, L.pp, L.first_layers, L.last_layers)
        ends = (sh.pre_params + sh.post_params, sh.pre_params, sh.post_params)
        which, held, params = slowest(first, mid, last, sh.block_params, L.pp == 1, *ends)
        kind = np.where(L.pp == 1, 0, which + 1)
        at_ends = (first + last) * sh.block_params + sh.pre_params + sh.post_params
        middles = 2 * mid * sh.block_params
        dual = L.schedule == 1
        mid_rank = dual & (L.pp > 2) & (middles > at_ends)
        kind = np.where(dual, len(STAGE_KINDS) + mid_rank, kind)
        held = np.where(dual, np.where(mid_rank, mid, first), held)
        far = np.where(dual, np.where(mid_rank, mid, last), 0.0)
        return kind, held, far, np.where(dual, np.where(mid_rank, middles, at_ends), params)

    def _sync_plan(self, L: Layouts, i: int, kind: int, blocks: int, far: int = 0) -> SyncPlan:
        """The sync of layout i's priced rank (priced_rank: kind, `blocks` blocks in its
        model chunks, `far` in a DualPipe rank's second stage), cached: a search meets each
        a few hundred times."""
        key = (kind, blocks, far, *_sync_key(L, i))
        if key in self._sync:
            return self._sync[key]
        r = L.row(i)
        g, v = int(L.grad_bytes[i]), r["interleave"]
        chunks: list[BucketPlan] = []
        ids: list[np.ndarray] = []
        if r["zero"] != 3:  # ZeRO-3 syncs per unit (step.fsdp)
            weights = self.layer_weights(r["recompute"], int(L.recompute_parts[i]))
            for part, count, c in _chunk_parts(kind, blocks, far, v):
                if not self._holds_layers(part, count):
                    continue
                plan = stage_buckets(
                    self.workload,
                    part,
                    count,
                    r["tp"],
                    r["ep"],
                    g,
                    r["bucket_mb"] * MIB,
                    r["first_bucket_mb"] * MIB,
                    weights,
                    r["etp"],
                )
                chunks.append(plan)
                ids.append(np.full(len(plan), c))
        chunk = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        nbytes = np.concatenate([c.bytes for c in chunks]) if chunks else np.zeros(0)
        expert = np.concatenate([c.expert for c in chunks]) if chunks else np.zeros(0, bool)
        ready = np.concatenate([c.ready for c in chunks]) if chunks else np.zeros(0)
        costs, params = self.bucket_costs(r, nbytes, expert, g)
        leads = needs = chunk_leads(chunk, ready, v)
        if kind >= len(STAGE_KINDS):  # DualPipe: its far stage's sync runs ahead
            after, before = dualpipe_leads(r["pp"], kind - len(STAGE_KINDS))
            leads, needs = leads + after * chunk, needs + before * chunk
        reduce = BucketCosts(reduce_part(costs.network, params), costs.encode, costs.decode)
        no_codec = np.zeros(len(params))
        self._sync[key] = plan = SyncPlan(
            chunks=tuple(chunks),
            chunk=chunk,
            leads=leads,
            costs=costs,
            params=params,
            reduce=tail_of_leads(reduce, leads),
            gather=tail_of_leads(BucketCosts(params, no_codec, no_codec), needs)
            if params.any()
            else NO_TAIL,
            serial=serial_time(costs),
        )
        return plan

    def _holds_layers(self, kind: str, blocks: int) -> bool:
        """Whether a chunk of this kind and blocks holds any layer (cached)."""
        key = (kind, blocks)
        if key not in self._holds:
            self._holds[key] = bool(len(stage_layer_range(self.workload, kind, blocks)))
        return self._holds[key]

    def bucket_costs(
        self, r: dict, nbytes: np.ndarray, expert: np.ndarray, grad_bytes: int, price=None
    ) -> tuple[BucketCosts, np.ndarray]:
        """Network and codec seconds of buckets of `nbytes` (expert: on the expert-data-
        parallel group) under one layout (a Layouts.row), and of the network seconds the
        parameter all-gathers' (ZeRO 1-2). `price`: group_price(r) unless given (a Chakra
        export wraps it to write each collective it asks for)."""
        price = price or self.group_price(r)
        none = np.zeros(len(nbytes))
        if r["dp"] * r["cp"] == 1:
            return BucketCosts(none, none, none), none
        alg = r["algorithm"]
        if r["compression"] != "none":
            hooked = compressed_costs(
                price,
                alg,
                lambda op: OP_ALGORITHMS[op],
                parse_compressor(r["compression"]),
                np.rint(nbytes / grad_bytes),
                r["dp"] * r["cp"],
                self.gpu,
                r["error_feedback"],
            )
            return hooked, none
        reduce, gather = zero_costs(price, alg, nbytes, expert, r["zero"], grad_bytes)
        return BucketCosts(reduce + gather, none, none), gather

    def group_price(self, r: dict) -> Price:
        """Seconds of an op by an algorithm for each size on one layout's (a Layouts.row)
        data-parallel groups, or expert-data-parallel ones (sync.Price)."""
        shape = (
            r["tp"],
            r["dp"],
            r["pp"],
            r["ep"],
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

        return price

    def layer_weights(self, recompute: str, parts: int = 0) -> tuple[float, ...]:
        """Each workload layer's share of a backward (any scale): 2x its forward FLOPs, and
        in the blocks what selective (the attention core; or the core_attn module: `parts`, a
        recompute_code) or op-level checkpointing replays, and the mla_up_proj and mlp
        modules' GEMMs beside none or selective (step.model's hfu counts the same)."""
        sh, code = self.shape, RECOMPUTE.index(recompute)
        core = sh.op_replay_flops if recompute == "op" else 0.0
        core += sh.attention_core_flops if replays_core(code, parts) else 0.0
        if recompute in ("none", "selective"):
            core += float(sh.module_flops(parts))
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
    "recompute_parts",
    "zero",
    "algorithm",
    "placement",
    "ps_shards",
    "compression",
    "error_feedback",
    "cp",
    "order",
    "interleave",
)


def _sync_key(L: Layouts, i: int) -> tuple:
    """Layout i's values of the _SYNC_KEY columns (the compressor by name: codes index each
    Layouts' own list), without building its row."""
    values = [getattr(L, name)[i].item() for name in _SYNC_KEY]
    at = _SYNC_KEY.index("compression")
    values[at] = L.compressions[values[at]]
    return tuple(values)


def _sync_columns(L: Layouts, kind, held, far) -> list[np.ndarray]:
    """The columns _SYNC_KEY names, as integer codes, with the priced rank's kind and blocks
    (DualPipe's far stage's too)."""
    cols = [kind, held.astype(np.int64), far.astype(np.int64)]
    for name in _SYNC_KEY:
        col = getattr(L, name)
        if col.dtype.kind == "f":
            col = np.unique(col, return_inverse=True)[1]
        cols.append(col)
    return cols


def _rates(L: Layouts, plans: list[SyncPlan], inverse, on, ahead, slowed):
    """The rate each layout's backward runs at beside its reductions and its forward beside
    its parameter gathers (1 without `slowed`, or under a comm hook, whose encodes and
    decodes share the compute stream: the closed form of step.contention does not hold).
    Dense buckets run on the data-parallel group (dp x cp ranks), expert ones on the expert-
    data-parallel group (edp ranks, its own NCCL channels): the rate is the mean of the two
    groups' rates weighted by their network seconds (step.contention.mean_rate)."""
    rates = np.ones(len(L)), np.ones(len(L))
    if slowed is None:
        return rates
    hooked = L.compression != 0  # code 0 is "none"
    for rate, part, rows in zip(rates, ("reduce", "gather"), (on & ~hooked, ahead), strict=True):
        rows = np.nonzero(rows)[0]
        if not rows.size:
            continue
        parts, seconds = [], []
        for expert, kind in ((False, "dp"), (True, "edp")):
            network, grads = (x[inverse[rows]] for x in _group_part(plans, part, expert))
            ranks = L.edp[rows] if expert else L.dp[rows] * L.cp[rows]
            if part == "gather":  # bf16 parameters of the buckets' gradients
                params = grads / L.grad_bytes[rows] * PARAM_WIRE_BYTES
                moved = collective_hbm_bytes("all-gather", params, ranks)
            else:
                moved = np.where(
                    L.zero[rows] == 0,
                    collective_hbm_bytes("all-reduce", grads, ranks),
                    collective_hbm_bytes("reduce-scatter", grads, ranks),
                )
            parts.append(slowed(rows, part, moved, network, kind))
            seconds.append(network)
        rate[rows] = mean_rate(parts, seconds)
    return rates


def _group_part(plans: list[SyncPlan], part: str, expert: bool):
    """(network seconds, gradient bytes) of each plan's `part` ("reduce" or "gather") of its
    dense buckets (expert False) or its expert ones."""
    network, grads = np.zeros(len(plans)), np.zeros(len(plans))
    for k, p in enumerate(plans):
        mine = p.buckets.expert == expert
        seconds = p.params if part == "gather" else reduce_part(p.costs.network, p.params)
        network[k], grads[k] = seconds[mine].sum(), p.buckets.bytes[mine].sum()
    return network, grads


def _tail(plans: list[SyncPlan], part: str, inverse, x, rate) -> np.ndarray:
    """Each layout's exposed `part` ("reduce" or "gather") of its sync at its x, its compute
    running at `rate` beside the network (step.contention.contended_tail)."""
    network = np.array([getattr(p, part).network for p in plans])[inverse]
    tail = _at([getattr(p, part) for p in plans], inverse, x / rate)
    return contended_tail(network, tail, rate)


def _at(tails: list[Tail], inverse: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Each layout's Tail (tails[inverse]) at its x: the upper envelope of its lines."""
    width = max((len(t.slopes) for t in tails), default=1)
    slopes = np.zeros((len(tails), width))
    cuts = np.full((len(tails), width), -np.inf)
    for k, t in enumerate(tails):
        slopes[k, : len(t.slopes)] = t.slopes
        cuts[k, : len(t.intercepts)] = t.intercepts
    return np.max(cuts[inverse] + slopes[inverse] * x[:, None], axis=1)
