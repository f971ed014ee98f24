"""Every registered algorithm, every op it serves: the closed form equals the schedule
routed on uniform networks (flat ones on one switch, one leaf and a fat tree; two-tier
ones on whole nodes of one leaf), whole-node algorithms refuse partial nodes; groups of
one, zero bytes, broadcasting, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import typer
from conftest import make_cluster

from commsim.collectives.algorithms import (
    ALGORITHMS,
    SEARCHED,
    build_schedule,
    bus_factor,
    lookup,
    runs_on,
)
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


# --- closed form against the schedule on uniform networks ------------------------------

SIZES = [0.0, 1.0, 8.0, 1000.0, 2.0**20, 3.0e7, 2.0**30]
TWO_TIER = [
    (op, alg) for op, algs in ALGORITHMS.items() for alg in algs if lookup(op, alg).two_tier
]
WHOLE_NODES = [
    (op, alg) for op, algs in ALGORITHMS.items() for alg in algs if lookup(op, alg).whole_nodes
]


@pytest.fixture(scope="module")
def uniform():
    """Networks on which every pair of GPUs sees the same latency and bandwidth, with the
    group sizes, channel counts and per-message overhead (None: alpha / 2) to try there."""
    switch = make_cluster(nodes=1, gpus_per_node=64)
    leaf = make_cluster(nodes=12, gpus_per_node=1, nodes_per_leaf=12)
    fat = make_cluster(
        nodes=16, gpus_per_node=1, nodes_per_leaf=4, link_latency="0s", switch_latency="0s"
    )
    # one switch: alpha is all endpoint, o = alpha / 2 (the closed form's default). One
    # leaf: alpha has a fabric part (2 us NIC + 0.4 us cable and switch), so o, the
    # endpoint's 1 us, is passed; channels = 2 duplicates every (src, dst) pair, which must
    # not count as a second peer. Fat tree: 16 single-GPU nodes, 4 leaves, non-blocking,
    # destination-mod-k uplinks: every schedule on all 16 GPUs is free of uplink
    # collisions; no switch or cable latency, so o = alpha / 2 again.
    return {
        "switch-64": (switch, [*range(1, 34), 48, 63, 64], (1,), None),
        "one-leaf-12": (leaf, [1, 2, 3, 5, 7, 12], (1, 2), endpoint_overhead(leaf, 0, 1)),
        "fat-tree-16": (fat, [16], (1,), None),
    }


@pytest.mark.parametrize("where", ["switch-64", "one-leaf-12", "fat-tree-16"])
@pytest.mark.parametrize("op,alg", FLAT)
def test_closed_form_equals_schedule_on_uniform_networks(uniform, where, op, alg):
    # every registered flat algorithm, every op it serves: group sizes 1, 2, powers of two
    # and not, sizes 0 B .. 1 GiB, parameter-server shards 1, 3 and n; pipelined ones pick
    # their chunk count from the graph's step (graph_time) and from the closed form's
    cluster, group_sizes, channel_counts, o = uniform[where]
    far = max(group_sizes) - 1
    alpha, bw = path_params(cluster, 0, far)
    assert o is not None or float(endpoint_overhead(cluster, 0, far)) == pytest.approx(alpha / 2)
    for n in group_sizes:
        for shards in sorted({1, min(3, n), n}) if alg == "ps" else (1,):
            closed = collective_time(op, alg, n, SIZES, alpha, bw, ps_shards=shards, overhead=o)
            for channels in channel_counts:
                graph = [
                    graph_time(
                        op, alg, s, cluster, np.arange(n), ps_shards=shards, channels=channels
                    )
                    for s in SIZES
                ]
                assert graph == pytest.approx(closed, rel=1e-9), (n, shards, channels)


@pytest.mark.parametrize("op,alg", TWO_TIER)
@pytest.mark.parametrize(
    "nodes,gpn", [(1, 2), (1, 4), (2, 1), (2, 4), (3, 2), (3, 4), (4, 3), (5, 2)]
)
def test_two_tier_closed_form_equals_schedule(op, alg, nodes, gpn):
    # nodes x gpn GPUs, a NIC per GPU, one leaf: intra and inter links are each uniform
    cluster = make_cluster(nodes=nodes, gpus_per_node=gpn, nics=gpn, nodes_per_leaf=nodes)
    intra = path_params(cluster, 0, 1) if gpn > 1 else (1e-6, 1e11)  # unused: no intra ring
    inter = path_params(cluster, 0, gpn) if nodes > 1 else (1e-6, 1e10)  # unused: no inter
    inter_o = float(endpoint_overhead(cluster, 0, gpn)) if nodes > 1 else None
    n = nodes * gpn
    closed = hierarchical_time(op, nodes, gpn, SIZES, *intra, *inter, inter_overhead=inter_o)
    graph = [graph_time(op, alg, s, cluster, np.arange(n), gpus_per_node=gpn) for s in SIZES]
    assert graph == pytest.approx(closed, rel=1e-9)


@pytest.mark.parametrize("op,alg", WHOLE_NODES)
def test_whole_node_algorithms_refuse_partial_nodes(op, alg):
    for n, gpn in [(10, 4), (5, 2), (7, 8)]:
        assert not runs_on(op, alg, n, gpn)
        with pytest.raises(ValueError, match="whole nodes"):
            build_schedule(op, alg, n, S, gpus_per_node=gpn)
    assert runs_on(op, alg, [12, 4, 1], [4, 4, 1]).all()


# --- the one list of names ----------------------------------------------------------------


def test_every_module_is_registered_once_in_order():
    assert ALGORITHMS["all-reduce"] == ("ring", "tree", "rhd", "ps", "hierarchical")
    assert ALGORITHMS["reduce-scatter"] == ("ring", "rhd", "hierarchical", "allreduce-ring")
    assert ALGORITHMS["broadcast"] == ("ring", "binomial")
    assert ALGORITHMS["send-recv"] == ("direct",)
    # gloo's own run when named (a backend table, --algorithm), never as auto's choice
    assert SEARCHED["reduce-scatter"] == ("ring", "rhd", "hierarchical")
    assert SEARCHED["broadcast"] == ("ring",)
    assert lookup("broadcast", "ring") is not lookup("all-reduce", "ring")  # chain.py


def test_everything_that_names_algorithms_reads_the_registry():
    from commsim.cli import app
    from commsim.collectives.backends import ALGORITHMS as BACKENDS
    from commsim.planner import search
    from commsim.specs import Strategy
    from commsim.step import layouts

    for name in ("auto", "nccl", *ALGORITHMS["all-reduce"]):
        assert Strategy(algorithm=name).algorithm == name
    with pytest.raises(ValueError):
        Strategy(algorithm="binomial")
    assert ("auto", "nccl", *SEARCHED["all-reduce"]) == layouts.ALGORITHMS
    assert set(search.NCCL_ALGORITHMS) <= set(SEARCHED["all-reduce"])
    for table in BACKENDS.values():
        for op, spelling in table.items():
            assert all(a in (*ALGORITHMS[op], "nccl") for a in spelling.split("|"))
    params = typer.main.get_command(app.app).commands["collective"].params
    help_text = " ".join(p.help or "" for p in params)
    assert all(f"{op}: {', '.join(algs)}" in help_text for op, algs in ALGORITHMS.items())
