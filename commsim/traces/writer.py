"""One rank's nodes of an exported layout as they are written (traces.export): each node
with its end (the latest of its dependencies' plus its duration), an op's collectives
after or beside its compute, ZeRO-3's units and ring attention's steps inside it, and
where the data-parallel sync starts."""

from __future__ import annotations

from dataclasses import dataclass

from commsim.specs import SpecError
from commsim.step.contention import compute_end
from commsim.step.ringsteps import Ring as RingSteps
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
    all-reduce across the replica group), the experts' on their expert-data-parallel one.
    `regather`: which the backward gathers again (the end layers, the first unit, the later
    units), by reshard_after_forward (step.fsdp.backward_gathers)."""

    units: int
    gather: tuple[Coll, ...]
    scatter: tuple[Coll, ...]
    ends: tuple[Coll, ...]
    overlap: bool
    regather: tuple[bool, bool, bool] = (True, True, True)
    # a block's (forward, backward, forward beside a unit's gathers, backward beside its
    # gathers and reduce-scatters) seconds (step.fsdp); None: no contention
    beside: tuple[float, float, float, float] | None = None

    def slowed(self, fwd: bool, comm: float) -> float:
        """Seconds a unit's compute runs longer beside `comm` seconds of its neighbours'
        collectives (step.contention.compute_end, at step.fsdp's rates)."""
        if self.beside is None or comm <= 0:
            return 0.0
        f, b, f_slow, b_slow = self.beside
        alone, slow = (f, f_slow) if fwd else (b, b_slow)
        return float(compute_end(alone, slow, comm)) - alone


@dataclass(frozen=True)
class Ring:
    """A chunk's ring attention: `blocks` blocks, each running one layer's ring as the step
    model prices it (step.model.StepModel.rings, this layout's row: the same steps its
    closed form sums)."""

    blocks: int
    layer: RingSteps


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

    def ring_block(self, what, fwd: bool, compute, ring: Ring, pg, peers, b: int, last, extra=0.0):
        """Block b of an op: its ring's steps (a backward under recomputation replays the
        forward's first), the merge of the steps' partial results through HBM, then the rest
        of its share of the compute (less the attention the steps run; `extra` seconds more:
        a ZeRO-3 unit's beside its neighbours' collectives)."""
        layer = ring.layer
        passes = [True] if fwd else [True, False] if layer.replay else [False]
        legs = {True: layer.forward, False: layer.backward}
        ran = sum(leg.count * leg.alone for p in passes for leg in legs[p])
        rest = compute / ring.blocks - ran
        if rest < 0:
            raise SpecError("--cp", "", "a block's attention outlasts its compute: not exported")
        for forward in passes:
            name = f"{what} block {b}" + (" replay" if forward and not fwd else "")
            last = self._steps(name, legs[forward], pg, peers, last)
            merge = layer.merge[0 if forward else 1]
            last = self.add("comp", f"{name} ring merge", merge, last)
        return self.add("comp", f"{what} block {b}", rest + extra, last)

    def _steps(self, name, legs, pg, peers, last):
        """A block's ring steps, leg by leg (step.ringsteps): each its transfer (sends to
        the next rank, `peers`: next, previous, and the previous rank's received; or an
        all-gather on the cp group) beside its attention (slowed while the transfer runs),
        the next step waiting for all of them."""
        nxt, prv = peers
        s = 0
        for leg in legs:
            kw = dict(op=leg.op, bytes=leg.nbytes, pg=pg)
            for _ in range(round(leg.count)):
                s += 1
                step = f"{name} ring step {s}"
                if leg.op == "all-gather":
                    moved = self.add("coll", f"{step} all-gather", leg.message, last, **kw)
                else:
                    moved = self._sends(step, leg, nxt, prv, last, kw)
                core = ()
                if leg.alone > 0:
                    core = self.add("comp", f"{step} attention", leg.attention(), last)
                last = (*moved, *core)
        return last

    def _sends(self, step, leg, nxt, prv, last, kw):
        """A step's messages to the next rank, one after another, and the previous rank's
        received: the ring is symmetric, the previous rank's j-th lands when this rank's
        own j-th does."""
        sent = last
        for j in range(leg.sends):
            sent = self.add("send", f"{step} send {j}", leg.message, sent, peer=nxt, **kw)
        got = last
        for j in range(leg.sends):
            landed = self.ends[sent[0] - (leg.sends - 1 - j)]
            got = self.add("recv", f"{step} recv {j}", 0.0, got, landed, peer=prv, **kw)
        return (*sent, *got)

    def units(self, what, fwd: bool, compute: float, z3: Zero3, pgs: dict, before, body=None):
        """An op's compute as ZeRO-3 units of equal compute (step.fsdp): unit j waits for
        its gathers and unit j - 1; with overlap the gathers of unit j + 1 are issued when
        unit j starts (after unit j - 1), else after unit j (and its reduce-scatters), in the
        backward only those z3.regather keeps; each backward unit's reduce-scatters follow
        it; the op ends with its last unit and, in backward, that unit's reduce-scatters.
        With overlap a unit's compute runs longer beside its neighbours' collectives
        (Zero3.slowed: forward the next unit's gathers, backward also the previous unit's
        reduce-scatters). `pgs`: this rank's group of each kind; `body(j, deps, extra)` adds
        unit j's compute, `extra` seconds longer (default: one node)."""
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

        def compute_unit(j, deps, extra):
            return self.add("comp", f"{what} unit {j}", compute / z3.units + extra, deps)

        def beside(j):  # seconds of collectives beside unit j (prefetched, then issued)
            if not z3.overlap:
                return 0.0
            comm = sum(x[2] for x in z3.gather) if j + 1 < z3.units and again[2] else 0.0
            return comm + (sum(x[2] for x in z3.scatter) if not fwd and j > 0 else 0.0)

        def gather(j, deps):  # unit j's gathers, where this side gathers it
            if not again[1 if j == 0 else 2]:
                return ()
            return colls(f"unit {j} ({side})", z3.gather, deps)

        body = body or compute_unit
        again = (True, True, True) if fwd else z3.regather
        if z3.ends and again[0]:
            colls(f"end layers ({side})", z3.ends, before)
        gathers = {0: gather(0, before)}
        previous, unit, scatter = before, (), ()
        for j in range(z3.units):
            if z3.overlap and j + 1 < z3.units:  # prefetched when unit j starts
                gathers[j + 1] = gather(j + 1, previous)
            unit = body(j, (*previous, *gathers[j]), z3.slowed(fwd, beside(j)))
            if not fwd:
                scatter = colls(f"unit {j}", z3.scatter, unit)
            if not z3.overlap and j + 1 < z3.units:  # the next unit waits for these
                gathers[j + 1] = gather(j + 1, (*unit, *scatter)) or scatter
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
