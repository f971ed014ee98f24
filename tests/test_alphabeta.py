"""Closed forms against hand arithmetic, group of one, broadcasting, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.collectives.algorithms import ALGORITHMS, bus_factor
from commsim.collectives.algorithms.base import pipeline_chunks, pipeline_time
from commsim.collectives.algorithms.tree import tree_degree, tree_height, tree_peers
from commsim.collectives.evaluate import collective_time, hierarchical_time
from commsim.topology.routing import alpha_with_fanin

pytestmark = pytest.mark.filterwarnings("error")

A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB
OV = A / 2  # the default per-message overhead: alpha is all endpoint (o + o)
FLAT = [(op, alg) for op, algs in ALGORITHMS.items() for alg in algs if alg != "hierarchical"]


def t(op, alg, n, **kw):
    return float(collective_time(op, alg, n, S, A, B, **kw))


@pytest.mark.parametrize(
    "op,alg,n,kw,expected",
    [
        # ring AR, N=4: 2(N-1) steps of S/N
        ("all-reduce", "ring", 4, {}, 2 * 3 * A + 2 * 3 / 4 * S / B),
        ("reduce-scatter", "ring", 4, {}, 3 * A + 3 / 4 * S / B),
        ("all-gather", "ring", 4, {}, 3 * A + 3 / 4 * S / B),
        # ring broadcast, N=4, 4 chunks: (k + N - 2) steps of S/k
        ("broadcast", "ring", 4, {"chunks": 4}, (4 + 2) * (A + S / 4 / B)),
        # tree AR, N=8: height 1 + floor(log2 7) = 3, 2h = 6 stages, degree 4 (4 distinct
        # peers), 2 chunks: (k + 2h - 1) steps of alpha + 3 o + 4 chunks of S/(2k)
        # = 7 (1 + 1.5 us + 4 S/4 / B)
        ("all-reduce", "tree", 8, {"chunks": 2}, (2 + 5) * (A + 3 * OV + 4 * S / 4 / B)),
        # tree AR, N=3: height 1 + floor(log2 2) = 2, degree 3 but 2 distinct peers (the
        # trees share an edge), 1 chunk: 4 (1 + 0.5 us + 3 S/2 / B)
        ("all-reduce", "tree", 3, {"chunks": 1}, (1 + 3) * (A + OV + 3 * S / 2 / B)),
        # RHD AR, N=8: 2 lg 8 steps, 2 (N-1)/N S
        ("all-reduce", "rhd", 8, {}, 2 * 3 * A + 2 * 7 / 8 * S / B),
        # RHD AR, N=6: p=4, r=2: 2 lg 4 steps + fold in and out (alpha + S/B each)
        ("all-reduce", "rhd", 6, {}, 2 * 2 * A + 2 * 3 / 4 * S / B + 2 * (A + S / B)),
        ("reduce-scatter", "rhd", 8, {}, 3 * A + 7 / 8 * S / B),
        # RHD RS, N=6: fold 0->1, 2->3 (S); halving over v = 1,3,4,5 holding 2,2,1,1 blocks
        # of S/6: distance 1 moves 3 blocks, distance 2 at most 2; unfold 1->0, 3->2 (S/6)
        ("reduce-scatter", "rhd", 6, {}, (A + S / B) + (A + 3 * S / 6 / B) + (A + 2 * S / 6 / B)
         + (A + S / 6 / B)),
        ("all-gather", "rhd", 6, {}, 4 * A + 2 * S / B),
        # PS, N=4, 2 shards: a server takes 3 shards of S/2 in push and gives 3 in pull,
        # handling the 3 messages one by one: 2 (alpha + 2 o + 3 S/2 / B) = 2 (2 us + ...)
        ("all-reduce", "ps", 4, {"ps_shards": 2}, 2 * (A + 2 * OV + 3 * S / 2 / B)),
        ("all-reduce", "ps", 4, {"ps_shards": 4}, 2 * (2 * A + 3 * S / 4 / B)),
        # all-to-all, N=4: 3 messages of S/4 share the link in one step, handled one by
        # one: alpha + 2 o + 3/4 S/B = 2 us + 3/4 S/B
        ("all-to-all", "direct", 4, {}, 2 * A + 3 / 4 * S / B),
        # an explicit overhead (alpha 1 us of which o = 0.2 us is endpoint): PS N=4 pays
        # 2 (1 + 2 x 0.2 us + ...); all-to-all N=8 pays 1 + 6 x 0.2 us; tree N=8 3 x 0.2 us
        ("all-reduce", "ps", 4, {"overhead": 0.2 * A}, 2 * (1.4 * A + 3 * S / B)),
        ("all-to-all", "direct", 8, {"overhead": 0.2 * A}, 2.2 * A + 7 / 8 * S / B),
        ("all-reduce", "tree", 8, {"chunks": 2, "overhead": 0.2 * A},
         7 * (1.6 * A + 4 * S / 4 / B)),
        # rings and RHD give every rank one peer per step: the overhead never shows
        ("all-reduce", "ring", 4, {"overhead": 5 * A}, 2 * 3 * A + 2 * 3 / 4 * S / B),
        ("all-reduce", "rhd", 6, {"overhead": 5 * A},
         2 * 2 * A + 2 * 3 / 4 * S / B + 2 * (A + S / B)),
    ],
)  # fmt: skip
def test_closed_form_by_hand(op, alg, n, kw, expected):
    assert t(op, alg, n, **kw) == pytest.approx(expected, rel=1e-12)


def test_alpha_with_fanin_by_hand():
    # LogP: k messages through one endpoint, the last handled (k - 1) o after the first
    assert alpha_with_fanin(A, 1) == A
    assert alpha_with_fanin(A, 7) == pytest.approx(A + 6 * A / 2)  # 4 us
    assert alpha_with_fanin(2.4e-6, 7, 1e-6) == pytest.approx(8.4e-6)  # fabric 0.4 us not o
    assert alpha_with_fanin(A, [1, 2, 64]).tolist() == pytest.approx([A, 1.5 * A, 32.5 * A])


def test_tree_peers():
    # distinct neighbours in the two trees: they share edges up to n = 5
    assert tree_peers([1, 2, 3, 4, 5, 6, 7, 100]).tolist() == [0, 1, 2, 3, 3, 4, 4, 4]


def test_parameter_server_loses_small_messages_at_scale():
    # 64 ranks, 8 B: the server handles 63 messages each way, 2 (a + 62 o) = 64 a, against
    # RHD's 2 lg 64 = 12 a and the tree's 12 steps of a + 3 o = 2.5 a = 30 a
    ps = t("all-reduce", "ps", 64, ps_shards=1) - 2 * 63 * S / B
    assert ps == pytest.approx(64 * A)
    small = {
        alg: float(collective_time("all-reduce", alg, 64, 8.0, A, B))
        for alg in ("ring", "tree", "rhd", "ps")
    }
    assert small["rhd"] < small["tree"] < small["ps"] < small["ring"]
    assert small["rhd"] == pytest.approx(12 * A, rel=1e-3)


def test_pipeline_chunks_by_hand():
    # ring broadcast N=4: k* = sqrt((N-2) S / (alpha B)) = sqrt(209.7) = 14.48; of 14 and
    # 15, 14 gives 16 (alpha + S/14B) = 135.84 us against 17 (alpha + S/15B) = 135.84+ us
    work = S / B
    assert pipeline_chunks(3, A, work, S) == 14
    assert pipeline_time(14, 3, A, work) < pipeline_time(15, 3, A, work)
    assert t("broadcast", "ring", 4) == pytest.approx(16 * (A + S / 14 / B), rel=1e-12)
    # the chosen count is no worse than any other
    ks = np.arange(1, 200)
    assert pipeline_time(14, 3, A, work) <= pipeline_time(ks, 3, A, work).min()


def test_pipeline_chunks_edges():
    assert pipeline_chunks(1, A, 1.0, S) == 1  # one stage: nothing to overlap
    assert pipeline_chunks(5, 0.0, 1.0, 1000.0) == 1000  # free steps: one-byte chunks
    assert pipeline_chunks(5, 0.0, 0.0, 1000.0) == 1
    assert pipeline_chunks(5, A, 1.0, 0.5) == 1


def test_tree_shape_formulas():
    assert list(tree_height([1, 2, 3, 4, 5, 9, 14, 17])) == [0, 1, 2, 2, 3, 4, 4, 5]
    assert list(tree_degree([1, 2, 3, 4, 100])) == [0, 2, 3, 4, 4]


def test_hierarchical_by_hand():
    ia, ib, oa, ob = 1e-6, 100e9, 5e-6, 10e9
    # 2 nodes x 4 GPUs: intra RS and AG (3 steps of S/4 each), inter ring AR per rail on
    # S/4 over 2 nodes (2 steps of S/8)
    got = hierarchical_time("all-reduce", 2, 4, S, ia, ib, oa, ob)
    assert got == pytest.approx(2 * 3 * (ia + S / 4 / ib) + 2 * (oa + S / 8 / ob), rel=1e-12)
    rs = hierarchical_time("reduce-scatter", 2, 4, S, ia, ib, oa, ob)
    assert rs == pytest.approx(3 * (ia + S / 4 / ib) + (oa + S / 8 / ob), rel=1e-12)
    ag = hierarchical_time("all-gather", 2, 4, S, ia, ib, oa, ob)
    assert ag == pytest.approx(rs, rel=1e-12)
    # every phase is a ring, one peer per step: per-message overheads never show
    heavy = hierarchical_time(
        "all-reduce", 2, 4, S, ia, ib, oa, ob, intra_overhead=9 * ia, inter_overhead=9 * oa
    )
    assert heavy == got
    # one node: just the intra-node rings; one GPU per node: just the inter-node ring
    assert hierarchical_time("all-reduce", 1, 4, S, ia, ib, oa, ob) == pytest.approx(
        2 * 3 * (ia + S / 4 / ib)
    )
    assert hierarchical_time("all-reduce", 4, 1, S, ia, ib, oa, ob) == pytest.approx(
        float(collective_time("all-reduce", "ring", 4, S, oa, ob))
    )


@pytest.mark.parametrize("op,alg", FLAT)
def test_group_of_one_costs_nothing(op, alg):
    assert t(op, alg, 1) == 0.0
    assert collective_time(op, alg, [1, 1], [0.0, S], A, B).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("op,alg", FLAT)
def test_zero_bytes_cost_latency_only(op, alg):
    got = float(collective_time(op, alg, 8, 0.0, A, B, ps_shards=2))
    assert got > 0 and got == pytest.approx(float(collective_time(op, alg, 8, 0.0, A, 1e300)))


@pytest.mark.parametrize("op,alg", FLAT)
def test_broadcasts_over_group_sizes_and_sizes(op, alg):
    n = np.array([1, 2, 3, 8, 13, 64, 1000])[:, None]
    size = np.array([0.0, 8.0, 1e3, 2.0**20, 2.0**30])[None, :]
    grid = collective_time(op, alg, n, size, A, B)
    assert grid.shape == (7, 5)
    for i, ni in enumerate(n[:, 0]):
        for j, sj in enumerate(size[0]):
            assert grid[i, j] == float(collective_time(op, alg, int(ni), float(sj), A, B))
    assert np.all(np.diff(grid, axis=1) >= 0)  # more bytes never cost less
    alphas = collective_time(op, alg, 8, S, np.array([0.0, A, 2 * A]), B)
    assert alphas.shape == (3,) and np.all(np.diff(alphas) > 0)


def test_bus_factor():
    n = np.array([1, 2, 4, 8])
    assert bus_factor("all-reduce", n).tolist() == [0.0, 1.0, 1.5, 1.75]
    assert bus_factor("all-gather", n).tolist() == [0.0, 0.5, 0.75, 0.875]
    assert bus_factor("reduce-scatter", 4) == 0.75
    assert bus_factor("all-to-all", 4) == 0.75
    assert bus_factor("broadcast", n).tolist() == [1.0] * 4


def test_ring_bus_bandwidth_approaches_link_bandwidth():
    # nccl-tests' point of busbw: a bandwidth-bound ring all-reduce shows busbw = B
    big = 2.0**40
    time = float(collective_time("all-reduce", "ring", 64, big, 0.0, B))
    assert big / time * bus_factor("all-reduce", 64) == pytest.approx(B)


def test_bad_input_is_a_clear_value_error():
    with pytest.raises(ValueError, match="unknown collective 'all-reduse'"):
        t("all-reduse", "ring", 4)
    with pytest.raises(ValueError, match="broadcast has no 'tree' algorithm.*ring"):
        t("broadcast", "tree", 4)
    with pytest.raises(ValueError, match="use hierarchical_time"):
        t("all-reduce", "hierarchical", 4)
    with pytest.raises(ValueError, match="ps_shards"):
        t("all-reduce", "ps", 4, ps_shards=5)
    with pytest.raises(ValueError, match="integers >= 1"):
        t("all-reduce", "ring", 0)
    with pytest.raises(ValueError, match="integers >= 1"):
        t("all-reduce", "ring", 2.5)
    with pytest.raises(ValueError, match="bandwidth > 0"):
        collective_time("all-reduce", "ring", 4, S, A, 0.0)
    with pytest.raises(ValueError, match="chunks"):
        t("broadcast", "ring", 4, chunks=0)
    with pytest.raises(ValueError, match="overhead"):
        t("all-reduce", "ps", 4, overhead=-1.0)
    with pytest.raises(ValueError, match="all-to-all has no 'hierarchical'"):
        hierarchical_time("all-to-all", 2, 4, S, A, B, A, B)
    with pytest.raises(ValueError, match="unknown collective"):
        bus_factor("gather", 4)
