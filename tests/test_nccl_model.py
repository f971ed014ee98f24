"""NCCL's cost model (collectives.nccl): its constants by version, what its topology search
gives known machines, its latency and bandwidth formulas against hand-worked values, its
tuner's choices against published logs, and public nccl-tests measurements."""

from __future__ import annotations

import numpy as np
import pytest

from commsim import catalog
from commsim.collectives import nccl
from commsim.collectives.algorithms import bus_factor
from commsim.collectives.group import GroupCost
from commsim.collectives.nccl.tables import (
    NET,
    NVLINK,
    NVLS_TREE,
    PCI,
    RING,
    SIMPLE,
    TREE,
    tables,
)
from commsim.spec_io import load_spec
from commsim.specs import ClusterSpec, SpecError
from commsim.topology.build import build_cluster
from commsim.topology.placement import place

MIB, GIB = 2.0**20, 2.0**30


def _topology(name: str, **node) -> ClusterSpec:
    spec = load_spec(ClusterSpec, catalog.topology_path(name))
    if node:
        spec = spec.model_copy(update={"node": spec.node.model_copy(update=node)})
    return spec


def _version(spec: ClusterSpec, version: str) -> ClusterSpec:
    return spec.model_copy(update={"nccl": spec.nccl.model_copy(update={"version": version})})


def _candidate(model: nccl.CommModel, op: str, name: str) -> nccl.Candidate:
    return next(c for c in model.candidates[op] if c.name == name)


def _choice(model: nccl.CommModel, op: str, sizes) -> list[str]:
    """NCCL's pick per size, by its own estimate."""
    lat, bw = model.terms(op, np.asarray(sizes, dtype=float))
    best = np.argmin(lat + np.asarray(sizes) / bw, axis=0)
    return [model.candidates[op][k].name for k in best]


def _busbw(spec: ClusterSpec, gpus: int, size: float, op: str = "all-reduce", **kw) -> float:
    """nccl-tests' busbw of the NCCL backend's time on the placed group (GB/s)."""
    c = build_cluster(spec, gpus)
    t = GroupCost(c, place(c, gpus, "blocked")).time(op, "nccl", size, **kw)[0]
    return float(size / t * bus_factor(op, gpus) / 1e9)


# --------------------------------------------------------------------- versions


def test_version_ranges_and_their_changes():
    # each range starts where tuning.cc changed (git show vX:src/graph/tuning.cc)
    assert tables("2.18.3").first == "2.18.3"
    assert tables("2.20").first == "2.19.3"  # 2.20 changed CollNet's all-gather only
    assert tables("2.22.3").first == "2.21.5"
    assert tables("v2.26.2-1").first == "2.25.1"
    assert tables("2.30.7+cuda12.8").first == "2.30.7"
    assert tables("2.32.6").first == "2.30.7"  # later releases take the newest tables
    with pytest.raises(ValueError, match="from 2.18.3 on"):
        tables("2.17.1")
    with pytest.raises(ValueError, match="not an NCCL version"):
        tables("latest")
    # Tree/Simple: base 0 and 4 / 6 / 14 us (2.18), 28 on every class (2.19-2.22),
    # base 8.4 and 4 / 4 / 14 (2.23+)
    tree = {v: (tables(v).base[TREE, SIMPLE], *tables(v).hw[:, TREE, SIMPLE]) for v in
            ("2.18", "2.21", "2.23", "2.30")}  # fmt: skip
    assert tree == {
        "2.18": (0, 4, 6, 14),
        "2.21": (0, 28, 28, 28),
        "2.23": (8.4, 4, 4, 14),
        "2.30": (8.4, 4, 4, 14),
    }
    # NVLSTree's network step: 19 (2.18), 14 (2.19-2.28), 20.9 (2.29+)
    nvls_tree = [tables(v).hw[NET, NVLS_TREE, SIMPLE] for v in ("2.18", "2.21", "2.28", "2.29")]
    assert nvls_tree == [19, 14, 14, 20.9]
    # the ring's per-step latencies never changed: 3.4 / 5.7 / 14 us on Simple
    for t in nccl.RANGES:
        assert list(t.hw[[NVLINK, PCI, NET], RING, SIMPLE]) == [3.4, 5.7, 14.0]


