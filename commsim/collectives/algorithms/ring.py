"""Ring all-reduce, reduce-scatter and all-gather (Patarasuk & Yuan 2009, "Bandwidth
optimal all-reduce algorithms for clusters of workstations", JPDC 69(2)): every rank sends
a block of S/N to its neighbour, N - 1 steps per phase."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import Algorithm, Form, Rounds, Schedule, make_step

# Ring steps per (N - 1): all-reduce is a reduce-scatter then an all-gather around the ring.
RING_ROUNDS = {"all-reduce": 2, "reduce-scatter": 1, "all-gather": 1}


def ring_steps(op: str, groups: np.ndarray, size: float) -> Schedule:
    """Ring `op` in every row of `groups` at once: each member sends S/m to the next member."""
    m = groups.shape[1]
    if m == 1:
        return []
    nxt = np.roll(groups, -1, axis=1)
    return [make_step(groups.ravel(), nxt.ravel(), size / m, RING_ROUNDS[op] * (m - 1))]


def schedule(op: str, n: int, size: float, **_) -> Schedule:
    """Ranks 0..n-1 in one ring."""
    return ring_steps(op, np.arange(n)[None, :], size)


def terms(op: str, n, **_) -> list[Rounds]:
    # Patarasuk & Yuan: each of RING_ROUNDS * (N-1) steps moves one block of S/N to the
    # ring neighbour, one peer each way: all-reduce 2(N-1)(a + S/(N b)),
    # reduce-scatter/all-gather (N-1)(a + S/(N b)).
    steps = RING_ROUNDS[op] * (n - 1)
    return [Rounds(steps, 1, steps / n)]


ALGORITHM = Algorithm("ring", {op: Form(schedule, terms) for op in RING_ROUNDS})
