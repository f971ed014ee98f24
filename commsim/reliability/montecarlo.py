"""The same run simulated: failures drawn from the rates, checkpoints, restarts, rework.

An independent check of commsim.reliability.goodput: nothing here uses its formulas, only
the mechanics they were derived from.

Restarting strategies: the job runs segments of tau seconds of work plus the checkpoint
stall; segment j's checkpoint is durable j (tau + stall) + lag after the run began. A
failure (exponential inter-arrival times at the job's rate, also during restarts) rolls the
job back to its last durable checkpoint; then a restart of the failed part's class runs its
phases in order, and a failure during them starts a new restart.

Strategies that keep running: each failure stalls the whole job for its first stall, takes
its share of the replicas out until the replacement is ready, then stalls the job again
while the replacement joins; progress is the integral of (1 - replicas out) over the time
no stall covers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from commsim.reliability.goodput import Model
from commsim.reliability.recovery import PHASES, RESTARTING


@dataclass(frozen=True)
class Simulated:
    """Wall time of simulated runs and where it went (seconds, summed over runs)."""

    work_s: float
    wall_s: float
    spent: dict[str, float]
    failures: int

    @property
    def goodput(self) -> float:
        return self.work_s / self.wall_s

    @property
    def badput(self) -> dict[str, float]:
        return {k: v / self.wall_s for k, v in self.spent.items() if k != "useful"}


def _class_draws(m: Model):
    rates = np.array([e[2] for e in m.events])
    return [e[1] for e in m.events], rates / rates.sum(), [e[3] for e in m.events]


def _restart(m: Model, rng: np.random.Generator, spent: dict[str, float]) -> tuple[float, int]:
    """One restart, repeated while failures cut it short; (seconds, failures during it)."""
    classes, p, _ = _class_draws(m)
    elapsed, failures = 0.0, 0
    while True:
        phases = m.costs.restart[classes[rng.choice(len(classes), p=p)]]
        cut = rng.exponential(m.mtbf)
        total = sum(phases.values())
        done = min(cut, total)
        left = done
        for phase in PHASES:
            used = min(left, phases[phase])
            spent[phase] += used
            left -= used
        elapsed += done
        if cut >= total:
            return elapsed, failures
        failures += 1


def _run_restarting(m: Model, work: float, rng: np.random.Generator, spent: dict[str, float]):
    tau, stall, lag = m.interval_s, m.costs.stall_s, m.costs.lag_s
    seg = tau + stall
    wall, done, failures = 0.0, 0.0, 0
    while done < work - 1e-9:
        left = work - done
        segments = math.ceil(left / tau - 1e-12)
        finish = left + segments * stall
        x = rng.exponential(m.mtbf)
        if x >= finish:
            spent["useful"] += left
            spent["checkpoint_save"] += segments * stall
            return wall + finish, failures
        kept = min(max(math.floor((x - lag) / seg), 0), segments - 1) if x >= lag else 0
        spent["useful"] += kept * tau
        spent["checkpoint_save"] += kept * stall
        spent["lost_progress"] += x - kept * seg
        done += kept * tau
        restart, cut = _restart(m, rng, spent)
        wall += x + restart
        failures += 1 + cut
    return wall, failures


def _run_running(m: Model, horizon: float, rng: np.random.Generator, spent: dict[str, float]):
    """Progress over `horizon` seconds of wall time; returns (progress, failures)."""
    classes, p, shares = _class_draws(m)
    n = rng.poisson(horizon / m.mtbf)
    start = np.sort(rng.uniform(0.0, horizon, n))
    kind = rng.choice(len(classes), size=n, p=p)
    c = m.costs
    first = np.array([sum(c.stall[classes[k]].values()) for k in kind])
    back = np.array([max(c.reduced_s[classes[k]], first[i]) for i, k in enumerate(kind)])
    share = np.array([shares[k] for k in kind])
    # stall windows (+1 at a start, -1 at an end) and replica-share changes, on one time line
    times = np.concatenate(
        [
            start,
            start + first,
            start + back,
            start + back + c.rejoin_s,
            start,
            start + back,
            [0.0, horizon],
        ]
    )
    stall = np.concatenate([np.ones(n), -np.ones(n), np.ones(n), -np.ones(n), np.zeros(2 * n + 2)])
    out = np.concatenate([np.zeros(4 * n), share, -share, [0.0, 0.0]])
    order = np.argsort(times, kind="stable")
    times, stall, out = times[order], np.cumsum(stall[order]), np.cumsum(out[order])
    dt = np.diff(np.minimum(times, horizon))
    free = stall[:-1] <= 0
    rate = np.maximum(1.0 - out[:-1], 0.0)
    progress = float((dt * free * rate).sum())
    spent["stalled"] += float((dt * ~free).sum())
    spent["reduced_capacity"] += float((dt * free * (1.0 - rate)).sum())
    spent["useful"] += progress
    return progress, n


# simulate reports progress every this many runs: often enough for a bar to move (a run
# takes microseconds to milliseconds), rarely enough that reporting costs nothing
RUNS_PER_REPORT = 100


def simulate(
    m: Model,
    work_s: float,
    runs: int = 20,
    seed: int = 0,
    done: Callable[[int], None] | None = None,
) -> Simulated:
    """`runs` runs of `work_s` seconds of failure-free work (restarting strategies), or of
    `work_s` seconds of wall time (strategies that keep running), with a fixed seed; `done`
    is told how many runs finished every RUNS_PER_REPORT runs and at the end. The runs draw
    one after another from one generator, so reporting changes no draw."""
    rng = np.random.default_rng(seed)
    spent = dict.fromkeys(("useful", "checkpoint_save", "lost_progress", *PHASES), 0.0)
    spent |= {"stalled": 0.0, "reduced_capacity": 0.0}
    work = wall = 0.0
    failures = reported = 0
    for i in range(runs):
        if m.rate == 0:
            work, wall = work + work_s, wall + work_s
        elif m.policy.strategy in RESTARTING:
            t, f = _run_restarting(m, work_s, rng, spent)
            work, wall, failures = work + work_s, wall + t, failures + f
        else:
            progress, f = _run_running(m, work_s, rng, spent)
            work, wall, failures = work + progress, wall + work_s, failures + f
        finished = i + 1
        if done and (finished - reported == RUNS_PER_REPORT or finished == runs):
            done(finished - reported)
            reported = finished
    return Simulated(work, wall, {k: v for k, v in spent.items() if v > 0}, failures)
