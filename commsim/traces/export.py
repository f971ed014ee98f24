"""The execution graph of any commsim layout (for Chakra files): every rank's step as the
step model schedules it, so a user without GPUs can feed other simulators.

- Plain data parallelism: the step's own timeline (step.timeline via step.predict): each
  micro-batch's forward and backward, the last backward layer by layer, each gradient
  bucket's all-reduce waiting for the layer that makes it ready (overlap off: the
  backward's end) and for the bucket before it, then the optimizer; a comm hook's encodes
  inside the last backward, each bucket's collectives on its compressed payloads after
  its encode, its decode after them and the backward. Its replay is the predicted step.
  Under the parameter server each all-reduce is one collective lasting its push and pull
  (the trace's metadata names the algorithm and its servers).
- Tensor x pipeline x data (x expert) parallelism, ZeRO 0-2, in either rank order: each
  stage's 1F1B (or interleaved) op order (step.pipeline.stage_order); an op is a receive
  from the previous stage, its compute, its tensor-parallel all-reduces
  (Shape.tp_collectives a block forward: 2 dense, Shoeybi et al.; twice that backward
  under full recomputation) and expert all-to-alls, each of the model's size
  (step.model.tp_bytes, ep_bytes) and price, then the send to the next stage (send_bytes).
  After the stage's last backward, the gradient buckets (step.dpsync: an all-reduce each,
  or ZeRO's reduce-scatter and all-gather, step.sync.allreduce_costs) run one after
  another from where the model's hidden part of the sync begins (the schedule's end less
  the hidden part, also before the last chunk's backward when interleaved: the model hides
  it under the whole last micro-batch's backward), then the optimizer. Its replay is the
  step the pipeline schedule lays out (step.pipeline.pipeline_events); the closed form
  `predict` reports differs from it by the send accounting step.pipeline describes.

  With tp_overlap an op's tensor-parallel all-reduces run beside its compute (Writer
  .collectives), as late as the schedule's exposed time for them allows.

  ZeRO-3 / FSDP: each op's compute as its chunk's units with their gathers and reduce-
  scatters (Writer.units, as step.fsdp runs them: hybrid sharding's on the shard group,
  each reduce-scatter followed by the replica group's all-reduce; a backward's gathers as
  reshard_after_forward leaves them, step.fsdp.backward_gathers; a unit beside its
  neighbours' collectives as long as step.fsdp.beside_units prices it); its replay follows
  those units, not the schedule (which has no ZeRO-3 inside its ops): on one stage it is
  `predict`'s step where compute hides the gathers, or nothing is overlapped.

  Context parallelism: each op's compute as its chunk's blocks with their ring-attention
  steps (Writer.ring), the very steps the step model sums (StepModel.rings: Transformer
  Engine's ring, or PyTorch's for torchtitan's stacks, attention slowed beside each
  transfer); under ZeRO-3 each unit is such a block. On one stage its replay is
  `predict`'s step (with ZeRO-3: where compute hides the gathers).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from commsim.scenario import Setup, check_layout
from commsim.specs import SpecError, Strategy
from commsim.step.fsdp import backward_gathers, beside_units
from commsim.step.layouts import RANK_ORDERS, Layouts
from commsim.step.model import (
    ALL_TO_ALLS_FORWARD,
    ep_bytes,
    etp_bytes,
    send_bytes,
    tp_bytes,
)
from commsim.step.pipeline import chunk_times, simulate
from commsim.step.predict import predict, step_model, strategy_layouts
from commsim.step.sync import PARAM_WIRE_BYTES
from commsim.topology.placement import PLACEMENTS, rank_grid
from commsim.traces.graph import Graph, Node
from commsim.traces.writer import Coll, Ring, Writer, Zero3, sync_start


def _refuse(strategy: Strategy, source: str) -> None:
    """What the export does not write, one line each naming the scenario field (see README,
    Limits): expert all-to-alls hidden under another micro-batch's compute, DeepSpeed's
    2021 per-tensor ZeRO-3, DualPipe's bidirectional schedule."""
    for field, bad in (
        ("strategy.ep_overlap", strategy.ep_overlap),
        ("strategy.zero3_issue", strategy.zero3_issue != "unit"),
        ("strategy.pipeline_schedule", strategy.pipeline_schedule != "1f1b"),
    ):
        if bad:
            raise SpecError(source, field, "not exported to Chakra (see README, Limits)")


