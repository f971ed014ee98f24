"""Schedules: structure, bytes conserved, NCCL's trees, and agreement with the closed form
when routed on uniform topologies (and disagreement where the fabric is shared)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim.collectives.algorithms import ALGORITHMS, build_schedule
from commsim.collectives.algorithms.base import traffic
from commsim.collectives.algorithms.tree import (
    btree_parents,
    dtree_parents,
    tree_degree,
    tree_depth,
    tree_height,
    tree_peers,
)
from commsim.collectives.evaluate import collective_time, evaluate, graph_time, hierarchical_time
from commsim.topology.routing import endpoint_overhead, path_params, peer_counts

pytestmark = pytest.mark.filterwarnings("error")

S = 2.0**20
FLAT = [(op, alg) for op, algs in ALGORITHMS.items() for alg in algs if alg != "hierarchical"]


def sent(op, alg, n, **kw):
    return traffic(build_schedule(op, alg, n, S, **kw), n)[0]


@pytest.mark.parametrize("n", [2, 5, 8, 12])
def test_bytes_each_rank_sends(n):
    # ring and RHD all-reduce (power of two): 2(N-1)/N S per rank; RS/AG: (N-1)/N S
    assert sent("all-reduce", "ring", n) == pytest.approx(np.full(n, 2 * (n - 1) / n * S))
    for op in ("reduce-scatter", "all-gather"):
        assert sent(op, "ring", n) == pytest.approx(np.full(n, (n - 1) / n * S))
    assert sent("all-to-all", "direct", n) == pytest.approx(np.full(n, (n - 1) / n * S))
    if n & (n - 1) == 0:
        assert sent("all-reduce", "rhd", n) == pytest.approx(np.full(n, 2 * (n - 1) / n * S))
        assert sent("reduce-scatter", "rhd", n) == pytest.approx(np.full(n, (n - 1) / n * S))
    # a chain broadcast forwards S from every rank but the last
    assert sent("broadcast", "ring", n, chunks=4) == pytest.approx([S] * (n - 1) + [0.0])


def test_rhd_non_power_of_two_folds():
    # N=6: ranks 0 and 2 fold into 1 and 3: they send S in, receive the result (AR: S,
    # RS: their block S/6) and take no part in between
    out, into = traffic(build_schedule("all-reduce", "rhd", 6, S), 6)
    assert out[[0, 2]] == pytest.approx([S, S]) and into[[0, 2]] == pytest.approx([S, S])
    out, into = traffic(build_schedule("reduce-scatter", "rhd", 6, S), 6)
    assert out[[0, 2]] == pytest.approx([S, S]) and into[[0, 2]] == pytest.approx([S / 6] * 2)
    # every rank ends with its block of S/6: what it received covers the other N-1 inputs
    # for that block, except that folded pairs pass whole vectors
    ag_out, ag_in = traffic(build_schedule("all-gather", "rhd", 6, S), 6)
    assert ag_out == pytest.approx(into) and ag_in == pytest.approx(out)  # RS run backwards


def test_ps_servers_take_every_shard():
    n, k = 6, 2
    push, pull = build_schedule("all-reduce", "ps", n, S, ps_shards=k)
    received = np.bincount(push.dst, weights=push.nbytes, minlength=n)
    assert received == pytest.approx([(n - 1) * S / k] * k + [0.0] * (n - k))
    assert np.array_equal(pull.src, push.dst) and np.array_equal(pull.dst, push.src)


def test_hierarchical_bytes():
    n, g = 12, 4  # 3 nodes of 4
    m = n // g
    expected = 2 * (g - 1) / g * S + 2 * (m - 1) / m * S / g
    assert sent("all-reduce", "hierarchical", n, gpus_per_node=g) == pytest.approx(
        np.full(n, expected)
    )
    steps = build_schedule("all-reduce", "hierarchical", n, S, gpus_per_node=g)
    inter = steps[1]  # the rail rings: same local index, next node
    assert np.all(inter.src % g == inter.dst % g) and np.all(inter.src // g != inter.dst // g)


def test_identical_steps_are_emitted_once():
    (ring,) = build_schedule("all-reduce", "ring", 16384, S)
    assert ring.repeat == 2 * 16383 and ring.rounds == ring.repeat and ring.src.size == 16384
    (chain,) = build_schedule("broadcast", "ring", 100, S, chunks=8)
    assert (chain.repeat, chain.stages, chain.rounds) == (8, 99, 8 + 98)
    assert len(build_schedule("all-reduce", "rhd", 16384, S)) == 2 * 14


def test_channels_split_flows_over_rails():
    one = build_schedule("all-reduce", "ring", 8, S)
    four = build_schedule("all-reduce", "ring", 8, S, channels=4)
    assert four[0].src.size == 4 * one[0].src.size
    assert sorted(set(four[0].rail.tolist())) == [0, 1, 2, 3] and set(one[0].rail) == {-1}
    assert traffic(four, 8)[0] == pytest.approx(traffic(one, 8)[0])


def test_group_of_one_is_empty():
    for op, alg in FLAT:
        assert build_schedule(op, alg, 1, S) == []


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


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="whole nodes"):
        build_schedule("all-reduce", "hierarchical", 10, S, gpus_per_node=4)
    with pytest.raises(ValueError, match="ps_shards"):
        build_schedule("all-reduce", "ps", 4, S, ps_shards=5)
    with pytest.raises(ValueError, match="channels"):
        build_schedule("all-reduce", "ring", 4, S, channels=0)
    with pytest.raises(ValueError, match="all-to-all has no 'ring'"):
        build_schedule("all-to-all", "ring", 4, S)


# --- on the graph -----------------------------------------------------------------------

SIZES = [1024.0, 2.0**20, 2.0**28]


def _uniform_clusters():
    return {
        "nvswitch-8": make_cluster(nodes=1, gpus_per_node=8),
        "one-leaf-12": make_cluster(nodes=12, gpus_per_node=1, nodes_per_leaf=12),
    }


@pytest.fixture(scope="module")
def uniform():
    return _uniform_clusters()


@pytest.mark.parametrize("op,alg", FLAT)
@pytest.mark.parametrize("where,n", [("nvswitch-8", 8), ("nvswitch-8", 5), ("one-leaf-12", 12),
                                     ("one-leaf-12", 7)])  # fmt: skip
def test_graph_equals_closed_form_on_uniform_topologies(uniform, where, n, op, alg):
    # one-leaf-12's alpha has a fabric part (2 us NIC + 0.4 us cable and switch): the
    # per-message overhead is the endpoint's 1 us, not alpha / 2, so it is passed; channels
    # = 2 duplicates every (src, dst) pair, which must not count as a second peer
    cluster = uniform[where]
    alpha, bw = path_params(cluster, 0, 1)
    o = float(endpoint_overhead(cluster, 0, 1))
    for size in SIZES:
        for channels in (1, 2):
            graph = graph_time(op, alg, size, cluster, np.arange(n), ps_shards=3, channels=channels)
            closed = float(collective_time(op, alg, n, size, alpha, bw, ps_shards=3, overhead=o))
            assert graph == pytest.approx(closed, rel=1e-9), (size, channels)


@pytest.mark.parametrize("op,alg", FLAT)
def test_graph_equals_closed_form_on_fat_tree(uniform_fat_tree, op, alg):
    # 16 single-GPU nodes, 4 leaves, non-blocking, destination-mod-k uplinks: every
    # schedule on all 16 GPUs is free of uplink collisions. No switch or cable latency:
    # alpha is all endpoint and the closed form's default overhead alpha / 2 is the graph's.
    alpha, bw = path_params(uniform_fat_tree, 0, 15)
    assert float(endpoint_overhead(uniform_fat_tree, 0, 15)) == pytest.approx(alpha / 2)
    for size in SIZES:
        graph = graph_time(op, alg, size, uniform_fat_tree, np.arange(16), ps_shards=4)
        closed = float(collective_time(op, alg, 16, size, alpha, bw, ps_shards=4))
        assert graph == pytest.approx(closed, rel=1e-9)


@pytest.mark.parametrize("n", range(2, 33))
def test_tree_and_fan_in_graph_equals_closed_form_at_every_size(n):
    # one 32-GPU switch: tree (shared edges at n <= 5), PS (1 and n shards) and all-to-all
    # charge the same per-message overhead on the graph and in the closed form
    cluster = make_cluster(nodes=1, gpus_per_node=32)
    alpha, bw = path_params(cluster, 0, 1)
    for op, alg, shards in [("all-reduce", "tree", 1), ("all-reduce", "ps", 1),
                            ("all-reduce", "ps", n), ("all-to-all", "direct", 1)]:  # fmt: skip
        for size in (8.0, 2.0**20):
            graph = graph_time(op, alg, size, cluster, np.arange(n), ps_shards=shards)
            closed = float(collective_time(op, alg, n, size, alpha, bw, ps_shards=shards))
            assert graph == pytest.approx(closed, rel=1e-9), (alg, shards, size)


def test_partial_fat_tree_collides_on_uplinks(uniform_fat_tree):
    # 13 of the 16 GPUs: destination-mod-k routing now sends up to 7 tree flows through one
    # leaf uplink, so the graph is slower than the closed form, which cannot see this
    alpha, bw = path_params(uniform_fat_tree, 0, 15)
    graph = graph_time("all-reduce", "tree", 2.0**28, uniform_fat_tree, np.arange(13))
    closed = float(collective_time("all-reduce", "tree", 13, 2.0**28, alpha, bw))
    assert graph > 1.5 * closed


@pytest.mark.parametrize("op", ["all-reduce", "reduce-scatter", "all-gather"])
def test_hierarchical_graph_equals_two_tier_closed_form(op):
    # 3 nodes x 4 GPUs, a NIC per GPU, one leaf: intra and inter links are each uniform
    cluster = make_cluster(nodes=3, gpus_per_node=4, nics=4, nodes_per_leaf=3)
    intra, inter = path_params(cluster, 0, 1), path_params(cluster, 0, 4)
    for size in SIZES:
        graph = graph_time(op, "hierarchical", size, cluster, np.arange(12), gpus_per_node=4)
        closed = float(hierarchical_time(op, 3, 4, size, *intra, *inter))
        assert graph == pytest.approx(closed, rel=1e-9)


def test_oversubscription_slows_the_graph_not_the_closed_form():
    # 2 leaves of 4 nodes, 4:1 oversubscribed: an all-to-all pushes 16 cross-leaf flows
    # through one leaf uplink worth one NIC
    cluster = make_cluster(nodes=8, gpus_per_node=1, nodes_per_leaf=4, oversubscription=(4.0,))
    alpha, bw = path_params(cluster, 0, 7)
    o = float(endpoint_overhead(cluster, 0, 7))
    closed = float(collective_time("all-to-all", "direct", 8, 2.0**28, alpha, bw, overhead=o))
    graph = graph_time("all-to-all", "direct", 2.0**28, cluster, np.arange(8))
    # closed: 7/8 S / B; graph: the uplink carries 16 flows of S/8 = 2S at B; both pay the
    # 7 peers' messages one by one: alpha + 6 o
    assert graph == pytest.approx(alpha + 6 * o + 2 * 2.0**28 / bw, rel=1e-6)
    assert graph > 2 * closed


def test_rank_order_matters_on_the_graph():
    # 2 nodes x 4 GPUs, one NIC each: a ring in node order crosses the network twice per
    # round; interleaving nodes makes all 8 hops cross it
    cluster = make_cluster(nodes=2, gpus_per_node=4, nics=1, nodes_per_leaf=2)
    blocked = graph_time("all-reduce", "ring", S, cluster, np.arange(8))
    interleaved = graph_time("all-reduce", "ring", S, cluster, np.array([0, 4, 1, 5, 2, 6, 3, 7]))
    assert interleaved > 2 * blocked


def test_evaluate_takes_any_step_time():
    steps = build_schedule("broadcast", "ring", 4, S, chunks=3)
    # a step costing 1 s: (3 chunks + 3 stages - 1) rounds
    assert evaluate(steps, None, np.arange(4), lambda *args: 1.0) == 5.0
    assert evaluate([], None, np.arange(1)) == 0.0
