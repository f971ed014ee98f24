"""Every registered algorithm, every op it serves: the closed form equals the schedule
routed on uniform networks; groups of one, zero bytes, broadcasting, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim.collectives.algorithms import ALGORITHMS, build_schedule, bus_factor, lookup
from commsim.collectives.algorithms.base import traffic
from commsim.collectives.evaluate import collective_time, graph_time, hierarchical_time
from commsim.topology.routing import endpoint_overhead, path_params

pytestmark = pytest.mark.filterwarnings("error")

A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB
FLAT = [
    (op, alg) for op, algs in ALGORITHMS.items() for alg in algs if not lookup(op, alg).two_tier
]


def t(op, alg, n, **kw):
    return float(collective_time(op, alg, n, S, A, B, **kw))


@pytest.mark.parametrize("op,alg", FLAT)
def test_group_of_one_costs_nothing(op, alg):
    assert t(op, alg, 1) == 0.0
    assert collective_time(op, alg, [1, 1], [0.0, S], A, B).tolist() == [0.0, 0.0]
    assert build_schedule(op, alg, 1, S) == []


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


def test_channels_split_flows_over_rails():
    one = build_schedule("all-reduce", "ring", 8, S)
    four = build_schedule("all-reduce", "ring", 8, S, channels=4)
    assert four[0].src.size == 4 * one[0].src.size
    assert sorted(set(four[0].rail.tolist())) == [0, 1, 2, 3] and set(one[0].rail) == {-1}
    assert traffic(four, 8)[0] == pytest.approx(traffic(one, 8)[0])


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="whole nodes"):
        build_schedule("all-reduce", "hierarchical", 10, S, gpus_per_node=4)
    with pytest.raises(ValueError, match="ps_shards"):
        build_schedule("all-reduce", "ps", 4, S, ps_shards=5)
    with pytest.raises(ValueError, match="channels"):
        build_schedule("all-reduce", "ring", 4, S, channels=0)
    with pytest.raises(ValueError, match="all-to-all has no 'ring'"):
        build_schedule("all-to-all", "ring", 4, S)


# --- closed form against the schedule on the graph --------------------------------------

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


@pytest.mark.parametrize("op", ["all-reduce", "reduce-scatter", "all-gather"])
def test_hierarchical_graph_equals_two_tier_closed_form(op):
    # 3 nodes x 4 GPUs, a NIC per GPU, one leaf: intra and inter links are each uniform
    cluster = make_cluster(nodes=3, gpus_per_node=4, nics=4, nodes_per_leaf=3)
    intra, inter = path_params(cluster, 0, 1), path_params(cluster, 0, 4)
    for size in SIZES:
        graph = graph_time(op, "hierarchical", size, cluster, np.arange(12), gpus_per_node=4)
        closed = float(hierarchical_time(op, 3, 4, size, *intra, *inter))
        assert graph == pytest.approx(closed, rel=1e-9)
