"""Collective costs of a placed group on real fabrics: what the graph shows beyond closed forms."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim import catalog
from commsim.collectives.evaluate import collective_time
from commsim.collectives.group import GroupCost
from commsim.spec_io import load_spec
from commsim.specs import ClusterSpec
from commsim.topology.build import build_cluster
from commsim.topology.placement import place
from commsim.topology.routing import path_params

BIG, BIGGER = 2.0**28, 2.0**29


def _bandwidth_term(cost: GroupCost, algorithm: str = "ring") -> float:
    """Seconds per byte of the large-size slope: (T(2S) - T(S)) / S."""
    t = cost.time("all-reduce", algorithm, np.array([BIG, BIGGER]))
    return (t[1] - t[0]) / (BIGGER - BIG)


def test_interleaved_ring_across_oversubscribed_racks_is_three_times_slower():
    # 2 racks x 6 single-GPU nodes, 3:1 rack uplinks (6 ports down, 2 up). A blocked ring
    # crosses racks twice; an interleaved one on every edge, so 6 flows share 2 uplinks.
    c = make_cluster(nodes=12, gpus_per_node=1, nodes_per_leaf=6, oversubscription=(3.0,))
    blocked = GroupCost(c, place(c, 12, "blocked"))
    interleaved = GroupCost(c, place(c, 12, "interleaved"))
    ratio = _bandwidth_term(interleaved) / _bandwidth_term(blocked)
    assert ratio == pytest.approx(3.0, rel=1e-6)
    # Non-blocking uplinks: the order does not matter.
    flat = make_cluster(nodes=12, gpus_per_node=1, nodes_per_leaf=6)
    ratio = _bandwidth_term(GroupCost(flat, place(flat, 12, "interleaved"))) / _bandwidth_term(
        GroupCost(flat, place(flat, 12, "blocked"))
    )
    assert ratio == pytest.approx(1.0, rel=1e-6)


def test_ring_on_dgx_nodes_uses_every_rail():
    # 4 nodes x 8 GPUs, 8 NICs of 25 GB/s: a ring with one channel per rail moves its
    # inter-node share over all 8 NICs, so the bus bandwidth is the node's 200 GB/s (what
    # nccl-tests reports on DGX A100 clusters), not one NIC's 25 GB/s.
    c = make_cluster(nodes=4, gpus_per_node=8, nics=8, nic_bw="200Gbps", intra_bw="300GB/s")
    cost = GroupCost(c, place(c, 32, "blocked"))
    busbw = 2 * 31 / 32 / _bandwidth_term(cost)
    assert busbw == pytest.approx(200e9, rel=1e-6)


def test_hierarchical_on_a_single_nic_node():
    # One 10 GbE NIC for 8 GPUs, 8 nodes. Per NIC, a blocked flat ring moves 2(N-1)/N S
    # (N = 64) and hierarchical 8 rails x 2(M-1)/M S/8 (M = 8): a ratio of (7/4)/(63/32).
    # Its real gain is latency: 2(M-1) inter-node steps instead of 2(N-1).
    spec = load_spec(ClusterSpec, catalog.topology_path("ethernet-10g"))
    c = build_cluster(spec, 64)
    cost = GroupCost(c, place(c, 64, "blocked"), backend="gloo")  # the graph's schedules
    ratio = _bandwidth_term(cost, "hierarchical") / _bandwidth_term(cost, "ring")
    assert ratio == pytest.approx((7 / 4) / (63 / 32), rel=0.01)
    small = cost.time("all-reduce", "hierarchical", 8.0) / cost.time("all-reduce", "ring", 8.0)
    assert small < 0.5


def test_parameter_server_is_not_the_fastest_small_all_reduce_at_64_gpus():
    # 8 DGX H100 nodes. A 1-shard PS: in push, GPU 0 hears from 63 GPUs and handles the
    # messages one by one; the slowest flows cross the network (2 us NIC + 0.3 us cable
    # and rail leaf) and wait 62 further messages of o = 2 us / 2: 2 (2.3 + 62) us.
    # Before endpoint serialisation it cost one alpha per step (4.6 us) and won auto.
    spec = load_spec(ClusterSpec, catalog.topology_path("dgx-h100-ib"))
    c = build_cluster(spec, 64)
    cost = GroupCost(c, place(c, 64, "blocked"), backend="gloo")  # the graph's schedules
    t = {a: float(cost.time("all-reduce", a, 8.0)[0]) for a in cost.algorithms("all-reduce")}
    assert t["ps"] == pytest.approx(2 * (2.3e-6 + 62e-6), rel=1e-4)
    assert max(t["rhd"], t["tree"], t["hierarchical"]) < t["ps"]
    # the flat ring is still slower: 126 steps of 2.3 us, one peer each
    assert t["ring"] == pytest.approx(126 * 2.3e-6, rel=1e-4)
    fastest = "|".join(cost.algorithms("all-reduce"))
    _, chosen = cost.time_and_choice("all-reduce", fastest, np.array([8.0, 2.0**20]))
    assert chosen == ["rhd", "rhd"]


def test_whole_node_algorithms_drop_out_of_auto_for_partial_nodes():
    c = make_cluster(nodes=3, gpus_per_node=8, nics=8)
    cost = GroupCost(c, place(c, 20, "blocked"))
    assert cost.algorithms("all-reduce") == ("ring", "rhd", "ps")
    cost.time("all-reduce", "auto", 1e6)
    with pytest.raises(ValueError, match="whole nodes"):
        cost.time("all-reduce", "hierarchical", 1e6)


def test_graph_matches_closed_form_on_one_nvswitch_node(nvswitch_node):
    cost = GroupCost(nvswitch_node, np.arange(8))
    alpha, bw = path_params(nvswitch_node, 0, 1)
    sizes = np.array([1e3, 1e6, 1e9])
    expected = collective_time("all-reduce", "ring", 8, sizes, alpha, bw)
    assert cost.time("all-reduce", "ring", sizes) == pytest.approx(expected, rel=1e-9)


def test_the_fastest_of_several_and_auto_under_gloo():
    c = make_cluster(nodes=8, gpus_per_node=1, nodes_per_leaf=4)
    cost = GroupCost(c, place(c, 8, "blocked"))
    sizes = np.array([8.0, 2.0**26])
    names = ("ring", "tree", "rhd", "ps", "hierarchical")
    fastest, chosen = cost.time_and_choice("all-reduce", "|".join(names), sizes)
    table = [cost.time("all-reduce", a, sizes) for a in names]
    assert fastest == pytest.approx(np.min(table, axis=0))
    # auto is what gloo runs: its ring all-reduce, its binomial broadcast (backends)
    assert cost.time_and_choice("all-reduce", "auto", sizes)[1] == ["ring", "ring"]
    assert cost.time_and_choice("broadcast", "auto", sizes)[1] == ["binomial", "binomial"]
    assert chosen[0] != "ring"  # latency-bound: a log-depth algorithm wins
    assert chosen[1] in ("ring", "rhd", "hierarchical")


def test_unknown_pairs_are_value_errors():
    c = make_cluster(nodes=2, gpus_per_node=1)
    cost = GroupCost(c, np.arange(2))
    with pytest.raises(ValueError, match="broadcast has no 'rhd'"):
        cost.time("broadcast", "rhd", 1e6)
    with pytest.raises(ValueError, match="unknown"):
        cost.time("gather", "ring", 1e6)
    with pytest.raises(ValueError, match="unknown"):
        cost.time("gather", "nccl", 1e6)


@pytest.mark.parametrize("algorithm", ["ring", "rhd", "ps", "hierarchical", "tree"])
def test_interpolation_between_powers_of_two(algorithm):
    # Affine in the size for unpipelined algorithms (exact), within 1.5% for the tree: its
    # chunk count moves with the size, and its steps' slowest flow is not the same at all
    # chunk sizes (intra- and inter-node flows differ in latency, and since LogP's per-
    # message overhead also in peers). Over a 300-size sweep of 8 B..1 GiB on this group
    # the worst is 1.28% at ~2.9 KB (1.26% at ~1.4 KB before that overhead).
    from commsim.collectives.evaluate import graph_time

    c = make_cluster(nodes=4, gpus_per_node=4, nics=2, nodes_per_leaf=2, oversubscription=(2.0,))
    cost = GroupCost(c, place(c, 16, "interleaved"))
    sizes = np.array([3.0e3, 1.5e6, 7.77e7, 3.3e8])
    direct = [
        graph_time(
            "all-reduce",
            algorithm,
            s,
            c,
            cost.gpus,
            gpus_per_node=cost.gpus_per_node,
            channels=cost.channels,
        )
        for s in sizes
    ]
    rel = 1e-9 if algorithm != "tree" else 0.015
    assert cost.time("all-reduce", algorithm, sizes) == pytest.approx(direct, rel=rel)


def test_node_structure_is_read_off_the_placement():
    c = make_cluster(nodes=4, gpus_per_node=4, nics=2, nodes_per_leaf=2)
    assert GroupCost(c, place(c, 16, "blocked")).gpus_per_node == 4
    assert GroupCost(c, place(c, 16, "interleaved")).gpus_per_node == 1
    assert GroupCost(c, np.arange(0, 16, 4)).gpus_per_node == 1  # one rank a node (stride 4)
    partial = GroupCost(c, place(c, 10, "blocked"))
    assert partial.gpus_per_node == 4 and "hierarchical" not in partial.algorithms("all-reduce")


def test_gloo_backends_nccl_choice_is_the_faster_of_ring_and_tree_on_the_graph():
    # under gloo, --algorithm nccl runs NCCL's kernels as commsim's schedules: on 8 DGX H100
    # nodes the faster of ring and tree on the graph for each size (tree for small sizes,
    # ring for the largest), each size costing what the graph gives its pick
    spec = load_spec(ClusterSpec, catalog.topology_path("dgx-h100-ib"))
    c = build_cluster(spec.model_copy(update={"backend": "gloo"}), 64)
    cost = GroupCost(c, place(c, 64, "blocked"))
    sizes = 2.0 ** np.arange(3, 33, 3)
    times, names = cost.time_and_choice("all-reduce", "nccl", sizes)
    ring, tree = (cost.time("all-reduce", a, sizes) for a in ("ring", "tree"))
    assert names == list(np.where(tree < ring, "tree", "ring"))
    assert names[0] == "tree" and names[-1] == "ring"
    assert np.allclose(times, np.minimum(ring, tree), rtol=1e-12)
    # the other ops have one NCCL algorithm; a group of partial nodes has no tree
    assert cost.time_and_choice("all-gather", "nccl", sizes)[1] == ["ring"] * sizes.size
    assert cost.time_and_choice("all-to-all", "nccl", sizes)[1] == ["direct"] * sizes.size
    partial = GroupCost(c, place(c, 12, "blocked"))
    assert partial.time_and_choice("all-reduce", "nccl", sizes)[1] == ["ring"] * sizes.size


def test_gloos_own_algorithms_are_priced_on_the_graph():
    # what calibrate's fit prices gloo with: binomial broadcast and sendrecv as posted (no
    # channel split), reduce-scatter as the full ring all-reduce; auto never picks them
    from commsim.collectives.algorithms import build_schedule
    from commsim.collectives.evaluate import evaluate

    c = make_cluster(nodes=4, gpus_per_node=4, nics=2, nodes_per_leaf=2, oversubscription=(2.0,))
    gpus = place(c, 12, "blocked")
    cost = GroupCost(c, gpus)
    for op, alg in (("broadcast", "binomial"), ("send-recv", "direct")):
        direct = evaluate(build_schedule(op, alg, 12, BIG), c, gpus)
        assert cost.time(op, alg, BIG)[0] == pytest.approx(direct, rel=1e-12)  # affine in size
    rs = cost.time("reduce-scatter", "allreduce-ring", [8.0, BIG])
    assert rs.tolist() == cost.time("all-reduce", "ring", [8.0, BIG]).tolist()
    assert cost.algorithms("broadcast") == ("ring",)
    assert "allreduce-ring" not in cost.algorithms("reduce-scatter")


def test_a_backend_tables_faster_of_runs_what_fits():
    c = make_cluster(nodes=3, gpus_per_node=8, nics=8)
    whole = GroupCost(c, place(c, 16, "blocked"))
    sizes = np.array([8.0, BIG])
    both = np.minimum(*(whole.time("all-reduce", a, sizes) for a in ("ring", "tree")))
    times, names = whole.time_and_choice("all-reduce", "ring|tree", sizes)
    assert times.tolist() == both.tolist() and set(names) <= {"ring", "tree"}
    partial = GroupCost(c, place(c, 20, "blocked"))  # tree needs whole nodes
    times, names = partial.time_and_choice("all-reduce", "ring|tree", sizes)
    assert names == ["ring", "ring"]
    assert times.tolist() == partial.time("all-reduce", "ring", sizes).tolist()
    with pytest.raises(ValueError, match=r"none of tree\|hierarchical runs"):
        partial.time("all-reduce", "tree|hierarchical", sizes)
    with pytest.raises(ValueError, match="no 'magic'"):
        whole.time("all-reduce", "ring|magic", sizes)
