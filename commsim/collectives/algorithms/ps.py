"""Parameter server all-reduce (Li et al. 2014, "Scaling distributed machine learning with
the parameter server", OSDI; BytePS, Jiang et al. 2020, OSDI): shard j of S/k bytes lives
on rank j < k; every rank pushes each shard to its server, then pulls it back."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import Algorithm, Form, Rounds, Schedule, make_step


def schedule(op: str, n: int, size: float, *, ps_shards: int = 1, **_) -> Schedule:
    """Push every shard (S/k) to its server, rank j < k, then pull it back."""
    src, dst = np.divmod(np.arange(n * ps_shards), ps_shards)
    keep = src != dst
    push = make_step(src[keep], dst[keep], size / ps_shards)
    return [push, push.transposed()]


def terms(op: str, n, *, ps_shards=1, **_) -> list[Rounds]:
    # Shard j (S/k bytes) on rank j < k (Li et al. 2014; BytePS, Jiang et al. 2020): push,
    # every rank sends each shard to its server; pull, the reverse. A server's link carries
    # N-1 shards each way, and the server handles the N-1 messages one by one (a worker's
    # k <= N-1 shards never outnumber them): 2 (a + (N-2) o + (N-1) S/(k b)).
    return [Rounds(2, n - 1, 2 * (n - 1) / ps_shards)]


def check(n, *, ps_shards=1, **_) -> None:
    """Refuse server counts outside 1..n (ps_shards may be an array, as n)."""
    shards = np.asarray(ps_shards)
    if np.any(shards < 1) or np.any(shards > n):
        raise ValueError(f"ps_shards must be between 1 and the group size, got {ps_shards}")


ALGORITHM = Algorithm("ps", {"all-reduce": Form(schedule, terms)}, check=check)