class _Ranks:
    """Rank ids of every group kind (the layout's rank order: Megatron's tp-cp-ep-dp-pp or
    tp-cp-ep-pp-dp, under its placement: rank r runs on the placement's r-th GPU; expert
    groups on the folded grid, hybrid sharding's shard and replica groups) and the process
    groups named after them."""

    def __init__(self, model, L: Layouts, n: int):
        r = L.row(0)
        self.placement = PLACEMENTS.index(r["placement"])
        self.order = RANK_ORDERS.index(r["order"])
        self.rank_of_gpu = np.argsort(model.groups.orders[r["placement"]])
        self.shape = (r["tp"], r["dp"], r["pp"], r["ep"], r["cp"])
        self.shard, self.etp = r["fsdp_shard"] or 1, r["etp"]
        tp, dp, pp, _, cp = self.shape
        self.grid = rank_grid(np.arange(n), r["order"], tp, cp, dp, pp)  # [stage, dp, cp, tp]
        self.at = np.argwhere(self.grid >= 0)[np.argsort(self.grid.ravel())]  # rank -> index
        self.model, self.n = model, n
        self.groups: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.pg: dict[int, dict[str, str]] = {rank: {} for rank in range(n)}  # rank -> kind -> pg

    def kind(self, kind: str) -> None:
        tp, dp, pp, ep, cp = self.shape
        gpus = self.model.groups.members(
            self.placement, kind, tp, dp, pp, ep, cp, self.shard, self.order, self.etp
        )
        for j, row in enumerate(self.rank_of_gpu[gpus].tolist()):
            name = f"{kind}{j}"
            self.groups[name] = (kind, tuple(row))
            for rank in row:
                self.pg[rank][kind] = name

    def ring(self, rank: int) -> tuple[str, tuple[int, int]]:
        """The rank's context-parallel group and its (next, previous) ranks round it."""
        pg = self.pg[rank]["cp"]
        members = self.groups[pg][1]
        at = members.index(rank)
        return pg, (members[(at + 1) % len(members)], members[(at - 1) % len(members)])

    def stage(self, rank: int) -> int:
        return int(self.at[rank][0])

    def stage_rank(self, rank: int, stage: int) -> int:
        """The rank at the same (dp, cp, tp) position on another stage."""
        _, d, c, t = self.at[rank]
        return int(self.grid[stage, d, c, t])


def export_graph(setup: Setup, strategy: Strategy | None = None) -> tuple[Graph, float]:
    """(every rank's graph, the step time `predict` reports) of one strategy."""
    strategy = strategy or setup.scenario.strategy
    check_layout(setup, strategy)
    _refuse(strategy, setup.source)
    model = step_model(setup)
    L = strategy_layouts(setup, [strategy])
    pred = predict(setup, strategy, model)
    ranks = _Ranks(model, L, setup.n_gpus)
    meta = {
        "generator": "commsim",
        "algorithm": strategy.algorithm,
        "placement": strategy.placement,
    }
    if strategy.algorithm == "ps":  # its servers: what a replay on commsim's model prices
        meta["ps_shards"] = str(strategy.ps_shards)
    if L.plain[0]:
        if setup.dp(strategy) > 1:
            ranks.kind("dp")
        nodes = _ddp_nodes(pred, _bucket_colls(model, L, pred), bool(L.overlap[0]))
        graph = Graph({}, ranks.groups, meta)
        for rank in range(setup.n_gpus):
            graph.ranks[rank] = [_with_pg(x, ranks.pg[rank].get("dp")) for x in nodes]
        return graph, pred.step_time_s
    graph = _pipeline_graph(model, L, ranks)
    graph.metadata.update(meta)
    return graph, pred.step_time_s


def _with_pg(node: Node, pg: str | None) -> Node:
    if node.kind != "coll":
        return node
    return Node(node.id, node.kind, node.name, node.duration, node.deps, node.op, node.bytes, pg)


