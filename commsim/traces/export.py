"""The execution graph of any commsim layout (for Chakra files): every rank's step as the
step model schedules it, so a user without GPUs can feed other simulators.

- Plain data parallelism: the step's own timeline (step.timeline via step.predict): each
  micro-batch's forward and backward, the last backward layer by layer, each gradient
  bucket's all-reduce waiting for the layer that makes it ready and for the bucket before
  it, then the optimizer. Its replay is the predicted step time.
- Tensor x pipeline x data (x expert) parallelism, ZeRO 0-2: each stage's 1F1B (or
  interleaved) op order (step.pipeline.stage_order); an op is a receive from the previous
  stage, its compute, its tensor-parallel all-reduces (2 a block forward, Shoeybi et al.;
  twice that backward under full recomputation) and expert all-to-alls, each of the
  model's size (step.model.tp_bytes, ep_bytes) and price, then the send to the next stage
  (send_bytes). After the stage's last backward, the gradient buckets (step.dpsync: an
  all-reduce each, or ZeRO's reduce-scatter and all-gather, step.sync.allreduce_costs)
  run one after another from where the model's hidden part of the sync begins, then the
  optimizer. Its replay is the step the pipeline schedule lays out (step.pipeline
  .pipeline_events); the closed form `predict` reports differs from it by the send
  accounting step.pipeline describes.

Not exported (one line each): ZeRO-3/FSDP, context parallelism, tp_overlap, compression,
the parameter-server algorithm.
"""

from __future__ import annotations

import numpy as np

from commsim.scenario import Setup, check_layout
from commsim.specs import SpecError, Strategy
from commsim.step.layouts import Layouts
from commsim.step.model import (
    ALL_TO_ALLS_FORWARD,
    ep_bytes,
    etp_bytes,
    send_bytes,
    tp_bytes,
)
from commsim.step.pipeline import chunk_times, simulate
from commsim.step.predict import predict, step_model, strategy_layouts
from commsim.step.sync import allreduce_costs
from commsim.topology.placement import PLACEMENTS
from commsim.traces.graph import Graph, Node


def _refuse(strategy: Strategy) -> None:
    for flag, bad in (
        ("--zero 3 / --fsdp", strategy.zero == 3),
        ("--cp", strategy.cp > 1),
        ("--etp", strategy.expert_tp != strategy.tp),  # a folded expert grid
        ("--order", strategy.order != "tp-cp-ep-dp-pp"),
        ("tp_overlap", bool(strategy.tp_overlap)),
        ("--compression", strategy.compression != "none"),
        ("--algorithm ps", strategy.algorithm == "ps"),
    ):
        if bad:
            raise SpecError(flag, "", "not exported to Chakra yet (see README, Limits)")


class _Ranks:
    """Rank ids of every group kind (Megatron order under the layout's placement) and the
    process groups named after them."""

    def __init__(self, model, L: Layouts, n: int):
        r = L.row(0)
        self.placement = PLACEMENTS.index(r["placement"])
        order = model.groups.orders[r["placement"]]
        self.rank_of_gpu = np.argsort(order)
        self.shape = (r["tp"], r["dp"], r["pp"], r["ep"], r["cp"])
        self.model, self.n = model, n
        self.groups: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.pg: dict[tuple[str, int], str] = {}  # (kind, rank) -> process group name

    def kind(self, kind: str) -> None:
        tp, dp, pp, ep, cp = self.shape
        gpus = self.model.groups.members(self.placement, kind, tp, dp, pp, ep, cp)
        for j, row in enumerate(self.rank_of_gpu[gpus].tolist()):
            name = f"{kind}{j}"
            self.groups[name] = (kind, tuple(row))
            for rank in row:
                self.pg[(kind, rank)] = name

    def stage_rank(self, rank: int, stage: int) -> int:
        """The rank at the same (dp, tp) position on another stage (Megatron order)."""
        tp, dp, pp, ep, cp = self.shape
        per_stage = self.n // pp
        return stage * per_stage + rank % per_stage


