"""gloo's broadcast (gloo/broadcast.cc): a binomial tree from the root, not pipelined, a
rank posting all its sends at once so they share its link. Priced where a backend table
or the user names it; `auto` keeps to the pipelined chain, as before it was registered."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import (
    Algorithm,
    Form,
    Rounds,
    Schedule,
    floor_log2,
    make_step,
)


def schedule(op: str, n: int, size: float, **_) -> Schedule:
    """From rank 0: rank v receives the whole buffer from v minus its highest set bit, then
    sends it to v + 2^i for every 2^i above that bit, all sends posted at once. Step d holds
    the sends of the ranks at depth d (d set bits), so the root shares its link among
    ceil(lg n) children."""
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


def terms(op: str, n, **_) -> list[Rounds]:
    # Step d: the busiest sender is 2^d - 1, the smallest rank at depth d (the fewest bits
    # above which to add children), with c_d = #{i >= d : 2^d - 1 + 2^i < n}
    # = floor(lg(n - 2^d)) - d + 1 children, each sent the whole buffer at once:
    # a + (c_d - 1) o + c_d S/b (alpha_with_fanin over its c_d peers); no step where c_d = 0.
    n = np.asarray(n)
    out = []
    for d in range(int(np.max(floor_log2(np.maximum(n, 1)), initial=0)) + 1):
        room = n - 2**d
        children = np.where(room >= 1, floor_log2(np.maximum(room, 1)) - d + 1, 0)
        children = np.maximum(children, 0)
        out.append(Rounds(children > 0, np.maximum(children, 1), children))
    return out


ALGORITHM = Algorithm(
    "binomial", {"broadcast": Form(schedule, terms, channels=False)}, searched=False
)
