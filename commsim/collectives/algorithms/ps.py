"""Parameter server all-reduce: push every shard to its server, pull it back (Li et al.
2014, "Scaling distributed machine learning with the parameter server", OSDI; BytePS,
Jiang et al. 2020, OSDI)."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import Schedule, make_step
from commsim.topology.routing import alpha_with_fanin


def ps_time(op, n, s, a, b, o, ps_shards, **_):
    # Parameter server, shard j (S/k bytes) on rank j < k (Li et al. 2014, OSDI; BytePS,
    # Jiang et al. 2020, OSDI): push, every rank sends each shard to its server; pull, the
    # reverse. A server's link carries N-1 shards each way, and the server handles the N-1
    # messages one by one (a worker's k <= N-1 shards never outnumber them):
    # 2 (a + (N-2) o + (N-1) S/(k b)).
    return 2 * (alpha_with_fanin(a, n - 1, o) + (n - 1) * s / (ps_shards * b))


def ps_allreduce(n: int, size: float, shards: int) -> Schedule:
    """Push every shard (S/k) to its server, rank j < k, then pull it back."""
    src, dst = np.divmod(np.arange(n * shards), shards)
    keep = src != dst
    push = make_step(src[keep], dst[keep], size / shards)
    return [push, push.transposed()]