def export_graph(setup: Setup, strategy: Strategy | None = None) -> tuple[Graph, float]:
    """(every rank's graph, the step time `predict` reports) of one strategy."""
    strategy = strategy or setup.scenario.strategy
    check_layout(setup, strategy)
    _refuse(strategy)
    model = step_model(setup)
    L = strategy_layouts(setup, [strategy])
    pred = predict(setup, strategy, model)
    ranks = _Ranks(model, L, setup.n_gpus)
    meta = {
        "generator": "commsim",
        "algorithm": strategy.algorithm,
        "placement": strategy.placement,
    }
    if L.plain[0]:
        if setup.dp(strategy) > 1:
            ranks.kind("dp")
        nodes = _ddp_nodes(pred)
        graph = Graph({}, ranks.groups, meta)
        for rank in range(setup.n_gpus):
            graph.ranks[rank] = [_with_pg(x, ranks.pg.get(("dp", rank))) for x in nodes]
        return graph, pred.step_time_s
    graph = _pipeline_graph(model, L, ranks)
    graph.metadata.update(meta)
    return graph, pred.step_time_s


def _with_pg(node: Node, pg: str | None) -> Node:
    if node.kind != "coll":
        return node
    return Node(node.id, node.kind, node.name, node.duration, node.deps, node.op, node.bytes, pg)


def _ddp_nodes(pred) -> list[Node]:
    """The plain-DDP timeline as one rank's nodes (pg filled in per rank)."""
    compute = sorted((e for e in pred.events if e.stream == "compute"), key=lambda e: e.start_s)
    n_b = len(pred.buckets)
    nodes: list[Node] = []
    ends = []
    for k, e in enumerate(compute):
        nid = n_b + k
        deps = () if k == 0 else (nid - 1,)
        if e.label == "optimizer" and n_b:
            deps = (*deps, n_b - 1)
        nodes.append(Node(nid, "comp", e.label, e.end_s - e.start_s, deps))
        ends.append(e.end_s)
    ends_arr = np.array(ends)
    for b in pred.buckets:
        ready = n_b + int(np.argmin(np.abs(ends_arr - b.ready_s)))
        deps = (ready,) if b.index == 0 else (ready, b.index - 1)
        nodes.append(
            Node(
                b.index,
                "coll",
                f"all-reduce bucket {b.index}",
                b.time_s,
                deps,
                "all-reduce",
                b.bytes,
            )
        )
    return sorted(nodes, key=lambda x: x.id)


def _bucket_ops(model, L: Layouts) -> list[tuple[str, float, float, bool]]:
    """(op, bytes, seconds, expert) of every data-parallel collective of the stage's sync:
    what allreduce_costs prices, recorded as it asks for each (by op, then bucket: they
    run back to back from one point, so their order does not change when they end)."""
    r = L.row(0)
    sync = model.dp.sync_plan(L, 0)
    placement = PLACEMENTS.index(r["placement"])
    shape = (r["tp"], r["dp"], r["pp"], r["ep"], r["ps_shards"], r["cp"])
    asked: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []

    def price(op, algorithm, sizes, expert):
        kind = "edp" if expert else "dp"
        t = model.groups.time(op, algorithm, sizes, placement, kind, *shape)
        asked.append((op, np.asarray(sizes), t, np.full(len(sizes), expert)))
        return t

    if r["dp"] * r["cp"] > 1:
        b = sync.buckets
        allreduce_costs(price, r["algorithm"], b.bytes, b.expert, r["zero"], int(L.grad_bytes[0]))
    return [
        (op, float(s), float(t), bool(e))
        for op, sizes, times, expert in asked
        for s, t, e in zip(sizes, times, expert, strict=True)
    ]


