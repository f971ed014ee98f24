"""The collective algorithms, one module each, and the registry built from them: the one
list of which algorithms each op has.

Each module defines ALGORITHM (base.Algorithm): for every op it serves, its schedule (the
steps of flows the graph evaluates) and its closed form (the same schedule collapsed on
uniform links, as terms collectives.evaluate sums), whether it needs whole nodes, and
whether `auto` chooses among it. Everything that names algorithms (specs, the CLI, the
planner, the step models, the backend tables) reads ALGORITHMS or SEARCHED.

Where to add an algorithm: a module here defining ALGORITHM, listed in _MODULES, and its
test (tests/test_algorithm_<name>.py); tests/test_registry.py then checks its closed form
against its schedule on uniform networks.
"""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms import (
    allreduce_ring,
    binomial,
    chain,
    direct,
    hierarchical,
    ps,
    rhd,
    ring,
    tree,
)
from commsim.collectives.algorithms.base import Algorithm, Schedule, split_channels

OPS = ("all-reduce", "reduce-scatter", "all-gather", "broadcast", "all-to-all", "send-recv")

# Registry order is the order `auto` breaks ties in and `--algorithm all` shows.
_MODULES = (ring, tree, rhd, ps, hierarchical, chain, direct, binomial, allreduce_ring)


def _registry() -> dict[str, dict[str, Algorithm]]:
    """op -> algorithm name -> Algorithm, from every module's ALGORITHM."""
    table: dict[str, dict[str, Algorithm]] = {op: {} for op in OPS}
    for module in _MODULES:
        alg: Algorithm = module.ALGORITHM
        for op in alg.forms:
            if op not in table or alg.name in table[op]:
                raise ValueError(f"{module.__name__}: {op} {alg.name!r} is unknown or taken")
            table[op][alg.name] = alg
    return table


REGISTRY = _registry()
ALGORITHMS: dict[str, tuple[str, ...]] = {op: tuple(algs) for op, algs in REGISTRY.items()}
# What `auto`, `--algorithm all` and the planner choose among: all but gloo's own.
SEARCHED: dict[str, tuple[str, ...]] = {
    op: tuple(name for name, alg in algs.items() if alg.searched) for op, algs in REGISTRY.items()
}


def algorithms_for(op: str) -> tuple[str, ...]:
    """The algorithms of `op`; a ValueError naming the collectives if `op` is unknown."""
    if op not in ALGORITHMS:
        raise ValueError(f"unknown collective {op!r} (choose from {', '.join(ALGORITHMS)})")
    return ALGORITHMS[op]


def lookup(op: str, algorithm: str) -> Algorithm:
    """The registered algorithm; a ValueError naming the choices for an unknown pair."""
    if algorithm not in algorithms_for(op):
        raise ValueError(
            f"{op} has no {algorithm!r} algorithm (choose from {', '.join(ALGORITHMS[op])})"
        )
    return REGISTRY[op][algorithm]


def pipelined(op: str, algorithm: str) -> bool:
    """Whether the algorithm's `op` is pipelined (its time is not affine in the size)."""
    return lookup(op, algorithm).forms[op].pipelined


def runs_on(op: str, algorithm: str, n, gpus_per_node) -> np.ndarray:
    """Whether `algorithm` can run `op` on n ranks, gpus_per_node to a node (broadcasts):
    a whole-node algorithm (a tree over nodes, rings per rail) needs n a multiple of it."""
    whole = np.asarray(n) % np.asarray(gpus_per_node) == 0
    return whole | (not lookup(op, algorithm).whole_nodes)


def bus_factor(op: str, n: np.ndarray | int) -> np.ndarray:
    """nccl-tests' busbw / algbw: all-reduce 2(N-1)/N, all-gather, reduce-scatter and
    all-to-all (N-1)/N, broadcast and send-recv 1 (nccl-tests doc/PERFORMANCE.md)."""
    algorithms_for(op)
    n = np.asarray(n, dtype=float)
    if op in ("broadcast", "send-recv"):
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

    gpus_per_node shapes the whole-node algorithms (tree: double binary tree over nodes,
    chains inside; hierarchical); channels > 1 splits every flow over NIC rails
    0..channels-1 (for the algorithms that run NCCL's channels); chunks is the pipeline
    depth of the pipelined ones (evaluate.graph_time picks it with pipeline_chunks, as the
    closed form does).
    """
    alg = lookup(op, algorithm)
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
    if not runs_on(op, algorithm, n, gpus_per_node):
        raise ValueError(f"{algorithm} needs whole nodes: {n} ranks, {gpus_per_node} per node")
    alg.check(n, ps_shards=ps_shards)
    n = int(n)
    if n == 1:
        return []
    form = alg.forms[op]
    steps = form.schedule(
        op, n, size, gpus_per_node=gpus_per_node, ps_shards=ps_shards, chunks=chunks
    )
    return [split_channels(s, channels) for s in steps] if channels > 1 and form.channels else steps
