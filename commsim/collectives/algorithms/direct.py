"""Direct exchanges: all-to-all with every pair at once, and nccl-tests' sendrecv shift."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import Schedule, make_step
from commsim.topology.routing import alpha_with_fanin


def direct_time(op, n, s, a, b, o, **_):
    # All-to-all as one step: each rank sends S/N to each of the N-1 others at once, all
    # sharing its link, and handles the N-1 messages out (and in) one by one:
    # a + (N-2) o + (N-1)/N S/b. (Thakur et al.'s pairwise exchange pays (N-1) a instead.)
    return alpha_with_fanin(a, n - 1, o) + (n - 1) / n * s / b


def all_to_all(n: int, size: float) -> Schedule:
    """Every rank sends S/N to every other rank, all at once: n(n-1) flows, so the graph
    form of all-to-all suits groups of up to a few thousand ranks."""
    src, dst = np.divmod(np.arange(n * n), n)
    keep = src != dst
    return [make_step(src[keep], dst[keep], size / n)]


def shift(n: int, size: float) -> Schedule:
    """nccl-tests' sendrecv: every rank sends the buffer to the next and receives from the
    previous, at once (one step, one peer each way)."""
    ranks = np.arange(n)
    return [make_step(ranks, (ranks + 1) % n, size)]
