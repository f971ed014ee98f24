"""The largest fabrics: presets against their published counts, planes, dual-port NICs,
per-tier over- and under-subscription, and the routing models' effective throughput."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_cluster
from typer.testing import CliRunner

from commsim import catalog
from commsim.cli.app import app
from commsim.spec_io import load_spec
from commsim.specs import ClusterSpec
from commsim.topology.build import build_cluster
from commsim.topology.fabric import ROUTING_THROUGHPUT
from commsim.topology.routing import maxmin_rates, path_params, routes, step_time

PRESETS = ("meta-24k-h100-roce", "alibaba-hpn-15k", "deepseek-mpft-16k", "colossus-class-131k")


def _built(name: str):
    return build_cluster(load_spec(ClusterSpec, catalog.topology_path(name)))


def test_meta_24k_counts_and_tiers():
    # glennklockwood.com: 24,576 GPUs, 3,072 nodes, 1,536 racks, 8 pods of 3,072 GPUs and
    # 192 racks; T0-T1 2:1 under, T1-T2 7:1 over
    c = _built("meta-24k-h100-roce")
    p = c.physical
    assert (p["gpus"], p["nodes"], p["leaves"], p["pods"]) == (24576, 3072, 1536, 8)
    assert c.n_gpus // p["pods"] == 3072 and p["leaves"] // p["pods"] == 192
    assert int(c.rack_of_node.max()) + 1 == 1536
    down = 16 * 400e9 / 8  # a rack's ToR: two nodes x 8 x 400G
    assert c.capacity[c.leaf_spine[0, :, 0]].sum() == pytest.approx(2 * down)  # 2:1 under
    pod_down = 192 * 2 * down  # what the pod's leaves send up into its spines
    pod_up = c.capacity[c.spine_core[: c.spines_per_pod, :, 0]].sum()
    assert pod_up == pytest.approx(pod_down / 7)  # 7:1 over
    assert (p["leaf_uplinks"], p["spine_uplinks"]) == (32, 28)  # 16 / 0.5; ceil(192 / 7)


def test_alibaba_hpn_counts():
    # SIGCOMM'24: 15 segments of 1,024 GPUs, dual-plane, 2 x 200G a NIC; SimAI's template:
    # 240 ToRs, 120 aggregation switches, one 400G link from each ToR to each of its
    # plane's 60
    c = _built("alibaba-hpn-15k")
    p = c.physical
    assert (p["gpus"], p["planes"], p["leaves"], p["spines"]) == (15360, 2, 240, 120)
    assert int(c.rack_of_node.max()) + 1 == 15  # segments of 128 hosts
    assert (p["nic_leaf_links"], p["leaf_spine_links"]) == (30720, 14400)
    assert p["leaf_uplinks"] == 60
    # a NIC's two ports: different ToRs, different planes, 200G each
    ports = np.array([0, 1])
    assert c.leaf_of_nic[0] != c.leaf_of_nic[1]
    assert c.plane_of(ports).tolist() == [0, 1]
    assert c.capacity[c.nic_leaf[ports, 0]] == pytest.approx([25e9, 25e9])


def test_deepseek_mpft_counts():
    # ISCA'25: 8 planes, 64-port switches, 2,048 endpoints a plane, 16,384 in all, 768
    # switches
    p = _built("deepseek-mpft-16k").physical
    assert (p["gpus"], p["planes"], p["switches"]) == (16384, 8, 768)
    assert p["nic_ports"] // p["planes"] == 2048
    assert (p["leaves"], p["spines"]) == (8 * 64, 8 * 32)


def test_colossus_class_counts():
    # a 3-tier fat tree of 64-port 800G switches at 400G a GPU: 131,072 GPUs, 5,120 switches
    c = _built("colossus-class-131k")
    p = c.physical
    assert (p["gpus"], p["leaves"], p["spines"], p["cores"]) == (131072, 2048, 2048, 1024)
    assert p["switches"] == 5120
    assert c.summary()["throughput"] == ROUTING_THROUGHPUT["adaptive"] == 0.95


def test_a_flow_between_planes_crosses_inside_the_far_node():
    # 8 planes, one NIC per GPU: GPU 0 (plane 0) to GPU 8 + 3 (plane 3) leaves on plane 0
    # and reaches GPU 11 over NVLink from GPU 8, which owns plane 0's NIC there
    c = make_cluster(nodes=4, gpus_per_node=8, nics=8, nodes_per_leaf=2, planes=8)
    paths, _ = routes(c, np.array([0]), np.array([11]))
    names = [c.names[e] for e in paths[0] if e >= 0]
    assert names[:2] == ["gpu0->nic0.0", "nic0.0->leaf0"]
    assert names[-3:] == ["nic1.0->gpu8", "gpu8->hub1", "hub1->gpu11"]
    assert len({c.leaf_of_nic[p] for p in range(0, 32, 8)}) == 2  # plane 0: two leaves


def test_dual_port_channels_use_both_planes():
    # 2 nodes, 2 GPUs, 2 NICs of 2 x 50G ports in 2 planes: four 1 GB flows node 0 -> 1, one
    # per port (rail), run at 6.25 GB/s each, in parallel
    c = make_cluster(nodes=2, gpus_per_node=2, nics=2, nodes_per_leaf=1, planes=2, nic_ports=2)
    src, dst, rail = np.array([0, 0, 1, 1]), np.array([2, 2, 3, 3]), np.arange(4)
    t = step_time(c, src, dst, 1e9, rail)
    assert t - path_params(c, 0, 2, 0)[0] == pytest.approx(1e9 / 6.25e9, rel=1e-6)


def test_adaptive_routing_carries_its_throughput_factor():
    c = make_cluster(nodes=4, gpus_per_node=1, nodes_per_leaf=1, routing="adaptive")
    t = step_time(c, np.array([0]), np.array([2]), 1e9)
    assert t - path_params(c, 0, 2)[0] == pytest.approx(1e9 / (0.95 * 12.5e9))
    c = make_cluster(nodes=4, gpus_per_node=1, nodes_per_leaf=1, routing="adaptive", throughput=1)
    assert path_params(c, 0, 2)[1] == pytest.approx(12.5e9)


def test_hash_collisions_cost_what_nvidia_reports():
    # 128 nodes on 2 leaves of 64, 64 uplinks each: every node of leaf 0 sends to its
    # partner on leaf 1. Balanced routing gives each flow its own spine; hashing collides,
    # and the mean flow gets about 1 - 1/e of its line rate (balls in bins, on both the
    # up and the down link), near the 60% NVIDIA states for "standard Ethernet"
    src = np.arange(64)
    for routing, low, high in (("balanced", 1.0, 1.0), ("hash", 0.5, 0.7)):
        c = make_cluster(nodes=128, gpus_per_node=1, nodes_per_leaf=64, routing=routing)
        paths, _ = routes(c, src, src + 64)
        share = maxmin_rates(paths, c.capacity).mean() / 12.5e9
        assert low - 1e-9 <= share <= high + 1e-9, (routing, share)


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_predict_and_plan_run_on_each_preset(name):
    runner = CliRunner()
    common = ["--model", "llama3-8b", "--cluster", name, "--gpus", "1024", "--seq-len", "4096"]
    out = runner.invoke(app, ["predict", *common, "--global-batch", "1024", "--tp", "8", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["step_time_s"] > 0
    plan = ["plan", *common, "--global-batch", "1024", "--tp", "8", "--pp", "1", "--json"]
    out = runner.invoke(app, plan)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["candidates"]
