"""Which algorithm a collective should use: the fastest by our closed forms, or NCCL's pick.

best_algorithm backs `--algorithm auto`. nccl_like_choice reproduces the shape of NCCL's
own tuner (ring vs tree for all-reduce) so predictions of an untuned NCCL job can follow
its choice rather than the optimum.
"""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms import algorithms_for, check_algorithm
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
    inter-node one, its bottleneck. "hierarchical" competes when intra_alpha and
    intra_bandwidth are given (where n is a multiple of gpus_per_node). "ps" competes only
    if named in `candidates`: it is a deployment choice, not a library's. overhead and
    intra_overhead: the per-message o of each tier (collective_time; default alpha / 2),
    which a server's fan-in, a tree rank's neighbours and an all-to-all pay per peer.
    """
    two_tier = intra_alpha is not None and intra_bandwidth is not None
    if candidates is None:
        candidates = tuple(
            a for a in algorithms_for(op) if a != "ps" and (a != "hierarchical" or two_tier)
        )
    n = np.asarray(n)
    times = []
    for alg in candidates:
        check_algorithm(op, alg)
        if alg != "hierarchical":
            times.append(
                collective_time(
                    op, alg, n, size, alpha, bandwidth, ps_shards=ps_shards, overhead=overhead
                )
            )
            continue
        if not two_tier:
            raise ValueError("hierarchical needs intra_alpha and intra_bandwidth")
        whole = n % gpus_per_node == 0
        nodes = np.maximum(n // gpus_per_node, 1)
        t = hierarchical_time(
            op,
            nodes,
            gpus_per_node,
            size,
            intra_alpha,
            intra_bandwidth,
            alpha,
            bandwidth,
            intra_overhead=intra_overhead,
            inter_overhead=overhead,
        )
        times.append(np.where(whole, t, np.inf))
    stacked = np.stack(np.broadcast_arrays(*times))
    pick = np.argmin(stacked, axis=0)
    return np.asarray(candidates)[pick], np.take_along_axis(stacked, pick[None], axis=0)[0]
