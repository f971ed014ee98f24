"""The collective algorithms, one module each, and what every op can run."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import Schedule, split_channels, transposed
from commsim.collectives.algorithms.chain import chain_steps
from commsim.collectives.algorithms.direct import all_to_all
from commsim.collectives.algorithms.hierarchical import hierarchical_steps
from commsim.collectives.algorithms.ps import ps_allreduce
from commsim.collectives.algorithms.rhd import rhd_allreduce, rhd_reduce_scatter
from commsim.collectives.algorithms.ring import ring_steps
from commsim.collectives.algorithms.tree import tree_allreduce

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all-reduce": ("ring", "tree", "rhd", "ps", "hierarchical"),
    "reduce-scatter": ("ring", "rhd", "hierarchical"),
    "all-gather": ("ring", "rhd", "hierarchical"),
    "broadcast": ("ring",),
    "all-to-all": ("direct",),
}


def algorithms_for(op: str) -> tuple[str, ...]:
    """The algorithms of `op`; a ValueError naming the collectives if `op` is unknown."""
    if op not in ALGORITHMS:
        raise ValueError(f"unknown collective {op!r} (choose from {', '.join(ALGORITHMS)})")
    return ALGORITHMS[op]


def check_algorithm(op: str, algorithm: str) -> None:
    """Raise a ValueError naming the choices when `op` or the (op, algorithm) pair is unknown."""
    if algorithm not in algorithms_for(op):
        raise ValueError(
            f"{op} has no {algorithm!r} algorithm (choose from {', '.join(ALGORITHMS[op])})"
        )


def bus_factor(op: str, n: np.ndarray | int) -> np.ndarray:
    """nccl-tests' busbw / algbw: all-reduce 2(N-1)/N, all-gather, reduce-scatter and
    all-to-all (N-1)/N, broadcast 1 (nccl-tests doc/PERFORMANCE.md)."""
    algorithms_for(op)
    n = np.asarray(n, dtype=float)
    if op == "broadcast":
        return np.ones_like(n)
    return (2.0 if op == "all-reduce" else 1.0) * (n - 1) / n


def build_schedule(
    op: str,
    algorithm: str,
    n: int,
    size: float,
    *,
    gpus_per_node: int = 1,
    channels: int = 1,
    ps_shards: int = 1,
    chunks: int = 1,
) -> Schedule:
    """The steps of `op` by `algorithm` over ranks 0..n-1 for a buffer of `size` bytes.

    gpus_per_node shapes "tree" (double binary tree over nodes, chains inside) and
    "hierarchical"; channels > 1 splits every flow over NIC rails 0..channels-1; chunks is
    the pipeline depth of "tree" and ring broadcast (graph_time picks it with
    pipeline_chunks, as the closed form does).
    """
    check_algorithm(op, algorithm)
    for name, value in (
        ("n", n),
        ("gpus_per_node", gpus_per_node),
        ("channels", channels),
        ("ps_shards", ps_shards),
        ("chunks", chunks),
    ):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if algorithm in ("tree", "hierarchical") and n % gpus_per_node:
        raise ValueError(f"{algorithm} needs whole nodes: {n} ranks, {gpus_per_node} per node")
    if algorithm == "ps" and ps_shards > n:
        raise ValueError(f"ps_shards ({ps_shards}) exceeds the group size ({n})")
    n = int(n)
    if n == 1:
        return []
    if algorithm == "ring":
        steps = (
            chain_steps(n, size, chunks)
            if op == "broadcast"
            else ring_steps(op, np.arange(n)[None, :], size)
        )
    elif algorithm == "tree":
        steps = tree_allreduce(n, gpus_per_node, size, chunks)
    elif algorithm == "rhd" and op == "all-reduce":
        steps = rhd_allreduce(n, size)
    elif algorithm == "rhd":
        rs = rhd_reduce_scatter(n, size)
        steps = rs if op == "reduce-scatter" else transposed(rs)
    elif algorithm == "ps":
        steps = ps_allreduce(n, size, ps_shards)
    elif algorithm == "hierarchical":
        steps = hierarchical_steps(op, n, gpus_per_node, size)
    else:
        steps = all_to_all(n, size)
    return [split_channels(s, channels) for s in steps] if channels > 1 else steps
