"""gloo's broadcast: a binomial tree, not pipelined (gloo/broadcast.cc)."""

from __future__ import annotations

from commsim.collectives.algorithms.base import Schedule, make_step


def binomial_broadcast(n: int, size: float) -> Schedule:
    """gloo's broadcast (gloo/broadcast.cc) from rank 0: rank v receives the whole buffer
    from v minus its highest set bit, then sends it to v + 2^i for every 2^i above that bit,
    all sends posted at once. Step d holds the sends of the ranks at depth d (d set bits),
    so the root shares its link among ceil(lg n) children."""
    steps = []
    for depth in range(max(1, (n - 1).bit_length())):
        src, dst = [], []
        for v in range(n):
            if v.bit_count() != depth:
                continue
            i = v.bit_length()  # children v + 2^i for 2^i above v's highest bit
            while v + (1 << i) < n:
                src.append(v)
                dst.append(v + (1 << i))
                i += 1
        if src:
            steps.append(make_step(src, dst, size))
    return steps
