"""Ring all-reduce, reduce-scatter and all-gather (Patarasuk & Yuan 2009, "Bandwidth
optimal all-reduce algorithms for clusters of workstations", JPDC 69(2))."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import Schedule, make_step

# Ring steps per (N - 1): all-reduce is a reduce-scatter then an all-gather around the ring.
RING_ROUNDS = {"all-reduce": 2, "reduce-scatter": 1, "all-gather": 1}


def ring_time(op, n, s, a, b, **_):
    # Patarasuk & Yuan: each of RING_ROUNDS * (N-1) steps moves one block of S/N to the
    # ring neighbour: all-reduce 2(N-1)(a + S/(N b)), reduce-scatter/all-gather (N-1)(...).
    return RING_ROUNDS[op] * (n - 1) * (a + s / (n * b))


def ring_steps(op: str, groups: np.ndarray, size: float) -> Schedule:
    """Ring `op` in every row of `groups` at once: each member sends S/m to the next member."""
    m = groups.shape[1]
    if m == 1:
        return []
    nxt = np.roll(groups, -1, axis=1)
    return [make_step(groups.ravel(), nxt.ravel(), size / m, RING_ROUNDS[op] * (m - 1))]