def test_the_spec_validates_the_version():
    from commsim.spec_io import parse_spec
    from commsim.specs import SpecError

    data = _topology("dgx-h100-ib").model_dump()
    data["nccl"]["version"] = "2.9"
    with pytest.raises(SpecError, match="nccl.version: .*from 2.18.3 on"):
        parse_spec(ClusterSpec, data, "c.yaml", units=False)  # a dump is in SI
    assert _topology("dgx-h100-ib").nccl.version == "2.30"


# --------------------------------------------------------------------- topology search


def test_channels_of_known_machines():
    h100 = _topology("dgx-h100-ib")
    one = nccl.comm_model(h100, 8, 1).graphs
    # one DGX H100: 6 ring channels of 60 GB/s doubled to 12 of 30, 24 on the communicator,
    # 16 NVLS channels ("24 coll channels, 16 nvls channels", NVIDIA/TensorRT-LLM#953);
    # NVLS: a channel per GPU at 40 GB/s inside, its bwInter raised to 60
    assert (one.ring.channels, one.ring.bw_intra, one.comm_channels) == (12, 30.0, 24)
    assert one.nvls_channels == 16 and (one.nvls.bw_intra, one.nvls.bw_inter) == (40.0, 60.0)
    # across DGX H100 nodes: 8 channels of 48 GB/s, one a 400 Gb/s NIC, 16 on the comm
    # (channel{Lo..Hi}={0..15} in NVIDIA/nccl#1752's log)
    many = nccl.comm_model(h100, 64, 8).graphs
    assert (many.ring.channels, many.ring.bw_inter, many.comm_channels) == (8, 48.0, 16)
    # DGX A100: 12 NVLinks of 20 GB/s: 6 channels of 40 doubled to 12 of 20
    a100 = nccl.comm_model(_topology("dgx-a100-ib"), 8, 1).graphs
    assert (a100.ring.channels, a100.ring.bw_intra) == (12, 20.0) and a100.nvls is None


def test_a_fitted_channel_bandwidth_replaces_the_search():
    spec = _topology("dgx-h100-ib")
    fitted = spec.model_copy(
        update={"nccl": spec.nccl.model_copy(update={"channel_bandwidth_inter": 40e9})}
    )
    g = nccl.comm_model(fitted, 64, 8).graphs
    assert g.ring.bw_inter == pytest.approx(40.0) and g.nvls.bw_inter == pytest.approx(40.0)
    assert nccl.comm_model(fitted, 8, 1).graphs.ring.bw_intra == 30.0  # one node: untouched


# --------------------------------------------------------------------- latency formulas


def test_ring_latency_by_hand():
    # NCCL 2.30, DGX H100 (Intel host), all-reduce Ring/Simple: 8.4 us base, 2(N-1) network
    # steps of 14 us, the other 2(n-1) - 2(N-1) steps max(3.4, 3 x 1 us net overhead)
    spec = _topology("dgx-h100-ib")
    for nodes, expect in ((2, 131.6), (16, 1190.0), (128, 9657.2)):
        ring = _candidate(nccl.comm_model(spec, 8 * nodes, nodes), "all-reduce", "Ring/Simple")
        assert ring.latency * 1e6 == pytest.approx(expect)
        assert ring.latency * 1e6 == pytest.approx(
            8.4 + (2 * (8 * nodes - 1) - 2 * (nodes - 1)) * 3.4 + 2 * (nodes - 1) * 14
        )
    # 2.18 counted 2N network steps: 152.8 us on 2 nodes
    old = nccl.comm_model(_version(spec, "2.18.3"), 16, 2)
    assert _candidate(old, "all-reduce", "Ring/Simple").latency * 1e6 == pytest.approx(152.8)
    # AMD hosts: 2 us overhead, x3 for Simple: a 6 us floor on the intra-node steps
    amd = nccl.comm_model(_topology("dgx-h100-ib", cpu="amd"), 16, 2)
    assert _candidate(amd, "all-reduce", "Ring/Simple").latency * 1e6 == pytest.approx(
        8.4 + 28 * 6.0 + 2 * 14
    )
    # Tree/Simple: 8.4 + 2 ((8-1) 4.0 + log2(2) 14) = 92.4 us
    tree = _candidate(nccl.comm_model(spec, 16, 2), "all-reduce", "Tree/Simple")
    assert tree.latency * 1e6 == pytest.approx(92.4)


