"""NCCL's ring broadcast: a chain root -> 1 -> ... -> N-1, pipelined in chunks."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import Schedule, make_step, pipelined


def chain_time(op, n, s, a, b, chunks, **_):
    # NCCL's ring broadcast is a chain root -> 1 -> ... -> N-1 of N-1 stages; pipelined in
    # k chunks of S/k it takes (k + N - 2)(a + S/(k b)) (Patarasuk & Yuan).
    return pipelined(n - 1, s, a, s / b, chunks)


def chain_steps(n: int, size: float, chunks: int) -> Schedule:
    """Chain 0 -> 1 -> ... -> n-1 pipelined in `chunks` chunks (NCCL's ring broadcast)."""
    ranks = np.arange(n)
    return [make_step(ranks[:-1], ranks[1:], size / chunks, repeat=chunks, stages=n - 1)]
