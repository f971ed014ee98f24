"""One rank's nodes of an exported layout as they are written (traces.export): each node
with its end (the latest of its dependencies' plus its duration), an op's collectives
after or beside its compute, ZeRO-3's units and ring attention's steps inside it, and
where the data-parallel sync starts."""

from __future__ import annotations

from dataclasses import dataclass

from commsim.specs import SpecError
from commsim.step.kernel_bytes import ATTENTION_BACKWARD
from commsim.traces.graph import Node

# one collective of a ZeRO-3 unit: (op, bytes, seconds, group kind: dp, shard, replica, edp)
Coll = tuple[str, float, float, str]


@dataclass(frozen=True)
class Zero3:
    """A chunk's ZeRO-3 units (step.fsdp): each gathers its parameters before its forward
    and its backward and reduce-scatters its gradients after its backward; one stage
    (pp 1) gathers the end layers with its first unit. Each is the collectives step.fsdp
    sums, run one after another: the dense parameters' on the sharding group (dp, or
    hybrid sharding's shard group, whose reduce-scatter is followed by the shard's
    all-reduce across the replica group), the experts' on their expert-data-parallel one."""

    units: int
    gather: tuple[Coll, ...]
    scatter: tuple[Coll, ...]
    ends: tuple[Coll, ...]
    overlap: bool


@dataclass(frozen=True)
class Ring:
    """A chunk's ring attention (step.model._context_parallel): per block, cp - 1 steps,
    each passing this rank's K/V chunk to the next context-parallel rank (backward also
    their gradients) while attending to the chunk it holds."""

    blocks: int
    nbytes: float
    step: float  # seconds of one transfer
    core: float  # seconds of a block's forward attention core, this rank's share per step
    cp: int
    merge: tuple[float, float]  # seconds of merging a block's steps, forward and backward
    replay: bool  # the backward replays the forward's ring first (recomputation)


