"""Collective algorithms as steps of flows, evaluated on the cluster graph.

Ranks 0..n-1 are in ring / placement order; consecutive groups of gpus_per_node ranks
share a node. A Step is a set of concurrent flows (src rank -> dst rank, bytes, NIC rail)
run `repeat` times; identical steps are emitted once, so a 2(N-1)-step ring is one Step
and evaluation on thousands of GPUs stays cheap. Routed on a uniform network every
schedule costs exactly its closed form in alphabeta.py (the tests check this); on a real
fabric the graph shows what the closed form cannot: shared links, oversubscription, and
what a rank order does to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from commsim.collectives.alphabeta import (
    HIERARCHICAL_PHASES,
    RING_ROUNDS,
    check_algorithm,
    pipeline_chunks,
)
from commsim.topology.build import Cluster
from commsim.topology.routing import step_time as routed_step_time

StepTimeFn = Callable[..., float]


@dataclass(frozen=True)
class Step:
    """Concurrent flows src -> dst of nbytes each, on NIC `rail` (-1: the GPU's own).

    `repeat` identical rounds; a pipelined step (stages > 1) is the steady state of a
    pipeline `stages` deep passing `repeat` chunks, which takes repeat + stages - 1 rounds
    (the fill costs full rounds: the usual pipeline model) but moves `repeat` chunks."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    rail: np.ndarray
    repeat: int = 1
    stages: int = 1

    @property
    def rounds(self) -> int:
        return self.repeat + self.stages - 1

    def transposed(self) -> Step:
        """The same flows reversed: a reduce-scatter step becomes an all-gather step."""
        return replace(self, src=self.dst, dst=self.src)


Schedule = list[Step]


def _step(src, dst, nbytes, repeat: int = 1, stages: int = 1) -> Step:
    """A Step from rank arrays and bytes (a scalar or one per flow), with no rail preference."""
    src = np.asarray(src, dtype=np.int64)
    return Step(
        src=src,
        dst=np.asarray(dst, dtype=np.int64),
        nbytes=np.broadcast_to(np.asarray(nbytes, dtype=float), src.shape).copy(),
        rail=np.full(src.shape, -1, dtype=np.int64),
        repeat=repeat,
        stages=stages,
    )


def _transposed(steps: Schedule) -> Schedule:
    """A schedule run backwards with every flow reversed (reduce-scatter -> all-gather)."""
    return [s.transposed() for s in reversed(steps)]


def _ring(op: str, groups: np.ndarray, size: float) -> Schedule:
    """Ring `op` in every row of `groups` at once: each member sends S/m to the next member."""
    m = groups.shape[1]
    if m == 1:
        return []
    nxt = np.roll(groups, -1, axis=1)
    return [_step(groups.ravel(), nxt.ravel(), size / m, RING_ROUNDS[op] * (m - 1))]


def _ring_broadcast(n: int, size: float, chunks: int) -> Schedule:
    """Chain 0 -> 1 -> ... -> n-1 pipelined in `chunks` chunks (NCCL's ring broadcast)."""
    ranks = np.arange(n)
    return [_step(ranks[:-1], ranks[1:], size / chunks, repeat=chunks, stages=n - 1)]


def btree_parents(n: int) -> np.ndarray:
    """Parent of each rank in NCCL's binary tree (ncclGetBtree, src/graph/trees.cc); root -1.

    With b the lowest set bit of r: parent (r ^ b) | 2b, or r ^ b when that is >= n."""
    r = np.arange(n, dtype=np.int64)
    bit = r & -r
    up = (r ^ bit) | (bit << 1)
    up = np.where(up >= n, r ^ bit, up)
    up[0] = -1
    return up


def dtree_parents(n: int) -> tuple[np.ndarray, np.ndarray]:
    """NCCL's double binary tree (ncclGetDtree): the btree, and the btree shifted by one rank
    (n odd) or mirrored (n even), so a rank interior in one is a leaf in the other (for odd
    n, rank 0, the first root with a single child, is interior in both)."""
    first = btree_parents(n)
    label = (np.arange(n) + 1) % n if n % 2 else n - 1 - np.arange(n)
    second = np.full(n, -1, dtype=np.int64)
    child = first >= 0
    second[label[child]] = label[first[child]]
    return first, second


def tree_depth(parent: np.ndarray) -> np.ndarray:
    """Edges from each rank up to its tree's root."""
    depth = np.zeros(parent.size, dtype=np.int64)
    up = parent.copy()
    while np.any(up >= 0):
        depth += up >= 0
        up = np.where(up >= 0, parent[np.maximum(up, 0)], -1)
    return depth


def _tree_allreduce(n: int, gpn: int, size: float, chunks: int) -> Schedule:
    """NCCL tree all-reduce: a double binary tree over nodes, a chain inside each node.

    Tree t carries S/2. In tree 0 a node's local GPU 0 is its head (the GPU that talks to
    other nodes) and the chain runs g-1 -> ... -> 0; tree 1 uses GPU g-1 and the reverse
    chain, so the two trees use different NICs. Reduce flows go up, broadcast flows come
    down; in steady state every edge carries one chunk each way per round, so a rank
    handles a message from and to each of its distinct neighbours every round.
    """
    nodes = np.arange(n // gpn)
    parents = dtree_parents(nodes.size)
    up_src, up_dst = [], []
    for t, parent in enumerate(parents):
        head = nodes * gpn + (0 if t == 0 else gpn - 1)
        child = parent >= 0
        up_src.append(head[child])
        up_dst.append(head[parent[child]])
        local = np.arange(1, gpn) if t == 0 else np.arange(gpn - 1)
        chain = (nodes[:, None] * gpn + local).ravel()
        up_src.append(chain)
        up_dst.append(chain - 1 if t == 0 else chain + 1)
    up_src, up_dst = np.concatenate(up_src), np.concatenate(up_dst)
    height = int(tree_depth(parents[0]).max())
    stages = 2 * (height + gpn - 1)
    return [
        _step(
            np.concatenate([up_src, up_dst]),
            np.concatenate([up_dst, up_src]),
            size / (2 * chunks),
            repeat=chunks,
            stages=stages,
        )
    ]


def _fold(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rabenseifner's fold for n not a power of two (Thakur et al. 2005): with p the largest
    power of two <= n and r = n - p, even rank 2i < 2r hands its data to odd rank 2i+1.

    Returns the even ranks, the odd ranks and `members` (the rank playing virtual rank v)."""
    p = 1 << (n.bit_length() - 1)
    r = n - p
    even, odd = np.arange(0, 2 * r, 2), np.arange(1, 2 * r, 2)
    return even, odd, np.concatenate([odd, np.arange(2 * r, n)])


def _halving(members: np.ndarray, weight: np.ndarray, block: float) -> Schedule:
    """Recursive halving at distance 1, 2, 4, ...: after distance d/2, virtual rank v holds
    the blocks of the ranks congruent to v mod d; at distance d it sends its partner those
    congruent to the partner mod 2d. weight: blocks per virtual rank."""
    v = np.arange(members.size)
    steps = []
    d = 1
    while d < members.size:
        held = np.bincount(v % (2 * d), weights=weight, minlength=2 * d) * block
        partner = v ^ d
        steps.append(_step(members, members[partner], held[partner % (2 * d)]))
        d *= 2
    return steps


def _rhd_allreduce(n: int, size: float) -> Schedule:
    """Rabenseifner: fold, reduce-scatter by halving, all-gather by doubling, unfold."""
    even, odd, members = _fold(n)
    rs = _halving(members, np.ones(members.size), size / members.size)
    core = rs + _transposed(rs)
    if even.size == 0:
        return core
    return [_step(even, odd, size), *core, _step(odd, even, size)]


def _rhd_reduce_scatter(n: int, size: float) -> Schedule:
    """Fold, recursive halving over the N blocks of S/N (folded ranks hold two), unfold."""
    even, odd, members = _fold(n)
    weight = np.where(np.arange(members.size) < even.size, 2.0, 1.0)
    core = _halving(members, weight, size / n)
    if even.size == 0:
        return core
    return [_step(even, odd, size), *core, _step(odd, even, size / n)]


def _ps_allreduce(n: int, size: float, shards: int) -> Schedule:
    """Push every shard (S/k) to its server, rank j < k, then pull it back."""
    src, dst = np.divmod(np.arange(n * shards), shards)
    keep = src != dst
    push = _step(src[keep], dst[keep], size / shards)
    return [push, push.transposed()]


def _direct_all_to_all(n: int, size: float) -> Schedule:
    """Every rank sends S/N to every other rank, all at once: n(n-1) flows, so the graph
    form of all-to-all suits groups of up to a few thousand ranks."""
    src, dst = np.divmod(np.arange(n * n), n)
    keep = src != dst
    return [_step(src[keep], dst[keep], size / n)]


def _hierarchical(op: str, n: int, gpn: int, size: float) -> Schedule:
    """Rings inside nodes at S and across nodes per rail at S/g, phase after phase."""
    nodes = np.arange(n).reshape(n // gpn, gpn)
    levels = {"intra": (nodes, size), "inter": (nodes.T, size / gpn)}
    return [s for phase, level in HIERARCHICAL_PHASES[op] for s in _ring(phase, *levels[level])]


def _split_channels(step: Step, channels: int) -> Step:
    """Channel c carries 1/channels of every flow on NIC rail c, as NCCL's channels do."""
    return replace(
        step,
        src=np.repeat(step.src, channels),
        dst=np.repeat(step.dst, channels),
        nbytes=np.repeat(step.nbytes / channels, channels),
        rail=np.tile(np.arange(channels, dtype=np.int64), step.src.size),
    )


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
    alphabeta.pipeline_chunks, as the closed form does).
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
            _ring_broadcast(n, size, chunks)
            if op == "broadcast"
            else _ring(op, np.arange(n)[None, :], size)
        )
    elif algorithm == "tree":
        steps = _tree_allreduce(n, gpus_per_node, size, chunks)
    elif algorithm == "rhd" and op == "all-reduce":
        steps = _rhd_allreduce(n, size)
    elif algorithm == "rhd":
        rs = _rhd_reduce_scatter(n, size)
        steps = rs if op == "reduce-scatter" else _transposed(rs)
    elif algorithm == "ps":
        steps = _ps_allreduce(n, size, ps_shards)
    elif algorithm == "hierarchical":
        steps = _hierarchical(op, n, gpus_per_node, size)
    else:
        steps = _direct_all_to_all(n, size)
    return [_split_channels(s, channels) for s in steps] if channels > 1 else steps


def traffic(schedule: Schedule, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each rank sends and receives over the whole schedule (pipeline fill excluded)."""
    sent, received = np.zeros(n), np.zeros(n)
    for s in schedule:
        sent += np.bincount(s.src, weights=s.nbytes * s.repeat, minlength=n)
        received += np.bincount(s.dst, weights=s.nbytes * s.repeat, minlength=n)
    return sent, received


def evaluate(
    schedule: Schedule, cluster: Cluster, gpu_of_rank, step_time: StepTimeFn = routed_step_time
) -> float:
    """Seconds the schedule takes on the cluster: sum of rounds x step time, where a step
    ends with its slowest flow under max-min fair sharing (topology.routing.step_time).

    gpu_of_rank may be 2-D, one row per group: groups that run the same schedule at the
    same time (every data-parallel group of a hybrid layout), sharing the fabric."""
    gpu = np.atleast_2d(np.asarray(gpu_of_rank, dtype=np.int64))
    return float(sum(s.rounds * _concurrent(step_time, cluster, gpu, s) for s in schedule))


def _concurrent(step_time: StepTimeFn, cluster: Cluster, gpu: np.ndarray, s: Step, scale=1.0):
    """One step run by every group (row of gpu) at once."""
    groups = gpu.shape[0]
    return step_time(
        cluster,
        gpu[:, s.src].ravel(),
        gpu[:, s.dst].ravel(),
        np.tile(s.nbytes * scale, groups),
        np.tile(s.rail, groups),
    )


def graph_time(
    op: str,
    algorithm: str,
    size: float,
    cluster: Cluster,
    gpu_of_rank,
    *,
    gpus_per_node: int = 1,
    channels: int = 1,
    ps_shards: int = 1,
    chunks: int | None = None,
    step_time: StepTimeFn = routed_step_time,
) -> float:
    """Seconds for `op` over the GPUs gpu_of_rank (rank order; 2-D for concurrent groups)
    routed on the cluster graph.

    With chunks None a pipelined algorithm picks its chunk count by pipeline_chunks from
    the graph itself: alpha = its steady-state step with empty flows (path latency plus
    the per-message overhead of every further peer, topology.routing.flow_times), work =
    the same step with the whole buffer minus alpha. On a uniform network these are the
    closed form's."""
    gpu = np.atleast_2d(np.asarray(gpu_of_rank, dtype=np.int64))
    n = gpu.shape[1]
    shape = dict(gpus_per_node=gpus_per_node, channels=channels, ps_shards=ps_shards)
    steps = build_schedule(op, algorithm, n, size, chunks=chunks or 1, **shape)
    piped = [s for s in steps if s.stages > 1]
    if chunks is None and piped:
        s = piped[0]  # built with one chunk: its flows carry the whole buffer
        alpha = _concurrent(step_time, cluster, gpu, s, scale=0.0)
        work = _concurrent(step_time, cluster, gpu, s) - alpha
        chunks = int(pipeline_chunks(s.stages, alpha, work, size))
        steps = build_schedule(op, algorithm, n, size, chunks=chunks, **shape)
    return evaluate(steps, cluster, gpu, step_time)