def _ddp_nodes(pred, colls: list[list[tuple[str, float, float]]], overlap: bool) -> list[Node]:
    """The plain-DDP timeline (step.timeline) as one rank's nodes (pg filled in per rank):
    its compute stream as a chain (a comm hook's encodes inside the last backward, its
    decodes after it), each bucket's collectives (`colls`, one stream) after the node that
    launches them (its encode, else the layer that makes it ready; overlap off: the
    backward's end) and the previous bucket's, each decode after its bucket's, the
    optimizer after the last."""
    compute = sorted((e for e in pred.events if e.stream == "compute"), key=lambda e: e.start_s)
    ends = np.array([e.end_s for e in compute])
    backward = max(k for k, e in enumerate(compute) if e.label.startswith(("backward", "encode")))
    launch = [
        backward if not overlap else int(np.argmin(np.abs(ends - b.ready_s))) for b in pred.buckets
    ]
    for k, e in enumerate(compute):
        if overlap and e.label.startswith("encode bucket "):
            launch[int(e.label.rsplit(" ", 1)[1])] = k
    w, last, stream = Writer(), (), ()
    done: dict[int, tuple[int, ...]] = {}  # bucket -> its last collective
    for k, e in enumerate(compute):
        deps = last
        if e.label.startswith("decode bucket "):
            deps = (*deps, *done[int(e.label.rsplit(" ", 1)[1])])
        if e.label == "optimizer":
            deps = (*deps, *stream)
        last = w.add("comp", e.label, e.end_s - e.start_s, deps)
        for b in (b for b, at in enumerate(launch) if at == k):
            deps = (*last, *stream)
            for op, size, seconds in colls[b]:
                name = f"{op} bucket {b}"
                stream = deps = w.add("coll", name, seconds, deps, op=op, bytes=size)
            done[b] = stream
    return w.nodes


def _bucket_colls(model, L: Layouts, pred) -> list[list[tuple[str, float, float]]]:
    """(op, bytes, seconds) of each plain-DDP bucket's collectives: its all-reduce, or a
    comm hook's collectives on its compressed payloads (_asked: what the step model
    prices for the bucket, in the hook's order)."""
    if L.row(0)["compression"] == "none":
        return [[("all-reduce", b.bytes, b.time_s)] for b in pred.buckets]
    sync = model.dp.sync_plan(L, 0).buckets
    asked = _asked(model, L, sync.bytes, sync.expert)
    return [
        [(op, float(sizes[b]), float(times[b])) for op, sizes, times, _ in asked]
        for b in range(len(pred.buckets))
    ]


def _asked(model, L: Layouts, nbytes, expert) -> list[tuple[str, np.ndarray, np.ndarray, bool]]:
    """(op, sizes, seconds, expert) of every set of collectives the step model's sync asks
    its groups to price for these buckets (step.dpsync.bucket_costs: an all-reduce each,
    ZeRO's reduce-scatter and all-gather, or a comm hook's collectives), in the order asked."""
    asked: list[tuple[str, np.ndarray, np.ndarray, bool]] = []
    r = L.row(0)
    price = model.dp.group_price(r)

    def record(op, algorithm, sizes, expert):
        t = price(op, algorithm, sizes, expert)
        asked.append((op, np.asarray(sizes, dtype=float), np.asarray(t, dtype=float), expert))
        return t

    model.dp.bucket_costs(r, nbytes, expert, int(L.grad_bytes[0]), record)
    return asked


def _bucket_ops(model, L: Layouts) -> list[tuple[str, float, float, bool]]:
    """(op, bytes, seconds, expert) of every data-parallel collective of the stage's sync
    (_asked, by op, then bucket: they run back to back from one point, so their order does
    not change when they end); groups of one rank run nothing (priced 0)."""
    b = model.dp.sync_plan(L, 0).buckets
    return [
        (op, float(s), float(t), bool(expert))
        for op, sizes, times, expert in _asked(model, L, b.bytes, b.expert)
        for s, t in zip(sizes, times, strict=True)
        if t > 0
    ]