def test_the_ring_plateau_multiplies_large_multi_node_all_reduces():
    m = nccl.comm_model(_topology("dgx-h100-ib"), 16, 2)
    lat, _ = m.terms("all-reduce", np.array([1024.0, GIB]))
    ring = [c.name for c in m.candidates["all-reduce"]].index("Ring/Simple")
    # 64 bytes a channel and rank: 16 channels x 16 ranks x 64 = 16 KiB
    assert lat[ring] * 1e6 == pytest.approx([131.6, 131.6 * 1.4])


def test_pat_at_one_gpu_a_node():
    # all-gather on 1,024 ranks, one a node: Ring 14,330 us of latency, PAT
    # 8 + log2(1024) 14 / 3.5 + 2.8 x 1024 = 2,915 us (2.23+); none with 8 GPUs a node
    spec = _topology("dgx-h100-ib")
    m = nccl.comm_model(spec, 1024, 1024)
    assert _candidate(m, "all-gather", "Ring/Simple").latency * 1e6 == pytest.approx(14330.4)
    assert _candidate(m, "all-gather", "PAT/Simple").latency * 1e6 == pytest.approx(2915.2)
    assert "PAT/Simple" not in [
        c.name for c in nccl.comm_model(spec, 64, 8).candidates["all-gather"]
    ]
    old = nccl.comm_model(_version(spec, "2.22"), 1024, 1024)
    assert "PAT/Simple" not in [c.name for c in old.candidates["all-gather"]]


def test_small_message_nvls_tree_latency_against_a_measurement():
    # 2 nodes x 8 H20, NVLSTree forced, NCCL 2.21.5: about 46-47 us a small all-reduce
    # (NVIDIA/nccl#1244). 2.21's model: 25 us on NVLink + 2 log2(2) x 14 us = 53 us
    m = nccl.comm_model(_version(_topology("dgx-h100-ib"), "2.21.5"), 16, 2)
    measured = 46.5e-6
    assert _candidate(m, "all-reduce", "NVLSTree/Simple").latency == pytest.approx(53e-6)
    assert _candidate(m, "all-reduce", "NVLSTree/Simple").latency / measured < 1.15


# --------------------------------------------------------------------- selection


def test_two_dgx_h100_nodes_pick_tree_then_nvls_tree():
    # NCCL 2.30 on 2 x 8 H100 (research notes section 1.8, from the formulas): Tree/LL
    # below 256 KiB, Tree/LL128 to 4 MiB, NVLSTree from 4 MiB
    m = nccl.comm_model(_topology("dgx-h100-ib"), 16, 2)
    sizes = [8, 128 * 1024, 256 * 1024, 2 * MIB, 4 * MIB, GIB]
    assert _choice(m, "all-reduce", sizes) == [
        "Tree/LL", "Tree/LL", "Tree/LL128", "Tree/LL128", "NVLSTree/Simple", "NVLSTree/Simple",
    ]  # fmt: skip
    # without NVLink SHARP (A100-like nodes) the large sizes go to Ring
    no_nvls = nccl.comm_model(_topology("dgx-h100-ib", nvls=False), 16, 2)
    assert _choice(no_nvls, "all-reduce", [GIB]) == ["Ring/Simple"]


def test_64_h200_nodes_move_from_tree_ll128_to_nvls_tree():
    # NVIDIA/nccl#1752, 64 hosts x 8 H200: "16777216 Bytes -> Algo TREE proto LL128",
    # "33554432 Bytes -> Algo NVLS_TREE proto SIMPLE", both on channels 0..15. The model
    # agrees below 16 MiB and from 64 MiB; at 32 MiB it is a near-tie (Tree/LL128 455 us,
    # NVLSTree 460 us) that it gives to the tree
    spec = _topology("dgx-h100-ib", gpu="h200")
    m = nccl.comm_model(spec, 512, 64)
    assert _choice(m, "all-reduce", [16 * MIB, 32 * MIB, 64 * MIB]) == [
        "Tree/LL128", "Tree/LL128", "NVLSTree/Simple",
    ]  # fmt: skip
    lat, bw = m.terms("all-reduce", np.array([32 * MIB]))
    cands = m.candidates["all-reduce"]
    times = {c.name: float(lat[k, 0] + 32 * MIB / bw[k, 0]) for k, c in enumerate(cands)}
    assert times["NVLSTree/Simple"] / times["Tree/LL128"] == pytest.approx(1.01, abs=0.01)
    c = build_cluster(spec, 512)
    detail = GroupCost(c, place(c, 512, "blocked")).nccl_detail(
        "all-reduce", "nccl", [16 * MIB, 64 * MIB]
    )
    assert detail["channels"] == [16, 16]


