"""NCCL's double binary tree all-reduce (src/graph/trees.cc): two complementary binary
trees over the nodes, each carrying half the buffer up (reduce) and down (broadcast),
pipelined in chunks; a chain inside each node. Runs on whole nodes only."""

from __future__ import annotations

import numpy as np

from commsim.collectives.algorithms.base import (
    Algorithm,
    Form,
    Pipeline,
    Schedule,
    floor_log2,
    make_step,
)


def tree_height(n) -> np.ndarray:
    """Edges from root to deepest leaf of NCCL's binary tree on n ranks (src/graph/trees.cc:
    rank 0 is a root with one child, over an in-order binary tree of ranks 1..n-1)."""
    n = np.asarray(n)
    return np.where(n > 1, 1 + floor_log2(np.maximum(n - 1, 1)), 0)


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


def schedule(
    op: str, n: int, size: float, *, gpus_per_node: int = 1, chunks: int = 1, **_
) -> Schedule:
    """NCCL tree all-reduce: a double binary tree over nodes, a chain inside each node.

    Tree t carries S/2. In tree 0 a node's local GPU 0 is its head (the GPU that talks to
    other nodes) and the chain runs g-1 -> ... -> 0; tree 1 uses GPU g-1 and the reverse
    chain, so the two trees use different NICs. Reduce flows go up, broadcast flows come
    down; in steady state every edge carries one chunk each way per round, so a rank
    handles a message from and to each of its distinct neighbours every round.
    """
    gpn = gpus_per_node
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
        make_step(
            np.concatenate([up_src, up_dst]),
            np.concatenate([up_dst, up_src]),
            size / (2 * chunks),
            repeat=chunks,
            stages=stages,
        )
    ]


def terms(op: str, n, **_) -> list[Pipeline]:
    # NCCL double binary tree (Sanders, Speck & Traeff 2009, "Two-tree algorithms for full
    # bandwidth broadcast, reduction and scan"; Jeaugey 2019, NVIDIA blog on NCCL 2.4) over
    # n ranks (one a node): each tree carries S/2, reduced up then broadcast down, one
    # pipeline of 2 * height stages. In steady state every tree edge carries a chunk S/(2k)
    # each way, so the busiest rank moves tree_degree chunks per step:
    # (k + 2h - 1)(a' + deg S/(2 k b)), where a' is alpha_with_fanin over the tree_peers
    # distinct neighbours it handles each step.
    return [Pipeline(2 * tree_height(n), tree_peers(n), tree_degree(n) / 2)]


ALGORITHM = Algorithm(
    "tree", {"all-reduce": Form(schedule, terms, pipelined=True)}, whole_nodes=True
)