def _pipeline_graph(model, L: Layouts, ranks: _Ranks) -> Graph:
    """Every rank of a hybrid layout (see the module docstring)."""
    row, b = L.row(0), model.evaluate(L).row(0)
    p, m, v = row["pp"], row["micro_batches"], row["interleave"]
    t = chunk_times(row, b)
    blocks = float(model.compute(L).blocks[0]) / v
    z3 = _zero3(model, L, blocks) if row["zero"] == 3 and row["dp"] * row["cp"] > 1 else None
    _group_kinds(model, L, ranks, z3 is not None)
    colls = _op_collectives(model, L, blocks)
    send = float(send_bytes(L, model.shape)[0])
    sync = _bucket_ops(model, L)
    ring = _ring(model, L, blocks) if row["cp"] > 1 else None
    ops = simulate(p, m, v, t)
    graph = Graph({}, ranks.groups)
    for rank in range(ranks.n):
        k = ranks.stage(rank)
        mine = [o for o in ops if o.stage == k]
        graph.ranks[rank] = _stage_nodes(rank, k, mine, row, t, colls, send, sync, ranks, z3, ring)
    return graph


def _group_kinds(model, L: Layouts, ranks: _Ranks, zero3: bool) -> None:
    """The process groups of every kind the layout runs a collective on (groups of one rank
    run nothing)."""
    row = L.row(0)
    on = [("tp", row["tp"]), ("dp", row["dp"] * row["cp"]), ("ep", row["ep"]), ("cp", row["cp"])]
    if model.shape.expert_params:
        on += [("edp", int(L.edp[0])), ("etp", int(L.expert_tp[0]))]
    if zero3 and row["fsdp_shard"]:  # hybrid sharding
        shard = row["fsdp_shard"]
        on += [("shard", shard * row["cp"]), ("replica", row["dp"] // shard)]
    for kind, n in on:
        if n > 1:
            ranks.kind(kind)
    if row["pp"] > 1:
        ranks.groups["pp"] = ("pp", tuple(range(ranks.n)))


def _op_collectives(model, L: Layouts, blocks: float) -> list[tuple[str, float, float, str, int]]:
    """(op, bytes, seconds, group kind, count a forward) of a chunk's tensor-parallel all-
    reduces, expert all-to-alls and the experts' tensor-parallel all-reduces, each of the
    step model's size and price (step.model._tensor_parallel, _expert_parallel)."""
    sh, row = model.shape, L.row(0)
    colls = []
    if row["tp"] > 1:
        ar = float(model.groups.price("all-reduce", "tp", L, tp_bytes(L, sh))[0])
        colls.append(
            ("all-reduce", float(tp_bytes(L, sh)[0]), ar, "tp", sh.tp_collectives * blocks)
        )
    if row["ep"] > 1 and sh.routed:
        a2a = float(model.groups.price("all-to-all", "ep", L, ep_bytes(L, sh))[0])
        colls.append(
            (
                "all-to-all",
                float(ep_bytes(L, sh)[0]),
                a2a,
                "ep",
                ALL_TO_ALLS_FORWARD * sh.moe_share * blocks,
            )
        )
    if int(L.expert_tp[0]) > 1 and sh.routed:  # the experts' tensor-parallel gather
        gather = float(model.groups.price("all-reduce", "etp", L, etp_bytes(L, sh))[0])
        colls.append(
            ("all-reduce", float(etp_bytes(L, sh)[0]), gather, "etp", sh.moe_share * blocks)
        )
    for op, _, _, _, count in colls:
        if abs(count - round(count)) > 1e-9:
            raise SpecError("--pp", "", f"{count:g} {op}s a chunk is not whole: not exported")
    return [(op, size, seconds, kind, round(count)) for op, size, seconds, kind, count in colls]


def _ring(model, L: Layouts, blocks: float) -> Ring:
    """The ring of a layout: its steps as the step model prices them (StepModel.rings: the
    layout's stack's ring, its attention slowed beside the transfers)."""
    if abs(blocks - round(blocks)) > 1e-9 or blocks < 1:
        raise SpecError("--cp", "", f"{blocks:g} blocks a chunk: not exported")
    titan, te, torch = model.rings(L, model.compute(L))
    return Ring(int(round(blocks)), (torch if titan[0] else te).row(0))


def _zero3(model, L: Layouts, blocks: float) -> Zero3:
    """A chunk's ZeRO-3 units, sized and priced as step.fsdp._per_unit does: per unit the
    dense parameters per GPU (a block's over tp) on the sharding group, the experts' (over
    etp x ep) on the expert-data-parallel one; hybrid sharding's reduce-scatter is followed
    by the shard's all-reduce over the replica group; one stage (pp 1) gathers the end
    layers too. Groups of one rank run nothing (step.groups prices them 0). A block's
    compute beside its neighbour's collectives is step.fsdp's (beside_units)."""
    sh, r = model.shape, L.row(0)
    if abs(blocks - round(blocks)) > 1e-9 or blocks < 1:
        raise SpecError("--zero 3", "", f"{blocks:g} ZeRO-3 units a chunk: not exported")
    shard = "shard" if r["fsdp_shard"] else "dp"
    g = float(L.grad_bytes[0])

    def run(op: str, kind: str, params: float, dtype_bytes: float) -> tuple[Coll, ...]:
        nbytes = params * dtype_bytes
        seconds = float(model.groups.price(op, kind, L, np.array([nbytes]))[0])
        return ((op, nbytes, seconds, kind),) if seconds > 0 and nbytes > 0 else ()

    dense = (sh.block_params - sh.expert_params) / r["tp"]
    sparse = sh.expert_params / float(L.expert_tp[0] * r["ep"])
    ends = (sh.pre_params + sh.post_params) / r["tp"] if r["pp"] == 1 else 0.0
    replica = ()
    if r["fsdp_shard"]:  # each shard's gradient summed across the replica groups
        replica = run("all-reduce", "replica", dense / (r["fsdp_shard"] * r["cp"]), g)
    parts = [
        (
            dense,
            run("all-gather", shard, dense, PARAM_WIRE_BYTES),
            run("reduce-scatter", shard, dense, g) + replica,
            False,
        ),
    ]
    if sh.expert_params:
        parts.append(
            (
                sparse,
                run("all-gather", "edp", sparse, PARAM_WIRE_BYTES),
                run("reduce-scatter", "edp", sparse, g),
                True,
            )
        )
    return Zero3(
        int(round(blocks)),
        tuple(c for _, gather, _, _ in parts for c in gather),
        tuple(c for _, _, scatter, _ in parts for c in scatter),
        run("all-gather", shard, ends, PARAM_WIRE_BYTES),
        bool(r["overlap"]),
        _regather(L),
        _beside(model, L, parts),
    )


def _beside(model, L: Layouts, parts) -> tuple[float, float, float, float] | None:
    """(a block's forward, backward, each beside its neighbour's ZeRO-3 collectives) as
    step.fsdp prices them (beside_units, given this layout's `parts`: parameters, gathers,
    reduce-scatters, expert); None where the model prices compute at one efficiency."""
    c = model.compute(L)
    seconds = [
        (
            params,
            np.array([sum(x[2] for x in gather)]),
            np.array([sum(x[2] for x in scatter)]),
            expert,
        )
        for params, gather, scatter, expert in parts
    ]
    f_slow, b_slow = beside_units(model, L, c, np.array([0]), seconds)
    if f_slow is None:
        return None
    return float(c.block_fwd[0]), float(c.block_bwd[0]), float(f_slow[0]), float(b_slow[0])


def _regather(L: Layouts) -> tuple[bool, bool, bool]:
    """(the end layers, the first unit, the later units): which a backward gathers again, by
    step.fsdp's rule (backward_gathers, given gathers counted as 1 a unit and 1 more for
    the end layers where its callers have them freed: not under PyTorch FSDP's states)."""
    ends = np.where(L.fsdp_states[:1], 1.0, 2.0)
    first, later = (float(x[0]) for x in backward_gathers(L.reshard[:1], 1.0, ends))
    return first == 2.0, first > 0, later > 0


def _tag(kind: str, chunk: int, mb: int, m: int, v: int) -> int:
    """The message into op (kind, chunk, mb) of its receiving stage."""
    return ((kind == "B") * v + chunk) * m + mb


def _stage_nodes(rank, k, ops, row, t, colls, send, sync, ranks, z3, ring) -> list[Node]:
    """One rank's chain (receive, compute, tp/ep collectives, send per op, each node ending
    when the schedule says; an op's compute as ZeRO-3 units, ring-attention blocks, or
    units of ring-attention blocks), then its data-parallel sync from where it begins
    (sync_start) and the optimizer."""
    p, m, v = row["pp"], row["micro_batches"], row["interleave"]
    full, overlap = row["recompute"] == "full", bool(row["tp_overlap"])
    w = Writer()
    begin = ops[-1].end - t.dp_hidden  # the sync's start: the model hides that before the end
    last: tuple[int, ...] = ()
    pp_pg = "pp" if p > 1 else None
    pgs = ranks.pg[rank]
    cp = ranks.ring(rank) if ring is not None else None
    for op in ops:
        kind, c, i = op.kind, op.chunk, op.mb
        fwd = kind == "F"
        src = (k - 1, c) if k > 0 else (p - 1, c - 1) if c > 0 else None
        dst = (k + 1, c) if k < p - 1 else (0, c + 1) if c < v - 1 else None
        if not fwd:
            src, dst = dst, src
        pipe = dict(op="send-recv", bytes=send, pg=pp_pg)
        if src is not None:
            peer, tag = ranks.stage_rank(rank, src[0]), _tag(kind, c, i, m, v)
            last = w.add(
                "recv",
                f"recv {kind}{i}.{c}",
                0.0,
                last,
                w.landed(last, op.start),
                peer=peer,
                tag=tag,
                **pipe,
            )
        what = f"{'forward' if fwd else 'backward'} {i} chunk {c}"
        before, compute = last, t.forward if fwd else t.backward
        if z3 is not None:  # ZeRO-3's units, each a block of ring attention under cp
            body = partial(w.ring_block, what, fwd, compute, ring, *cp) if ring else None
            last = w.units(what, fwd, compute, z3, pgs, last, body)
        elif ring is not None:
            last = w.ring(what, fwd, compute, ring, *cp, last)
        else:
            if op.start < begin < op.compute_end:  # the sync starts inside this compute
                last = w.add("comp", f"{what} (before sync)", begin - op.start, last)
                compute -= begin - op.start
            last = w.add("comp", what, compute, last)
        runs = [
            (op_name, size, seconds, group, pgs[group], group == "tp" and overlap)
            for op_name, size, seconds, group, count in colls
            for _ in range(count * (2 if full and not fwd else 1))
        ]
        last = w.collectives(runs, before, last, op.start, op.tp_end)
        if dst is not None:
            peer, tag = ranks.stage_rank(rank, dst[0]), _tag(kind, dst[1], i, m, v)
            last = w.add("send", f"send {kind}{i}.{c}", t.send, last, peer=peer, tag=tag, **pipe)
    # where the ops ran as the schedule says, this is `begin`; with ring attention or ZeRO-3
    # units inside them, the hidden part before their own end
    prev = sync_start(w, w.landed(last) - t.dp_hidden) if sync else ()
    # ZeRO 1-2's parameter gathers run after the optimizer step, one by one, where they are
    # not overlapped with the next forward (step.dpsync: overlap_param_gather off)
    later = bool(row["overlap"]) and not row["gather_overlap"]
    ahead = [not (later and op_name == "all-gather") for op_name, *_ in sync]

    def run(ops, prev):
        for op_name, size, seconds, expert in ops:
            pg = pgs["edp" if expert else "dp"]
            prev = w.add("coll", f"dp {op_name}", seconds, prev, op=op_name, bytes=size, pg=pg)
        return prev

    prev = run([x for x, a in zip(sync, ahead, strict=True) if a], prev)
    prev = w.add("comp", "optimizer", t.optimizer, (*last, *prev))
    run([x for x, a in zip(sync, ahead, strict=True) if not a], prev)
    return w.nodes