def test_explicit_ring_and_tree_let_nccl_pick_the_protocol():
    spec = _topology("dgx-h100-ib")
    c = build_cluster(spec, 64)
    cost = GroupCost(c, place(c, 64, "blocked"))
    sizes = np.array([8.0, 4 * MIB, GIB])
    assert cost.time_and_choice("all-reduce", "ring", sizes)[1] == ["ring"] * 3
    ring = cost.nccl_detail("all-reduce", "ring", sizes)
    assert ring["nccl_algorithm"] == ["Ring"] * 3 and ring["protocol"] == ["LL", "LL128", "Simple"]
    tree = cost.nccl_detail("all-reduce", "tree", sizes)
    assert set(tree["nccl_algorithm"]) == {"Tree"}
    # NCCL's choice is never slower than its Ring or Tree alone (uncongested fabric)
    best = cost.time("all-reduce", "nccl", sizes)
    alone = [cost.time("all-reduce", a, sizes) for a in ("ring", "tree")]
    assert np.all(best <= np.minimum(*alone) * (1 + 1e-12))
    # commsim's algorithms NCCL lacks keep their graph schedules; tree needs no whole nodes
    assert cost.nccl_detail("all-reduce", "rhd", sizes) is None
    assert "tree" in GroupCost(c, place(c, 12, "blocked")).algorithms("all-reduce")


# --------------------------------------------------------------------- measurements


def test_one_node_bus_bandwidth_against_nccl_tests():
    # 8x H100: Ring about 370 GB/s busbw, NVLS about 480 (sjeaugey, NVIDIA/nccl-tests#212:
    # "~370GB/s ... with NCCL_ALGO=RING", "a peak busBw of ~480GB/s"; 476 GB/s measured in
    # NVIDIA/nccl-tests#290, 475 GB/s on 8x H200 with NCCL 2.20.3 in NVIDIA/nccl-tests#272)
    h100 = _topology("dgx-h100-ib")
    assert _busbw(h100, 8, 8 * GIB) == pytest.approx(480, rel=0.02)
    ring = _topology("dgx-h100-ib", nvls=False)
    assert _busbw(ring, 8, 8 * GIB) == pytest.approx(370, rel=0.03)
    # 8x A100 over NVLink: about 230 GB/s (the figure); NCCL's model says 240
    assert _busbw(_topology("dgx-a100-ib"), 8, 8 * GIB) == pytest.approx(230, rel=0.05)


def test_three_a100_nodes_on_four_hdr_nics_against_nccl_tests():
    # NVIDIA/nccl-tests#119: 3 servers of 8x A100 SXM4 40GB, 4x HDR 200 Gb/s, 2x Xeon 8358:
    # all_reduce_perf to 128 MiB, "average ... about 84.8GB/s and peak ... about 96GB/s".
    # NCCL's search: 4 channels of 24 GB/s (PCIe Gen4 under the 25 GB/s NIC): busBw 96
    spec = _topology("dgx-a100-ib", gpu="a100-40gb", cpu="intel")
    spec = spec.model_copy(
        update={"node": spec.node.model_copy(update={"nics": spec.node.nics.model_copy(
            update={"count": 4})})}
    )  # fmt: skip
    assert nccl.comm_model(spec, 24, 3).graphs.ring.channels == 4
    peak = _busbw(spec, 24, 128 * MIB)
    assert peak == pytest.approx(96, rel=0.1)
    assert _busbw(spec, 24, 16 * GIB) == pytest.approx(96, rel=0.02)  # the model's asymptote


# --------------------------------------------------------------------- on the graph


def test_closed_form_and_graph_agree_on_an_uncongested_fabric():
    # NCCL's own estimate (its latency + bytes / its bandwidth) is what the NCCL backend
    # charges wherever the graph gives the group at least NCCL's bandwidth: one node, and a
    # non-blocking rail-optimised fabric with a blocked placement
    spec = _topology("dgx-h100-ib")
    sizes = 2.0 ** np.arange(3, 34, 3)
    for gpus in (8, 16, 64, 512):
        c = build_cluster(spec, gpus)
        cost = GroupCost(c, place(c, gpus, "blocked"))
        for op in ("all-reduce", "all-gather", "reduce-scatter", "broadcast"):
            d = cost.nccl_detail(op, "nccl", sizes)
            assert cost.time(op, "nccl", sizes) == pytest.approx(d["nccl_time_s"], rel=1e-12)
            assert all(
                g >= n for g, n in zip(d["graph_algbw_Bps"], d["nccl_algbw_Bps"], strict=True)
            )


