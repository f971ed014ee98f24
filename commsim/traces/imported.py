"""A traced step as an execution graph (graph.Graph): per rank, its compute as a chain of
nodes cut wherever a collective was launched, the gaps kept as idle nodes, and its
collectives, each waiting for the compute done before its launch and for the previous
collective of its process group (one communication stream per group, as NCCL runs one per
communicator). A gap the rank spent waiting (summary.waits) makes the compute after it wait
for that collective, then for the rest of the gap (the wake-up; none when the collective's
record ends after the rank resumed, as gloo's do: the replay then counts that overrun).

Replayed with the recorded durations the graph gives back the measured step, to the
nanosecond, wherever a group's collectives ran one at a time (NCCL; gloo runs a group's
collectives on two threads, which the graph puts one after the other). Replayed with
commsim's prices it predicts the same step on another cluster.
"""

from __future__ import annotations

import numpy as np

from commsim.specs import SpecError
from commsim.traces.graph import Graph, Node
from commsim.traces.intervals import clip
from commsim.traces.kineto import RankTrace
from commsim.traces.summary import step_collectives, waits


def step_index(trace: RankTrace, number: int) -> int:
    for k, s in enumerate(trace.steps):
        if s.number == number:
            return k
    have = ", ".join(str(s.number) for s in trace.steps)
    raise SpecError(trace.source, "ProfilerStep", f"no step {number} (the trace has {have})")


def _inside(spans: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Which points lie in one of the disjoint sorted intervals."""
    if not len(spans):
        return np.zeros(len(points), dtype=bool)
    i = np.searchsorted(spans[:, 0], points, side="right") - 1
    return (i >= 0) & (points < spans[np.maximum(i, 0), 1])


def rank_nodes(trace: RankTrace, k: int) -> list[Node]:
    """Step k of one rank as nodes (see the module docstring)."""
    lo, hi = trace.window(k)
    colls = step_collectives(trace, k)
    busy = clip(trace.compute, lo, hi)
    # CPU: the rank's launch calls and bucket copies, never a wait (GPU: host-side times)
    calls = np.zeros((0, 2)) if trace.gpu else clip(trace.launches, lo, hi)
    edges = [[lo, hi], busy.ravel(), calls.ravel(), [c.start for c in colls]]
    cuts = np.unique(np.concatenate(edges))
    cuts = cuts[(cuts >= lo) & (cuts <= hi)]
    mid = (cuts[:-1] + cuts[1:]) / 2
    computing, calling = _inside(busy, mid), _inside(calls, mid)
    ids = iter(range(len(colls), 10**9))
    chain: list[Node] = []
    ends: dict[float, int] = {}  # end time of a chain node -> its id
    last: int | None = None
    for a, b, comp, call in zip(cuts[:-1], cuts[1:], computing, calling, strict=True):
        deps = () if last is None else (last,)
        dur = b - a
        wait = waits([(a, b)], colls, not trace.gpu) if not (comp or call) else []
        if wait:  # after the collective that ended last in the gap, the wake-up
            j = wait[0][2]
            deps, dur = (*deps, j), max(b - colls[j].end, 0.0)
        last = next(ids)
        chain.append(Node(last, "comp", "compute" if comp else "idle", float(dur), deps))
        ends[float(b)] = last
    nodes = []
    previous: dict[str | None, int] = {}
    for j, c in enumerate(colls):
        deps = tuple(d for d in (ends.get(float(c.start)), previous.get(c.pg)) if d is not None)
        if c.pg is not None:
            previous[c.pg] = j
        nodes.append(Node(j, "coll", c.name, c.duration, deps, c.op, c.bytes or 0.0, c.pg))
    return nodes + chain


def import_step(traces: list[RankTrace], number: int | None = None) -> Graph:
    """One step of every traced rank (kineto.read_traces: one trace a rank) as a graph; by
    default the step all ranks traced with the median length on the first rank."""
    if number is None:
        first = traces[0]
        lengths = [first.window(k)[1] - first.window(k)[0] for k in range(len(first.steps))]
        number = first.steps[int(np.argsort(lengths)[len(lengths) // 2])].number
    groups: dict[str, tuple[str, tuple[int, ...]]] = {}
    for t in traces:
        groups.update(t.groups)
        for c in t.collectives:
            if c.pg is not None and c.pg not in groups and c.group:
                groups[c.pg] = (c.pg_desc or "", c.group)
    for t in traces:
        lost = next((c for c in t.collectives if c.pg is not None and c.pg not in groups), None)
        if lost is not None:  # libkineto cut its ranks short and pg_config lacks it
            raise SpecError(
                t.source,
                "distributedInfo.pg_config",
                f"no ranks of process group {lost.pg!r} ({lost.name!r}): a replay needs them",
            )
    graph = Graph({t.rank: rank_nodes(t, step_index(t, number)) for t in traces}, groups)
    graph.metadata["step"] = str(number)
    return graph