class Writer:
    """One rank's nodes as they are added, each with its end: the latest of its
    dependencies' plus its duration (a receive's: when its message lands, given), which is
    the schedule's where the ops follow it."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.ends: list[float] = []  # each node's end in the schedule (step.pipeline.simulate)
        self.stream: tuple[int, ...] = ()  # the last ZeRO-3 collective (one stream, in order)

    def ring(self, what, fwd: bool, compute: float, ring: Ring, pg: str, peers, last):
        """An op's compute as its blocks, each as ring_block runs it."""
        for b in range(ring.blocks):
            last = self.ring_block(what, fwd, compute, ring, pg, peers, b, last)
        return last

    def ring_block(self, what, fwd: bool, compute: float, ring: Ring, pg, peers, b: int, last):
        """Block b of an op: cp - 1 ring steps, the merge of the steps' partial results
        through HBM, then the rest of its share of the compute; a backward under
        recomputation replays the forward's steps and merge first. A step sends this rank's
        chunk to the next rank (`peers`: next, previous; backward, then the gradients' too),
        receives the previous rank's, and attends to the one it holds (the core's share;
        backward ATTENTION_BACKWARD times it), the next step waiting for all three."""
        passes = [True] if fwd else [True, False] if ring.replay else [False]
        part = {True: ring.core, False: ring.core * ATTENTION_BACKWARD}
        merge = {True: ring.merge[0], False: ring.merge[1]}
        rest = compute / ring.blocks - sum((ring.cp - 1) * part[p] for p in passes)
        if rest < 0:
            raise SpecError("--cp", "", "a block's attention outlasts its compute: not exported")
        kw = dict(op="send-recv", bytes=ring.nbytes, pg=pg)
        for forward in passes:
            name = f"{what} block {b}" + (" replay" if forward and not fwd else "")
            last = self._steps(name, forward, part[forward], ring, peers, last, kw)
            last = self.add("comp", f"{name} ring merge", merge[forward], last)
        return self.add("comp", f"{what} block {b}", rest, last)

    def _steps(self, name, forward: bool, part: float, ring: Ring, peers, last, kw):
        """A block's cp - 1 ring steps in one direction (forward: K and V; backward: also
        their gradients)."""
        nxt, prv = peers
        sends = 1 if forward else 2
        for s in range(1, ring.cp):
            step = f"{name} ring step {s}"
            sent = last
            for j in range(sends):
                sent = self.add("send", f"{step} send {j}", ring.step, sent, peer=nxt, **kw)
            got = last
            for j in range(sends):  # the ring is symmetric: the previous rank's send
                # lands when this rank's own j-th does
                landed = self.ends[sent[0] - (sends - 1 - j)]
                got = self.add("recv", f"{step} recv {j}", 0.0, got, landed, peer=prv, **kw)
            core = self.add("comp", f"{step} attention", part, last)
            last = (*sent, *got, *core)
        return last

    def units(self, what, fwd: bool, compute: float, z3: Zero3, pgs: dict, before, body=None):
        """An op's compute as ZeRO-3 units of equal compute (step.fsdp): unit j waits for
        its gathers and unit j - 1; with overlap the gathers of unit j + 1 are issued when
        unit j starts (after unit j - 1), else after unit j (and its reduce-scatters); each
        backward unit's reduce-scatters follow it; the op ends with its last unit and, in
        backward, that unit's reduce-scatters. `pgs`: this rank's group of each kind;
        `body(j, deps)` adds unit j's compute (default: one node)."""
        side = "forward" if fwd else "backward"

        def colls(label, specs, deps):
            for op, nbytes, seconds, kind in specs:  # one stream, in issue order
                self.stream = self.add(
                    "coll",
                    f"zero3 {op} {label}" + (f" ({kind})" if kind != "dp" else ""),
                    seconds,
                    (*deps, *self.stream),
                    op=op,
                    bytes=nbytes,
                    pg=pgs[kind],
                )
            return self.stream

        def compute_unit(j, deps):
            return self.add("comp", f"{what} unit {j}", compute / z3.units, deps)

        body = body or compute_unit
        if z3.ends:
            colls(f"end layers ({side})", z3.ends, before)
        gathers = {0: colls(f"unit 0 ({side})", z3.gather, before)}
        previous, unit, scatter = before, (), ()
        for j in range(z3.units):
            if z3.overlap and j + 1 < z3.units:  # prefetched when unit j starts
                gathers[j + 1] = colls(f"unit {j + 1} ({side})", z3.gather, previous)
            unit = body(j, (*previous, *gathers[j]))
            if not fwd:
                scatter = colls(f"unit {j}", z3.scatter, unit)
            if not z3.overlap and j + 1 < z3.units:
                gathers[j + 1] = colls(f"unit {j + 1} ({side})", z3.gather, (*unit, *scatter))
            previous = unit
        return (*unit, *scatter)

    def add(self, kind, name, duration, deps, end: float | None = None, **kw) -> tuple[int]:
        self.nodes.append(Node(len(self.nodes), kind, name, duration, tuple(deps), **kw))
        self.ends.append(self.landed(deps) + duration if end is None else end)
        return (len(self.nodes) - 1,)

    def landed(self, deps, at: float = 0.0) -> float:
        """The latest end of `deps`, and at least `at`."""
        return max([at, *(self.ends[d] for d in deps)])

    def collectives(self, runs, before, last, start: float, tp_end: float) -> tuple[int, ...]:
        """An op's collectives after its compute (`last`), one after another; with tp_overlap
        its tensor-parallel ones beside the compute instead, from the op's `start` (after
        `before`), as late as the schedule's exposed time for them allows (an idle node
        first): the op's next node waits for both (see README, Limits, where they outlast
        it)."""
        beside = [r for r in runs if r[5]]
        after = sum(r[2] for r in runs if not r[5])
        if beside:
            lead = tp_end - after - start - sum(r[2] for r in beside)
            branch = before
            if lead > 0:
                branch = self.add("comp", "idle (tp all-reduces under compute)", lead, before)
            for op_name, size, seconds, group, pg, _ in beside:
                kw = dict(op=op_name, bytes=size, pg=pg)
                branch = self.add("coll", f"{group} {op_name}", seconds, branch, **kw)
            last = (*last, *branch)
        for op_name, size, seconds, group, pg, _ in (r for r in runs if not r[5]):
            kw = dict(op=op_name, bytes=size, pg=pg)
            last = self.add("coll", f"{group} {op_name}", seconds, last, **kw)
        return last


def sync_start(w: Writer, begin: float) -> tuple[int, ...]:
    """The node the sync's first collective waits for: the last that ends by `begin`, and,
    where it ends earlier (the sync starts inside a collective, a send or an idle stretch:
    interleaved schedules hide the sync across several chunks' backwards), a wait for the
    rest, so the sync starts when the schedule has it start."""
    eps = 1e-12 * max(abs(begin), 1.0)
    anchor = max((j for j, e in enumerate(w.ends) if e <= begin + eps), default=None)
    if anchor is None:
        return w.add("comp", "idle (until the sync starts)", begin, (), begin)
    if begin - w.ends[anchor] <= eps:
        return (anchor,)
    return w.add("comp", "idle (until the sync starts)", begin - w.ends[anchor], (anchor,), begin)
