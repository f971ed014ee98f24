"""The cluster graph: structure, routes against networkx, max-min sharing, placements."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from conftest import make_cluster, make_spec

from commsim.specs import SpecError
from commsim.topology.build import build_cluster
from commsim.topology.placement import place
from commsim.topology.routing import (
    endpoint_overhead,
    flow_times,
    link_loads,
    maxmin_rates,
    path_params,
    peer_counts,
    routes,
    step_time,
)


def _route_nodes(cluster, path):
    names = [cluster.names[e] for e in path if e >= 0]
    hops = [n.split("->") for n in names]
    for (_, v), (u, _) in zip(hops, hops[1:], strict=False):
        assert v == u, f"route is not contiguous: {names}"
    return [hops[0][0]] + [v for _, v in hops]


@pytest.mark.parametrize("tiers,rail", [(2, False), (3, False), (3, True)])
def test_routes_are_shortest_paths(tiers, rail):
    c = make_cluster(
        nodes=16,
        gpus_per_node=4,
        nics=2,
        nodes_per_leaf=2,
        tiers=tiers,
        leaves_per_pod=2,
        rail_optimized=rail,
    )
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, c.n_gpus, 200), rng.integers(0, c.n_gpus, 200)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    paths, _ = routes(c, src, dst)
    # Drop hub hops: GPU->NIC is a direct PCIe edge, so shortest paths never use the hub
    # for inter-node traffic, and ours must not either.
    for s, d, p in zip(src, dst, paths, strict=True):
        nodes = _route_nodes(c, p)
        assert nodes[0] == f"gpu{s}" and nodes[-1] == f"gpu{d}"
        assert len(nodes) - 1 == nx.shortest_path_length(c.graph, f"gpu{s}", f"gpu{d}")


def test_latency_is_sum_of_hops():
    c = make_cluster(nodes=4, gpus_per_node=1, nodes_per_leaf=2)
    # same leaf: 2us NIC + (100ns+200ns into leaf) + 100ns out to NIC
    assert path_params(c, 0, 1)[0] == pytest.approx(2e-6 + 300e-9 + 100e-9)
    # across leaves: NIC, leaf, spine, leaf: 3 switch entries + 4 cables
    assert path_params(c, 0, 2)[0] == pytest.approx(2e-6 + 3 * 300e-9 + 100e-9)
    # inside a node: the intra-node latency only
    c8 = make_cluster(nodes=1, gpus_per_node=8)
    assert path_params(c8, 0, 5) == pytest.approx((1e-6, 300e9))


def test_maxmin_textbook_case():
    # Three flows, two links of capacity 1 and 2: f0 on link0, f1 on both, f2 on link1.
    # Progressive filling: link0 saturates at 0.5 (f0, f1 frozen), then f2 takes 2-0.5=1.5.
    paths = np.array([[0, -1], [0, 1], [1, -1]])
    rates = maxmin_rates(paths, np.array([1.0, 2.0]))
    assert rates == pytest.approx([0.5, 0.5, 1.5])


def _progressive_filling(paths, capacity):
    """The sequential textbook algorithm (Bertsekas & Gallager 6.5.2), as an oracle."""
    inc = sp.csr_matrix(
        (np.ones(int((paths >= 0).sum())), (np.nonzero(paths >= 0)[0], paths[paths >= 0])),
        shape=(paths.shape[0], capacity.size),
    )
    rate, active = np.zeros(paths.shape[0]), np.ones(paths.shape[0], dtype=bool)
    remaining = capacity.astype(float).copy()
    while active.any():
        counts = inc.T @ active.astype(float)
        loaded = counts > 0
        delta = np.min(remaining[loaded] / counts[loaded])
        rate[active] += delta
        remaining[loaded] -= delta * counts[loaded]
        frozen = (inc @ (loaded & (remaining <= 1e-9 * capacity)).astype(float)) > 0
        active &= ~frozen
    return rate


@pytest.mark.parametrize("seed", range(20))
def test_maxmin_matches_progressive_filling(seed):
    rng = np.random.default_rng(seed)
    edges, flows = 12, 40
    capacity = rng.choice([1.0, 2.0, 3.0, 5.0], edges)
    paths = np.full((flows, 4), -1)
    for f in range(flows):
        hops = rng.choice(edges, rng.integers(1, 5), replace=False)
        paths[f, : hops.size] = hops
    assert maxmin_rates(paths, capacity) == pytest.approx(_progressive_filling(paths, capacity))


def test_fluid_model_speeds_up_survivors():
    # Two flows share one 100 Gb/s NIC (12.5 GB/s): 1 GB and 3 GB. Each gets 6.25 GB/s
    # until the small one ends at 0.16 s; the big one then has 2 GB left at 12.5 GB/s.
    c = make_cluster(nodes=2, gpus_per_node=2, nics=1, nodes_per_leaf=2)
    t = flow_times(c, np.array([0, 1]), np.array([2, 3]), np.array([1e9, 3e9]))
    lat = path_params(c, 0, 2)[0]
    assert t == pytest.approx([lat + 1e9 / 6.25e9, lat + 1e9 / 6.25e9 + 2e9 / 12.5e9])


def test_link_loads_count_flows():
    c = make_cluster(nodes=2, gpus_per_node=4, nics=1, nodes_per_leaf=2)
    paths, _ = routes(c, np.arange(4), np.arange(4) + 4)
    loads = link_loads(c, paths)
    nic_up = c.nic_leaf[0, 0]
    assert loads[nic_up] == 4  # all four GPUs of node 0 leave by its single NIC


def test_oversubscribed_uplink_shares_one_third():
    # 2 racks x 3 nodes x 4 GPUs, one 100 Gb/s NIC per GPU, 3:1 uplinks (12 ports down,
    # 4 up). Every GPU sends across racks: 12 flows share 4 * 12.5 GB/s, a third each.
    c = make_cluster(nodes=6, gpus_per_node=4, nics=4, nodes_per_leaf=3, oversubscription=(3.0,))
    src = np.arange(12)
    nbytes = 1e9
    t = step_time(c, src, src + 12, nbytes)
    lat = path_params(c, 0, 12)[0]
    assert t - lat == pytest.approx(nbytes / (12.5e9 / 3), rel=1e-6)


def test_fan_in_pays_one_overhead_per_further_message():
    # LogP: 7 GPUs send 8 B each to GPU 0 at once; GPU 0 handles the messages one by one,
    # each costing it o = half the endpoint latency. NVSwitch node: path 1 us, o = 0.5 us:
    # 1 + 6 x 0.5 = 4 us (+ 7 x 8 B at 300 GB/s, under a nanosecond).
    c8 = make_cluster(nodes=1, gpus_per_node=8)
    src = np.arange(1, 8)
    assert step_time(c8, src, np.zeros(7, dtype=int), 0.0) == pytest.approx(4e-6)
    assert step_time(c8, src, np.zeros(7, dtype=int), 8.0) == pytest.approx(4e-6 + 7 * 8 / 300e9)
    # fan-out is the same: GPU 0 sends to 7 peers
    assert step_time(c8, np.zeros(7, dtype=int), src, 0.0) == pytest.approx(4e-6)
    # between nodes on one leaf: path 2 us NIC + 0.4 us cable and switch, o = 2 us / 2
    # (the fabric's latency is not an endpoint's): 2.4 + 6 x 1 = 8.4 us
    c = make_cluster(nodes=8, gpus_per_node=1, nodes_per_leaf=8)
    assert endpoint_overhead(c, src, 0) == pytest.approx(np.full(7, 1e-6))
    assert step_time(c, src, np.zeros(7, dtype=int), 0.0) == pytest.approx(8.4e-6)


def test_peer_counts_take_the_busier_endpoint():
    # 0 -> 1, 2, 3; 4 -> 3; 5 -> 6: GPU 0 sends to 3 peers, GPU 3 hears from 2
    src, dst = np.array([0, 0, 0, 4, 5]), np.array([1, 2, 3, 3, 6])
    assert peer_counts(src, dst).tolist() == [3, 3, 3, 2, 1]
    c8 = make_cluster(nodes=1, gpus_per_node=8)
    t = flow_times(c8, src, dst, np.zeros(5))
    assert t == pytest.approx(1e-6 + 0.5e-6 * np.array([2, 2, 2, 1, 0]))
    # a self-send has no path and no peers
    assert peer_counts(np.array([2, 2]), np.array([2, 5])).tolist() == [1, 1]


def test_ring_step_and_channel_split_pay_no_overhead():
    # a ring step: every GPU sends to one and hears from one; k = 1, latency unchanged
    c8 = make_cluster(nodes=1, gpus_per_node=8)
    ring = np.arange(8)
    assert step_time(c8, ring, np.roll(ring, -1), 0.0) == pytest.approx(1e-6)
    # NCCL's channels: 0 -> 8 over 4 rails is one peer (the rails run in parallel)
    c = make_cluster(nodes=2, gpus_per_node=8, nics=4, nodes_per_leaf=2)
    lat = path_params(c, 0, 8)[0]
    src, dst, rail = np.zeros(4, dtype=int), np.full(4, 8), np.arange(4)
    assert peer_counts(src, dst).tolist() == [1] * 4
    assert step_time(c, src, dst, 0.0, rail) == pytest.approx(lat)
    # a second destination is a second peer: + o (1 us) for every flow of GPU 0
    src2, dst2 = np.append(src, 0), np.append(dst, 9)
    assert step_time(c, src2, dst2, 0.0, np.append(rail, -1)) == pytest.approx(lat + 1e-6)


def test_placements():
    c = make_cluster(nodes=4, gpus_per_node=2, nodes_per_leaf=2)
    assert list(place(c, 8, "blocked")) == list(range(8))
    inter = place(c, 8, "interleaved")
    racks = c.rack_of(inter)
    assert all(racks[i] != racks[i + 1] for i in range(7))
    assert sorted(inter) == list(range(8))
    assert list(place(c, 8, "topology-aware")) == list(range(8))
    with pytest.raises(ValueError):
        place(c, 8, "random")


def test_too_many_gpus_and_disconnected_fabric():
    spec = make_spec(nodes=2)
    with pytest.raises(SpecError, match="17 GPUs requested .* has 16"):
        build_cluster(spec, 17)
    with pytest.raises(SpecError, match="disconnected"):
        build_cluster(make_spec(nodes=4, nodes_per_leaf=2, uplinks_per_leaf=0))


def test_builds_only_the_nodes_a_job_needs():
    c = build_cluster(make_spec(nodes=8, gpus_per_node=8), 20)
    assert c.n_nodes == 3 and c.n_gpus == 24


@pytest.mark.parametrize("routing", ["hash", "balanced"])
def test_step_time_is_the_slowest_flow_at_every_scale(routing):
    # step_time keeps a step's slowest flows (latency vs time a byte) once, then scales
    # them: the same as the slowest of every flow's time, bit for bit, at every size
    c = make_cluster(nodes=8, gpus_per_node=2, nics=1, nodes_per_leaf=2, routing=routing)
    rng = np.random.default_rng(3)
    src = rng.integers(0, c.n_gpus, 200)
    dst = rng.integers(0, c.n_gpus, 200)
    shape = rng.choice([1.0, 0.5, 0.25], 200)
    for scale in (0.0, 1.0, 2.0**20, 3e9):
        whole = float(np.max(flow_times(c, src, dst, shape * scale)))
        assert step_time(c, src, dst, shape * scale) == whole
