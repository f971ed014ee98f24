"""The evaluators: LogP fan-in and pipelining of the closed form, its input checks, and
what the graph shows that the closed form cannot (shared uplinks, rank order)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim.collectives.algorithms import build_schedule, bus_factor
from commsim.collectives.algorithms.base import pipeline_chunks, pipeline_time
from commsim.collectives.evaluate import collective_time, evaluate, graph_time, hierarchical_time
from commsim.topology.routing import alpha_with_fanin, endpoint_overhead, path_params

pytestmark = pytest.mark.filterwarnings("error")

A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB


def t(op, alg, n, **kw):
    return float(collective_time(op, alg, n, S, A, B, **kw))


def test_alpha_with_fanin_by_hand():
    # LogP: k messages through one endpoint, the last handled (k - 1) o after the first
    assert alpha_with_fanin(A, 1) == A
    assert alpha_with_fanin(A, 7) == pytest.approx(A + 6 * A / 2)  # 4 us
    assert alpha_with_fanin(2.4e-6, 7, 1e-6) == pytest.approx(8.4e-6)  # fabric 0.4 us not o
    assert alpha_with_fanin(A, [1, 2, 64]).tolist() == pytest.approx([A, 1.5 * A, 32.5 * A])


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


def test_partial_fat_tree_collides_on_uplinks(uniform_fat_tree):
    # 13 of the 16 GPUs: destination-mod-k routing now sends up to 7 tree flows through one
    # leaf uplink, so the graph is slower than the closed form, which cannot see this
    alpha, bw = path_params(uniform_fat_tree, 0, 15)
    graph = graph_time("all-reduce", "tree", 2.0**28, uniform_fat_tree, np.arange(13))
    closed = float(collective_time("all-reduce", "tree", 13, 2.0**28, alpha, bw))
    assert graph > 1.5 * closed


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


@pytest.mark.parametrize("algorithm", ["ring", "tree", "hierarchical", "rhd"])
def test_asking_by_the_grid_equals_asking_by_the_flows(algorithm):
    # grid_step_time (the routed default, keyed by the groups and the step's ranks) gives
    # what routing every group's flows gives, bit for bit, at every size and again
    from commsim.topology.routing import step_time

    c = make_cluster(nodes=8, gpus_per_node=4, nics=2, nodes_per_leaf=2, routing="hash")
    gpus = np.arange(32).reshape(4, 8).T.copy()  # 8 groups of 4, one GPU a node each
    gpus = np.arange(32).reshape(2, 16) if algorithm == "hierarchical" else gpus
    kw = dict(gpus_per_node=4, channels=2) if algorithm == "hierarchical" else {}
    for size in (0.0, 1e3, 2.0**20, 2.0**28, 2.0**20):
        fast = graph_time("all-reduce", algorithm, size, c, gpus, **kw)
        flows = graph_time(
            "all-reduce", algorithm, size, c, gpus, step_time=lambda *a: step_time(*a), **kw
        )
        assert fast == flows
