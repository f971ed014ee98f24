"""NCCL's double binary tree: its shape against trees.cc, the closed form by hand."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.collectives.algorithms import build_schedule
from commsim.collectives.algorithms.tree import (
    btree_parents,
    dtree_parents,
    tree_degree,
    tree_depth,
    tree_height,
    tree_peers,
)
from commsim.collectives.evaluate import collective_time
from commsim.topology.routing import peer_counts

pytestmark = pytest.mark.filterwarnings("error")

A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB
OV = A / 2  # the default per-message overhead: alpha is all endpoint (o + o)


def t(n, **kw):
    return float(collective_time("all-reduce", "tree", n, S, A, B, **kw))


@pytest.mark.parametrize(
    "n,kw,expected",
    [
        # N=8: height 1 + floor(log2 7) = 3, 2h = 6 stages, degree 4 (4 distinct peers), 2
        # chunks: (k + 2h - 1) steps of alpha + 3 o + 4 chunks of S/(2k)
        # = 7 (1 + 1.5 us + 4 S/4 / B)
        (8, {"chunks": 2}, (2 + 5) * (A + 3 * OV + 4 * S / 4 / B)),
        # N=3: height 1 + floor(log2 2) = 2, degree 3 but 2 distinct peers (the trees share
        # an edge), 1 chunk: 4 (1 + 0.5 us + 3 S/2 / B)
        (3, {"chunks": 1}, (1 + 3) * (A + OV + 3 * S / 2 / B)),
        # an explicit overhead (alpha 1 us of which o = 0.2 us is endpoint): 3 x 0.2 us
        (8, {"chunks": 2, "overhead": 0.2 * A}, 7 * (1.6 * A + 4 * S / 4 / B)),
    ],
)
def test_closed_form_by_hand(n, kw, expected):
    assert t(n, **kw) == pytest.approx(expected, rel=1e-12)


def test_tree_peers():
    # distinct neighbours in the two trees: they share edges up to n = 5
    assert tree_peers([1, 2, 3, 4, 5, 6, 7, 100]).tolist() == [0, 1, 2, 3, 3, 4, 4, 4]


def test_tree_shape_formulas():
    assert list(tree_height([1, 2, 3, 4, 5, 9, 14, 17])) == [0, 1, 2, 2, 3, 4, 4, 5]
    assert list(tree_degree([1, 2, 3, 4, 100])) == [0, 2, 3, 4, 4]


def test_nccl_btree_matches_trees_cc_picture():
    # src/graph/trees.cc, 14 ranks: 0 -> 8; 8 -> 4, 12; 4 -> 2, 6; 12 -> 10, 13; 2 -> 1, 3
    p = btree_parents(14)
    assert p[0] == -1 and p[8] == 0
    assert [p[4], p[12], p[2], p[6], p[10], p[13], p[1], p[3]] == [8, 8, 4, 4, 12, 12, 2, 2]


@pytest.mark.parametrize("n", range(2, 130))
def test_double_tree_shape_matches_closed_form(n):
    first, second = dtree_parents(n)
    for parent in (first, second):
        assert (parent == -1).sum() == 1  # one root, and a tree: every rank reaches it
        assert np.bincount(parent[parent >= 0], minlength=n).max() <= 2
        assert tree_depth(parent).max() == tree_height(n)
    interior = [np.bincount(p[p >= 0], minlength=n) > 0 for p in (first, second)]
    # complementary: interior in at most one tree, but for odd n the shift makes rank 0
    # (the first root, with a single child) interior in both
    both = np.nonzero(interior[0] & interior[1])[0].tolist()
    assert both == ([0] if n % 2 and n > 1 else [])
    degree = sum(
        (p >= 0).astype(int) + np.bincount(p[p >= 0], minlength=n) for p in (first, second)
    )
    assert degree.max() == tree_degree(n)
    # the messages a rank handles per step: its distinct neighbours (shared edges once)
    (step,) = build_schedule("all-reduce", "tree", n, S, chunks=1)
    assert peer_counts(step.src, step.dst).max() == tree_peers(n)


def test_tree_over_nodes_uses_chains_inside():
    (step,) = build_schedule("all-reduce", "tree", 16, S, gpus_per_node=4, chunks=2)
    intra = step.src // 4 == step.dst // 4
    assert np.all(np.abs(step.src[intra] - step.dst[intra]) == 1)  # neighbours in a chain
    heads = np.unique(np.concatenate([step.src[~intra], step.dst[~intra]]) % 4)
    assert heads.tolist() == [0, 3]  # tree 0 talks through GPU 0, tree 1 through GPU 3
    # stages: 2 (height of the 4-node tree + chain of 3) = 2 (2 + 3)
    assert step.stages == 10 and step.repeat == 2
