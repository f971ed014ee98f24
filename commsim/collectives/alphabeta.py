"""Closed-form alpha-beta costs of collectives: what a planner evaluates millions of times.

The model: a message of m bytes costs alpha + m / B, where alpha (seconds) is the per-step
latency and B (bytes/s) the bandwidth of one GPU per direction; when several messages
leave (or enter) one GPU at once they share its B, and the GPU handles them one after
another, each costing it a per-message overhead o (alpha_with_fanin). Sizes follow
nccl-tests: S is the bytes of the full buffer per rank (all-gather: output;
reduce-scatter: input; all-to-all: bytes each rank sends in total). Each formula below
is a schedule of schedule.py collapsed on a uniform network; the tests check the two
against each other on the graph. Every function broadcasts over numpy arrays of group
sizes, sizes, alphas and bandwidths.
"""

from __future__ import annotations

import numpy as np

from commsim.topology.routing import alpha_with_fanin

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all-reduce": ("ring", "tree", "rhd", "ps", "hierarchical"),
    "reduce-scatter": ("ring", "rhd", "hierarchical"),
    "all-gather": ("ring", "rhd", "hierarchical"),
    "broadcast": ("ring",),
    "all-to-all": ("direct",),
}

# A two-level collective as phases (op, level): "intra" runs on the g GPUs of each node at
# the full size S, "inter" on the n_nodes GPUs of each rail (same local index) at S / g.
HIERARCHICAL_PHASES: dict[str, tuple[tuple[str, str], ...]] = {
    "all-reduce": (("reduce-scatter", "intra"), ("all-reduce", "inter"), ("all-gather", "intra")),
    "reduce-scatter": (("reduce-scatter", "intra"), ("reduce-scatter", "inter")),
    "all-gather": (("all-gather", "inter"), ("all-gather", "intra")),
}

# Ring steps per (N - 1): all-reduce is a reduce-scatter then an all-gather around the ring.
RING_ROUNDS = {"all-reduce": 2, "reduce-scatter": 1, "all-gather": 1}


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


def pipeline_time(chunks, stages, alpha, work) -> np.ndarray:
    """A pipeline of `stages` stages passing `chunks` chunks: chunks + stages - 1 steps of
    alpha + work / chunks each (work: seconds one stage needs for the whole buffer)."""
    return (chunks + stages - 1) * (alpha + work / chunks)


