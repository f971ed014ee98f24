"""Which algorithm a collective should use: the fastest by our closed forms
(best_algorithm, behind `--algorithm auto`). NCCL's own pick is its tuner's
(collectives.nccl)."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms import SEARCHED, algorithms_for, lookup, runs_on
from commsim.collectives.evaluate import collective_time, hierarchical_time


def best_algorithm(
    op: str,
    n,
    size,
    alpha,
    bandwidth,
    *,
    gpus_per_node: int = 1,
    intra_alpha=None,
    intra_bandwidth=None,
    ps_shards=1,
    candidates: tuple[str, ...] | None = None,
    overhead=None,
    intra_overhead=None,
) -> tuple[np.ndarray, np.ndarray]:
    """Fastest algorithm and its seconds per element, broadcast over n and size.

    Flat algorithms see one link (alpha, bandwidth): for a group spanning nodes pass the
    inter-node one, its bottleneck. "hierarchical" (two tiers) competes when intra_alpha
    and intra_bandwidth are given; whole-node algorithms (tree, hierarchical) only where n
    is a multiple of gpus_per_node (algorithms.runs_on). Candidates default to what `auto`
    chooses among (algorithms.SEARCHED) but "ps", which competes only if named in
    `candidates`: it is a deployment choice, not a library's. overhead and
    intra_overhead: the per-message o of each tier (collective_time; default alpha / 2),
    which a server's fan-in, a tree rank's neighbours and an all-to-all pay per peer.
    """
    two_tier = intra_alpha is not None and intra_bandwidth is not None
    algorithms_for(op)  # a ValueError naming the collectives for an unknown op
    if candidates is None:
        candidates = tuple(
            a for a in SEARCHED[op] if a != "ps" and (two_tier or not lookup(op, a).two_tier)
        )
    n = np.asarray(n)
    times = []
    for alg in candidates:
        if not lookup(op, alg).two_tier:
            t = collective_time(
                op, alg, n, size, alpha, bandwidth, ps_shards=ps_shards, overhead=overhead
            )
        elif not two_tier:
            raise ValueError(f"{alg} needs intra_alpha and intra_bandwidth")
        else:
            t = hierarchical_time(
                op,
                np.maximum(n // gpus_per_node, 1),
                gpus_per_node,
                size,
                intra_alpha,
                intra_bandwidth,
                alpha,
                bandwidth,
                intra_overhead=intra_overhead,
                inter_overhead=overhead,
            )
        runs = runs_on(op, alg, n, gpus_per_node)
        times.append(t if np.all(runs) else np.where(runs, t, np.inf))
    stacked = np.stack(np.broadcast_arrays(*times))
    pick = np.argmin(stacked, axis=0)
    return np.asarray(candidates)[pick], np.take_along_axis(stacked, pick[None], axis=0)[0]