def test_the_graph_caps_what_the_fabric_cannot_give():
    # 8 DGX A100 nodes, non-blocking. Blocked, the graph's ring (a channel on each of the
    # 8 NIC rails) gives more than NCCL's 8 channels of 24 GB/s: NCCL's bandwidth prices.
    # Interleaved (rank i on node i mod 8), commsim's ring crosses nodes on every edge, one
    # NIC a GPU: the graph's share caps NCCL's bandwidth, and NCCL's latency stays
    spec = _topology("dgx-a100-ib")
    c = build_cluster(spec, 64)
    blocked = GroupCost(c, place(c, 64, "blocked"))
    interleaved = GroupCost(c, place(c, 64, "interleaved"))
    big = np.array([GIB])
    d_b = blocked.nccl_detail("all-reduce", "ring", big)
    d_i = interleaved.nccl_detail("all-reduce", "ring", big)
    assert d_i["graph_algbw_Bps"][0] < d_i["nccl_algbw_Bps"][0] < d_b["graph_algbw_Bps"][0]
    slow = interleaved.time("all-reduce", "ring", big)[0]
    assert slow > GIB / d_i["graph_algbw_Bps"][0]
    assert slow == pytest.approx(
        d_i["nccl_time_s"][0] - GIB / d_i["nccl_algbw_Bps"][0] + GIB / d_i["graph_algbw_Bps"][0]
    )
    assert slow > 5 * blocked.time("all-reduce", "ring", big)[0]
    tiny = np.array([8.0])  # latency-bound: NCCL's latency whatever the placement
    assert interleaved.time("all-reduce", "nccl", tiny) == blocked.time("all-reduce", "nccl", tiny)
    # 3:1 oversubscribed rack uplinks with ECMP hashing: even a blocked ring is capped
    roce = build_cluster(_topology("roce-3tier-3to1"), 64)
    d = GroupCost(roce, place(roce, 64, "blocked")).nccl_detail("all-reduce", "ring", big)
    assert d["graph_algbw_Bps"][0] < d["nccl_algbw_Bps"][0] / 3


def test_groups_sharing_links_share_bandwidth():
    # two interleaved groups on 3:1 uplinks run at once: they share the uplinks
    spec = _topology("roce-3tier-3to1")
    c = build_cluster(spec, 128)
    order = place(c, 128, "interleaved")
    one = GroupCost(c, order[:64])
    two = GroupCost(c, np.stack([order[:64], order[64:]]))
    big = np.array([GIB])
    assert two.time("all-reduce", "ring", big)[0] > one.time("all-reduce", "ring", big)[0]


def test_backend_defaults_and_what_is_affine():
    assert _topology("dgx-h100-ib").comm_backend == "nccl"
    from conftest import make_spec

    cpu = make_spec().model_copy(
        update={"backend": None, "node": make_spec().node.model_copy(update={"gpu": "cpu-host"})}
    )
    assert cpu.comm_backend == "gloo"
    c = build_cluster(_topology("dgx-h100-ib"), 16)
    cost = GroupCost(c, place(c, 16, "blocked"))
    assert not cost.is_affine("all-reduce", "ring") and not cost.is_affine("all-reduce", "auto")
    assert cost.is_affine("all-reduce", "rhd") and cost.is_affine("all-to-all", "direct")
    gloo = GroupCost(c, place(c, 16, "blocked"), backend="gloo")
    assert gloo.is_affine("all-reduce", "ring") and not gloo.is_affine("all-reduce", "tree")
    with pytest.raises(SpecError, match="cpu-host has no compute_capability"):
        nccl.comm_model(cpu, 8, 2)


def test_everywhere_the_backend_and_version_reach_the_step():
    # predict / plan / the what-if API price the step's collectives with NCCL's model of
    # the cluster's version; gloo prices commsim's schedules on the graph
    from commsim import whatif

    base = whatif.load(changes={"cluster": "dgx-h100-ib", "gpus": 64, "global_batch": 512})
    step = {
        v: whatif.metric(whatif.predict(whatif.change(base, {"cluster.nccl.version": v})), "comm_s")
        for v in ("2.18", "2.30")
    }
    gloo = whatif.metric(whatif.predict(whatif.change(base, {"cluster.backend": "gloo"})), "comm_s")
    assert step["2.18"] != step["2.30"] and gloo not in step.values()
