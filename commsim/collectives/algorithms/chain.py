"""NCCL's ring broadcast: a chain root -> 1 -> ... -> N-1, pipelined in chunks. NCCL
calls it ring, and so does the registry (broadcast "ring")."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import Algorithm, Form, Pipeline, Schedule, make_step


def schedule(op: str, n: int, size: float, *, chunks: int = 1, **_) -> Schedule:
    """Chain 0 -> 1 -> ... -> n-1 pipelined in `chunks` chunks (NCCL's ring broadcast)."""
    ranks = np.arange(n)
    return [make_step(ranks[:-1], ranks[1:], size / chunks, repeat=chunks, stages=n - 1)]


def terms(op: str, n, **_) -> list[Pipeline]:
    # A chain of N-1 stages, one peer each way; pipelined in k chunks of S/k it takes
    # (k + N - 2)(a + S/(k b)) (Patarasuk & Yuan 2009).
    return [Pipeline(n - 1, 1, 1.0)]


ALGORITHM = Algorithm("ring", {"broadcast": Form(schedule, terms, pipelined=True)})
