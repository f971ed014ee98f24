"""Where a traced step's time went, per rank and step, defined once:

    step      the step's window (ProfilerStep#N, extended over work it started: RankTrace.window)
    busy      time the rank computes (union of its compute ops or kernels)
    comm      time any collective runs (union of the collectives)
    waits     the gaps between compute in which a collective ended (CPU: or one runs):
              the rank stood blocked on communication (imported.py makes them wait nodes)
    exposed   time the rank spends on communication instead of computing: its launch
              calls (CPU: and DDP's bucket copies, kineto.REDUCER_PREFIXES) + waits. The
              calibration harness times the same quantity on the same steps with its own
              clock (calibrate.harness.commclock), which the trace tests hold it to
    compute   step - exposed: its compute and whatever else its host ran (what a harness
              times as a step without communication)
    idle      compute - busy: gaps not spent waiting (host overhead, launch latency)
    overlap   1 - exposed / comm, at least 0 (waits include the wake-up); 1 without comm

and each collective's algbw (bytes / time) and busbw (algbw x nccl-tests' factor for its
group size, commsim.collectives.algorithms.bus_factor).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from commsim.collectives.algorithms import ALGORITHMS, bus_factor
from commsim.traces.intervals import clip, difference, measure
from commsim.traces.kineto import Collective, RankTrace


@dataclass(frozen=True)
class StepFigures:
    rank: int
    step: int
    step_s: float
    compute_s: float
    busy_s: float
    comm_s: float
    exposed_comm_s: float
    idle_s: float
    overlap_ratio: float
    collectives: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CollectiveFigures:
    """One collective of one step with its bandwidths (None where size or group is unknown
    or commsim has no such op)."""

    rank: int
    step: int
    op: str
    bytes: float | None
    group_size: int | None
    pg: str | None
    start_s: float  # from the step's start
    time_s: float
    algbw_Bps: float | None
    busbw_Bps: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def bandwidths(c: Collective) -> tuple[float | None, float | None]:
    """(algbw, busbw) of one collective, nccl-tests' way."""
    if c.bytes is None or c.duration <= 0:
        return None, None
    algbw = c.bytes / c.duration
    if c.op not in ALGORITHMS or not c.group:
        return algbw, None
    return algbw, algbw * float(bus_factor(c.op, len(c.group)))


def step_collectives(trace: RankTrace, k: int) -> list[Collective]:
    """The collectives that start in step k's window."""
    lo, hi = trace.window(k)
    return [c for c in trace.collectives if lo <= c.start < hi]


def waits(
    gaps: np.ndarray, colls: list[Collective], covering: bool
) -> list[tuple[float, float, int]]:
    """(start, end, collective) of each gap the rank spent waiting on communication: one in
    which a collective ended (the rank waited for the one that ended last, then woke up),
    or, with `covering` (CPU traces), one a collective runs in: gloo's worker threads open
    their annotation when scheduled, after the rank began waiting (seen 7 ms late on the
    testbed), and close it after the waiting thread has resumed (the one that ends first
    after the gap). GPU kernels start and end when they run: there such a gap is idle."""
    out = []
    for a, b in np.asarray(gaps).reshape(-1, 2).tolist():
        ended = [j for j, c in enumerate(colls) if a < c.end <= b]
        if ended:
            out.append((a, b, max(ended, key=lambda j: colls[j].end)))
            continue
        over = [j for j, c in enumerate(colls) if covering and c.start < b and c.end > b]
        if over:
            out.append((a, b, min(over, key=lambda j: colls[j].end)))
    return out


def step_figures(trace: RankTrace, k: int) -> StepFigures:
    lo, hi = trace.window(k)
    colls = step_collectives(trace, k)
    busy = clip(trace.compute, lo, hi)
    launch = difference(clip(trace.launches, lo, hi), busy)
    comm_s = measure(clip([(c.start, c.end) for c in colls], lo, hi))
    gaps = difference(difference([(lo, hi)], busy), launch)
    exposed = measure(launch) + sum(b - a for a, b, _ in waits(gaps, colls, not trace.gpu))
    busy_s = measure(busy)
    return StepFigures(
        rank=trace.rank,
        step=trace.steps[k].number,
        step_s=hi - lo,
        compute_s=hi - lo - exposed,
        busy_s=busy_s,
        comm_s=comm_s,
        exposed_comm_s=exposed,
        idle_s=max(hi - lo - exposed - busy_s, 0.0),
        overlap_ratio=max(1.0 - exposed / comm_s, 0.0) if comm_s > 0 else 1.0,
        collectives=len(colls),
    )


def collective_figures(trace: RankTrace, k: int) -> list[CollectiveFigures]:
    lo, _ = trace.window(k)
    rows = []
    for c in step_collectives(trace, k):
        algbw, busbw = bandwidths(c)
        rows.append(
            CollectiveFigures(
                trace.rank,
                trace.steps[k].number,
                c.op,
                c.bytes,
                len(c.group) if c.group else None,
                c.pg,
                c.start - lo,
                c.duration,
                algbw,
                busbw,
            )
        )
    return rows


@dataclass(frozen=True)
class Summary:
    """Every rank's steps and collectives."""

    steps: list[StepFigures]
    collectives: list[CollectiveFigures]

    def median(self, key: str) -> float:
        """The median over steps of each step's slowest rank."""
        by_step: dict[int, float] = {}
        for s in self.steps:
            by_step[s.step] = max(by_step.get(s.step, 0.0), getattr(s, key))
        return float(np.median(list(by_step.values())))

    def to_dict(self) -> dict:
        return {
            "steps": [s.to_dict() for s in self.steps],
            "collectives": [c.to_dict() for c in self.collectives],
            "median": {
                k: self.median(k)
                for k in ("step_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s")
            },
        }


def summarize(traces: list[RankTrace]) -> Summary:
    steps, colls = [], []
    for t in traces:
        for k in range(len(t.steps)):
            steps.append(step_figures(t, k))
            colls += collective_figures(t, k)
    return Summary(steps, colls)