def pipeline_chunks(stages, alpha, work, size) -> np.ndarray:
    """Chunk count minimising pipeline_time; shared by the closed form and the schedule.

    d/dk of (k + D - 1)(alpha + W / k) vanishes at k* = sqrt((D - 1) W / alpha); we take
    the better of its two integer neighbours, at least 1 and at most `size` (a chunk of at
    least one byte), so alpha = 0 gives one-byte chunks rather than infinitely many.
    """
    stages, alpha, work, size = np.broadcast_arrays(
        *(np.asarray(x, dtype=float) for x in (stages, alpha, work, size))
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        best = np.sqrt((stages - 1) * work / alpha)
    best = np.where(np.isnan(best), 1.0, best)
    top = np.maximum(1.0, np.floor(size))
    lo = np.clip(np.floor(best), 1.0, top)
    hi = np.clip(np.ceil(best), 1.0, top)
    better_lo = pipeline_time(lo, stages, alpha, work) <= pipeline_time(hi, stages, alpha, work)
    return np.where(better_lo, lo, hi)


def _floor_log2(x: np.ndarray) -> np.ndarray:
    """floor(log2 x) for integers x >= 1, exact (frexp: x = m 2^e with 0.5 <= m < 1)."""
    return np.frexp(x.astype(float))[1] - 1


def tree_height(n) -> np.ndarray:
    """Edges from root to deepest leaf of NCCL's binary tree on n ranks (src/graph/trees.cc:
    rank 0 is a root with one child, over an in-order binary tree of ranks 1..n-1)."""
    n = np.asarray(n)
    return np.where(n > 1, 1 + _floor_log2(np.maximum(n - 1, 1)), 0)


def tree_degree(n) -> np.ndarray:
    """Most tree neighbours any rank has in NCCL's two complementary trees together: 4 once
    n >= 4 (interior, 3 links, in one tree and a leaf, 1 link, in the other); else n."""
    n = np.asarray(n)
    return np.where(n > 1, np.minimum(n, 4), 0)


def tree_peers(n) -> np.ndarray:
    """Most distinct peers any rank has in NCCL's two trees together: the messages it
    handles per pipeline step. tree_degree once n >= 6; for n <= 5 the two trees share
    edges (n = 2: both are the one edge), which run in parallel: 1, 2, 3, 3 for n = 2..5."""
    n = np.asarray(n)
    return np.where(n >= 6, tree_degree(n), np.clip(n - 1, 0, 3))


def _pow2_split(n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, lg p, r): the largest power of two p <= n and the r = n - p extra ranks."""
    lg = _floor_log2(n)
    p = 2**lg
    return p, lg, n - p


def _halving_blocks(lg: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Blocks the busiest pair moves over recursive halving on p = 2^lg virtual ranks of
    which the first r hold two blocks: sum over j = 1..lg of p/2^j + ceil(r/2^j)."""
    total = 2.0**lg - 1
    for j in range(1, int(np.max(lg, initial=0)) + 1):
        total = total + np.where(j <= lg, np.ceil(r / 2.0**j), 0.0)
    return total


# Formulas: group size n (>= 2 where it matters; n = 1 is masked to 0 by collective_time),
# size s, alpha a, bandwidth b, per-message overhead o. Every step's alpha is
# alpha_with_fanin over the distinct peers a rank handles in it: ring, chain and RHD steps
# (folds included) give each rank one peer each way, so theirs is plain a; tree, PS and
# direct all-to-all steps pay (k - 1) o more. Sources: Thakur, Rabenseifner & Gropp 2005,
# "Optimization of collective communication operations in MPICH" (IJHPCA 19(1)); Patarasuk
# & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations"
# (JPDC 69(2)).


def _ring(op, n, s, a, b, **_):
    # Patarasuk & Yuan: each of RING_ROUNDS * (N-1) steps moves one block of S/N to the
    # ring neighbour: all-reduce 2(N-1)(a + S/(N b)), reduce-scatter/all-gather (N-1)(...).
    return RING_ROUNDS[op] * (n - 1) * (a + s / (n * b))


def _ring_broadcast(op, n, s, a, b, chunks, **_):
    # NCCL's ring broadcast is a chain root -> 1 -> ... -> N-1 of N-1 stages; pipelined in
    # k chunks of S/k it takes (k + N - 2)(a + S/(k b)) (Patarasuk & Yuan).
    return _pipelined(n - 1, s, a, s / b, chunks)


def _tree(op, n, s, a, b, o, chunks, **_):
    # NCCL double binary tree (Sanders, Speck & Traeff 2009, "Two-tree algorithms for full
    # bandwidth broadcast, reduction and scan"; Jeaugey 2019, NVIDIA blog on NCCL 2.4): each
    # tree carries S/2, reduced up then broadcast down, one pipeline of 2 * height stages.
    # In steady state every tree edge carries a chunk S/(2k) each way, so the busiest rank
    # moves tree_degree chunks per step: (k + 2h - 1)(a' + deg S/(2 k b)), where a' is
    # alpha_with_fanin over the tree_peers distinct neighbours it handles each step.
    a_step = alpha_with_fanin(a, tree_peers(n), o)
    return _pipelined(2 * tree_height(n), s, a_step, tree_degree(n) * s / (2 * b), chunks)


def _rhd_allreduce(op, n, s, a, b, **_):
    # Rabenseifner's algorithm (Thakur et al.): reduce-scatter by recursive halving then
    # all-gather by recursive doubling on p = 2^floor(lg N) ranks: 2 lg p a + 2 (p-1)/p S/b.
    # N not a power of two: the first 2r ranks pair up, the even one hands its vector to
    # its odd neighbour before (a + S/b) and gets the result back after (a + S/b).
    p, lg, r = _pow2_split(n)
    return 2 * lg * a + 2 * (p - 1) / p * s / b + (r > 0) * 2 * (a + s / b)


def _rhd_scatter_gather(op, n, s, a, b, **_):
    # Reduce-scatter by recursive halving (Thakur et al.) on p ranks, distance 1, 2, 4, ...:
    # lg p steps, the busiest pair moving _halving_blocks blocks of S/N in all. All-gather
    # by recursive doubling is the same schedule run backwards. N not a power of two:
    # as in _rhd_allreduce the extra ranks fold in (a + S/b) and get their block (a + S/(N b)).
    p, lg, r = _pow2_split(n)
    fold = (r > 0) * (2 * a + s / b + s / (n * b))
    return lg * a + _halving_blocks(lg, r) * s / (n * b) + fold


def _ps(op, n, s, a, b, o, ps_shards, **_):
    # Parameter server, shard j (S/k bytes) on rank j < k (Li et al. 2014, OSDI; BytePS,
    # Jiang et al. 2020, OSDI): push, every rank sends each shard to its server; pull, the
    # reverse. A server's link carries N-1 shards each way, and the server handles the N-1
    # messages one by one (a worker's k <= N-1 shards never outnumber them):
    # 2 (a + (N-2) o + (N-1) S/(k b)).
    return 2 * (alpha_with_fanin(a, n - 1, o) + (n - 1) * s / (ps_shards * b))


def _direct(op, n, s, a, b, o, **_):
    # All-to-all as one step: each rank sends S/N to each of the N-1 others at once, all
    # sharing its link, and handles the N-1 messages out (and in) one by one:
    # a + (N-2) o + (N-1)/N S/b. (Thakur et al.'s pairwise exchange pays (N-1) a instead.)
    return alpha_with_fanin(a, n - 1, o) + (n - 1) / n * s / b


def _pipelined(stages, size, alpha, work, chunks):
    """pipeline_time with the given chunk count, or the optimal one when chunks is None."""
    k = pipeline_chunks(stages, alpha, work, size) if chunks is None else chunks
    return pipeline_time(k, stages, alpha, work)


_FORMULAS = {
    ("all-reduce", "ring"): _ring,
    ("reduce-scatter", "ring"): _ring,
    ("all-gather", "ring"): _ring,
    ("broadcast", "ring"): _ring_broadcast,
    ("all-reduce", "tree"): _tree,
    ("all-reduce", "rhd"): _rhd_allreduce,
    ("reduce-scatter", "rhd"): _rhd_scatter_gather,
    ("all-gather", "rhd"): _rhd_scatter_gather,
    ("all-reduce", "ps"): _ps,
    ("all-to-all", "direct"): _direct,
}


def collective_time(
    op: str,
    algorithm: str,
    n,
    size,
    alpha,
    bandwidth,
    *,
    ps_shards=1,
    chunks=None,
    overhead=None,
) -> np.ndarray:
    """Seconds for `op` by a flat `algorithm` over n ranks on uniform links; broadcasts.

    alpha: seconds per step; bandwidth: bytes/s per GPU per direction; ps_shards: servers
    of "ps" (1 <= k <= n); chunks: pipeline depth of "tree" and ring broadcast (default:
    pipeline_chunks' optimum); overhead: LogP's per-message o that a rank pays for each
    further peer in a step (alpha_with_fanin; default alpha / 2, right when alpha has no
    switch/cable part). A group of one costs 0. "hierarchical" needs two link tiers: see
    hierarchical_time.
    """
    check_algorithm(op, algorithm)
    if algorithm == "hierarchical":
        raise ValueError("hierarchical needs intra- and inter-node links: use hierarchical_time")
    n = _group_sizes(n)
    size, alpha, bandwidth = (np.asarray(x, dtype=float) for x in (size, alpha, bandwidth))
    if np.any(size < 0) or np.any(alpha < 0) or np.any(bandwidth <= 0):
        raise ValueError("need size >= 0, alpha >= 0 and bandwidth > 0")
    o = alpha / 2 if overhead is None else np.asarray(overhead, dtype=float)
    if np.any(o < 0):
        raise ValueError(f"overhead must be >= 0, got {overhead}")
    shards = np.asarray(ps_shards)
    if algorithm == "ps" and (np.any(shards < 1) or np.any(shards > n)):
        raise ValueError(f"ps_shards must be between 1 and the group size, got {ps_shards}")
    if chunks is not None and np.any(np.asarray(chunks) < 1):
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    t = _FORMULAS[op, algorithm](
        op, n, size, alpha, bandwidth, o=o, ps_shards=shards, chunks=chunks
    )
    return np.where(n > 1, t, 0.0)


def hierarchical_time(
    op: str,
    n_nodes,
    gpus_per_node,
    size,
    intra_alpha,
    intra_bw,
    inter_alpha,
    inter_bw,
    *,
    intra_overhead=None,
    inter_overhead=None,
) -> np.ndarray:
    """Seconds for the two-level `op`: rings inside each node at size S, and rings across
    nodes among the GPUs of each rail at S / g, one phase after another (HIERARCHICAL_PHASES).

    All rails run at once, each on its own NIC, so inter_bw is one GPU's share of the
    network (e.g. one NIC per GPU). The overheads are each tier's per-message o (see
    collective_time); a ring rank has one peer each way, so today they do not change the
    result, but they travel with the phases so every phase follows the same rule."""
    check_algorithm(op, "hierarchical")
    g = _group_sizes(gpus_per_node)
    m = _group_sizes(n_nodes)
    size = np.asarray(size, dtype=float)
    links = {
        "intra": ((g, size, intra_alpha, intra_bw), intra_overhead),
        "inter": ((m, size / g, inter_alpha, inter_bw), inter_overhead),
    }
    return sum(
        collective_time(phase, "ring", *links[level][0], overhead=links[level][1])
        for phase, level in HIERARCHICAL_PHASES[op]
    )


def _group_sizes(n) -> np.ndarray:
    """n as an int64 array, refusing non-integers and groups smaller than one rank."""
    arr = np.asarray(n)
    as_int = arr.astype(np.int64)
    if np.any(as_int != arr) or np.any(as_int < 1):
        raise ValueError(f"group sizes must be integers >= 1, got {n}")
    return as_int