def _pipeline_graph(model, L: Layouts, ranks: _Ranks) -> Graph:
    """Every rank of a hybrid layout (see the module docstring)."""
    row, b = L.row(0), model.evaluate(L).row(0)
    p, m, v = row["pp"], row["micro_batches"], row["interleave"]
    t = chunk_times(row, b)
    sh = model.shape
    blocks = float(model.compute(L).blocks[0]) / v
    full = row["recompute"] == "full"
    for kind, on in (("tp", row["tp"] > 1), ("dp", row["dp"] > 1), ("ep", row["ep"] > 1)):
        if on:
            ranks.kind(kind)
    if row["ep"] > 1 and row["dp"] // row["ep"] > 1:
        ranks.kind("edp")
    if p > 1:
        ranks.groups["pp"] = ("pp", tuple(range(ranks.n)))
    colls = []  # (op, bytes, seconds, kind, per forward)
    if row["tp"] > 1:
        ar = float(model.groups.price("all-reduce", "tp", L, tp_bytes(L, sh))[0])
        colls.append(
            ("all-reduce", float(tp_bytes(L, sh)[0]), ar, "tp", sh.tp_collectives * blocks)
        )
    if row["ep"] > 1 and sh.routed:
        arch = model.workload.arch
        moe = (arch.layers - arch.dense_layers) / arch.layers if arch is not None else 1.0
        a2a = float(model.groups.price("all-to-all", "ep", L, ep_bytes(L, sh))[0])
        colls.append(
            ("all-to-all", float(ep_bytes(L, sh)[0]), a2a, "ep", ALL_TO_ALLS_FORWARD * moe * blocks)
        )
    if row["tp"] > 1 and sh.routed:  # the experts' tensor-parallel gather (etp = tp here)
        ranks.kind("etp")
        gather = float(model.groups.price("all-reduce", "etp", L, etp_bytes(L, sh))[0])
        colls.append(
            ("all-reduce", float(etp_bytes(L, sh)[0]), gather, "etp", sh.moe_share * blocks)
        )
    for op, _, _, _, count in colls:
        if abs(count - round(count)) > 1e-9:
            raise SpecError("--pp", "", f"{count:g} {op}s a chunk is not whole: not exported")
    send = float(send_bytes(L, sh)[0])
    sync = _bucket_ops(model, L)
    hidden = t.dp_hidden
    ops = simulate(p, m, v, t)
    graph = Graph({}, ranks.groups)
    for rank in range(ranks.n):
        k = rank // (ranks.n // p)
        mine = [o for o in ops if o.stage == k]
        graph.ranks[rank] = _stage_nodes(
            rank, k, mine, p, m, v, t, colls, full, send, sync, hidden, ranks
        )
    return graph


def _tag(kind: str, chunk: int, mb: int, m: int, v: int) -> int:
    """The message into op (kind, chunk, mb) of its receiving stage."""
    return ((kind == "B") * v + chunk) * m + mb


def _stage_nodes(rank, k, ops, p, m, v, t, colls, full, send, sync, hidden, ranks) -> list[Node]:
    nodes: list[Node] = []

    def add(kind, name, duration, deps, **kw) -> int:
        nodes.append(
            Node(len(nodes), kind, name, duration, tuple(d for d in deps if d is not None), **kw)
        )
        return len(nodes) - 1

    last = None
    pp_pg = "pp" if p > 1 else None
    for j, op in enumerate(ops):
        kind, c, i = op.kind, op.chunk, op.mb
        fwd = kind == "F"
        src = (k - 1, c) if k > 0 else (p - 1, c - 1) if c > 0 else None
        dst = (k + 1, c) if k < p - 1 else (0, c + 1) if c < v - 1 else None
        if not fwd:
            src, dst = dst, src
        if src is not None:
            last = add(
                "recv",
                f"recv {kind}{i}.{c}",
                0.0,
                (last,),
                op="send-recv",
                bytes=send,
                pg=pp_pg,
                peer=ranks.stage_rank(rank, src[0]),
                tag=_tag(kind, c, i, m, v),
            )
        compute = t.forward if fwd else t.backward
        split = None
        if j == len(ops) - 1 and sync:  # the sync starts under the last backward
            x = min(max(op.end - hidden - op.start, 0.0), compute)
            if 0.0 < x < compute:
                last = add("comp", f"{kind}{i}.{c} (before sync)", x, (last,))
                compute -= x
            split = last
        last = add("comp", f"{'forward' if fwd else 'backward'} {i} chunk {c}", compute, (last,))
        if split is None and j == len(ops) - 1:
            split = last
        for op_name, size, seconds, group, count in colls:
            for _ in range(int(round(count * (2 if full and not fwd else 1)))):
                last = add(
                    "coll",
                    f"{group} {op_name}",
                    seconds,
                    (last,),
                    op=op_name,
                    bytes=size,
                    pg=ranks.pg[(group, rank)],
                )
        if dst is not None:
            peer = ranks.stage_rank(rank, dst[0])
            last = add(
                "send",
                f"send {kind}{i}.{c}",
                t.send,
                (last,),
                op="send-recv",
                bytes=send,
                pg=pp_pg,
                peer=peer,
                tag=_tag(kind, dst[1], i, m, v),
            )
    prev = None
    for op_name, size, seconds, expert in sync:
        group = "edp" if expert else "dp"
        prev = add(
            "coll",
            f"dp {op_name}",
            seconds,
            (split if prev is None else prev,),
            op=op_name,
            bytes=size,
            pg=ranks.pg[(group, rank)],
        )
    add("comp", "optimizer", t.optimizer, (last, prev))
    return nodes
