"""Replay an execution graph: every node starts when the nodes it waits for have ended; a
collective starts when every member rank has reached it (the k-th collective of a process
group on one rank meets the k-th on the others) and lasts its duration; a send lasts its
duration from when the sender reaches it, and the matching receive (same tag, else the
k-th from that sender) ends when the send has
landed (synchronous sends, as Megatron's pipeline p2p: the receiver waits, the sender does
not wait for the receiver). Ranks with no nodes of their own (a partial set of traces)
are taken to reach each collective with the ranks present; a collective whose group is
unknown (pg None) is the rank's own node.

The step time is the latest end. Durations come from `price` (node -> seconds; the
recorded ones by default), so the same graph replays as measured or as commsim prices it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from commsim.specs import SpecError
from commsim.traces.graph import Graph, Node

Price = Callable[[int, Node], float]  # (rank, node) -> seconds


def recorded(rank: int, node: Node) -> float:
    return node.duration


@dataclass(frozen=True)
class Replay:
    start: dict[tuple[int, int], float]  # (rank, node id) -> seconds
    end: dict[tuple[int, int], float]

    @property
    def step_s(self) -> float:
        return max(self.end.values(), default=0.0)

    def rank_end(self, rank: int) -> float:
        return max((t for (r, _), t in self.end.items() if r == rank), default=0.0)


def _vertices(graph: Graph, source: str):
    """Vertex of every node: its own, or its collective's meeting (pg, k), or for a receive
    its own vertex that also waits for the matching send's."""
    vertex: dict[tuple[int, int], tuple] = {}
    members: dict[tuple, list[tuple[int, Node]]] = {}
    seen: dict[tuple, int] = {}
    sends: dict[tuple, tuple[int, int]] = {}
    recvs = []
    for rank, nodes in graph.ranks.items():
        for n in nodes:
            if n.kind == "coll" and n.pg is not None:  # pg None: its group is unknown
                if n.pg not in graph.groups:
                    raise SpecError(
                        source, f"rank {rank} node {n.id}", f"unknown process group {n.pg!r}"
                    )
                k = seen.get((rank, n.pg), 0)
                seen[(rank, n.pg)] = k + 1
                key = ("coll", n.pg, k)
            else:
                key = ("node", rank, n.id)
                if n.kind in ("send", "recv"):
                    k = seen.get((rank, n.kind, n.peer), 0)
                    seen[(rank, n.kind, n.peer)] = k + 1
                    k = ("tag", n.tag) if n.tag is not None else k
                    if n.kind == "send":
                        sends[(rank, n.peer, k)] = (rank, n.id)
                    else:
                        recvs.append(((n.peer, rank, k), (rank, n.id)))
            vertex[(rank, n.id)] = key
            members.setdefault(key, []).append((rank, n))
    extra: dict[tuple, list[tuple]] = {}
    for pair, (rank, nid) in recvs:
        if pair[0] in graph.ranks:  # a sender without a trace: the message is there in time
            if pair not in sends:
                raise SpecError(
                    source,
                    f"rank {rank} node {nid}",
                    f"receive from rank {pair[0]} has no matching send",
                )
            extra.setdefault(vertex[(rank, nid)], []).append(vertex[sends[pair]])
    return vertex, members, extra


def replay(graph: Graph, price: Price = recorded, source: str = "graph") -> Replay:
    """Start and end of every node (see the module docstring); a cycle or a collective that
    never meets is a SpecError naming it."""
    vertex, members, extra = _vertices(graph, source)
    preds: dict[tuple, set] = {v: set() for v in members}
    for v, group in members.items():
        for rank, n in group:
            for d in n.deps:
                if (rank, d) not in vertex:
                    raise SpecError(
                        source, f"rank {rank} node {n.id}", f"depends on missing node {d}"
                    )
                preds[v].add(vertex[(rank, d)])
        preds[v].update(extra.get(v, ()))
        preds[v].discard(v)
    users: dict[tuple, list] = {v: [] for v in members}
    for v, ps in preds.items():
        for p in ps:
            users[p].append(v)
    waiting = {v: len(ps) for v, ps in preds.items()}
    ready = [v for v, k in waiting.items() if k == 0]
    done: dict[tuple, float] = {}
    start, end = {}, {}
    while ready:
        v = ready.pop()
        group = members[v]
        t0 = max((done[p] for p in preds[v]), default=0.0)
        rank, node = group[0]
        # a receive's vertex waits for the send's: it ends when the message lands; members
        # of a collective recorded it differently: the one that waited least is its time
        t1 = t0 if node.kind == "recv" else t0 + min(price(r, n) for r, n in group)
        done[v] = t1
        for r, n in group:
            start[(r, n.id)], end[(r, n.id)] = t0, t1
        for u in users[v]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if len(done) < len(members):
        stuck = next(v for v in members if v not in done)
        what = (
            f"collective {stuck[2]} of process group {stuck[1]!r}"
            if stuck[0] == "coll"
            else f"rank {stuck[1]} node {stuck[2]}"
        )
        raise SpecError(
            source, what, "never runs: a dependency cycle, or ranks disagree on the collectives"
        )
    return Replay(start, end)
