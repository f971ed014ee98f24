"""Failure rates, blast radius and a job's mean time to interruption; checkpoint intervals.

The defaults must give back the Llama 3 table they were fitted to, a 16,384-GPU job must be
interrupted about every 3 hours, the blast radius read off the structure tables must be what
the graph itself says, and Young's and Daly's intervals must come out as published."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
from conftest import make_cluster, make_spec

from commsim import catalog
from commsim.reliability import checkpoint as ck
from commsim.reliability.blast import blast_radius, exposures, fabric_parts
from commsim.reliability.interruptions import job_interruptions
from commsim.reliability.rates import (
    DEFAULT_RATES_PER_HOUR,
    LLAMA3_CAUSES,
    LLAMA3_HOURS,
    rates_for,
)
from commsim.spec_io import load_spec, parse_spec
from commsim.specs import ClusterSpec, SpecError
from commsim.topology.build import build_cluster

LLAMA3_MTTI_H = LLAMA3_HOURS / 419  # 3.09 h


def _dgx_h100(nodes: int | None = None) -> ClusterSpec:
    spec = load_spec(ClusterSpec, catalog.topology_path("dgx-h100-ib"))
    return spec.model_copy(update={"nodes": max(spec.nodes, nodes or 0)})


def test_the_llama3_table_adds_up_to_419():
    assert sum(n for _, n in LLAMA3_CAUSES.values()) == 419
    assert LLAMA3_HOURS == 1296


def test_default_rates_give_back_llama3_on_its_own_topology():
    # Llama 3's cluster: 2,048 hosts of 8 GPUs and 8 NICs, two hosts (16 GPUs) per ToR;
    # over the 54-day snapshot the defaults must expect its 419 interruptions
    spec = make_spec(nodes=2048, nics=8, nodes_per_leaf=2, tiers=3, leaves_per_pod=192)
    cluster = build_cluster(spec)
    inter = job_interruptions(cluster, 16384, rates_for(spec))
    expected = inter.rate * LLAMA3_HOURS * 3600
    assert expected == pytest.approx(419, rel=1e-9)
    by = {k: v * LLAMA3_HOURS * 3600 for k, v in inter.by_class.items()}
    assert by["gpu"] == pytest.approx(148 + 19 + 17 + 6 + 6)
    assert by["hbm"] == pytest.approx(72)
    assert by["host"] == pytest.approx(32 + 3 + 3 + 2 + 2 + 2 + 2)
    assert by["switch"] + by["cable"] == pytest.approx(35)  # ToRs and NIC cables
    assert inter.mtti_s / 3600 == pytest.approx(LLAMA3_MTTI_H)


def test_16k_gpus_are_interrupted_about_every_3_hours():
    spec = _dgx_h100()
    inter = job_interruptions(build_cluster(spec, 16384), 16384, rates_for(spec))
    assert inter.mtti_s / 3600 == pytest.approx(LLAMA3_MTTI_H, rel=0.05)  # 3.12 h
    assert inter.degrade_rate > 0  # spine links and spines only degrade this fabric


def test_mtti_falls_as_one_over_the_gpus():
    spec = _dgx_h100()
    mtti = {
        n: job_interruptions(build_cluster(spec, n), n, rates_for(spec)).mtti_s
        for n in (1024, 4096, 16384)
    }
    assert mtti[1024] / mtti[16384] == pytest.approx(16, rel=0.02)
    assert mtti[4096] / mtti[16384] == pytest.approx(4, rel=0.02)


def test_cluster_yaml_overrides_rates_repair_and_storage():
    spec = _dgx_h100().model_copy(
        update={
            "reliability": parse_spec(
                ClusterSpec.model_fields["reliability"].annotation.__args__[0],
                {
                    "rates": {"gpu": 1e-5, "switch": 0},
                    "repair_time": "48h",
                    "storage_write_bandwidth": "500GB/s",
                },
                "x",
            )
        }
    )
    r = rates_for(spec)
    assert r.per_unit_s["gpu"] == pytest.approx(1e-5 / 3600)
    assert r.per_unit_s["switch"] == 0.0
    assert r.per_unit_s["hbm"] == pytest.approx(DEFAULT_RATES_PER_HOUR["hbm"] / 3600)
    assert r.repair_s == 48 * 3600 and r.write_Bps == 5e11
    data = _dgx_h100().model_dump(mode="json") | {"reliability": {"rates": {"gpu": -1}}}
    with pytest.raises(SpecError, match="reliability.rates.gpu"):
        parse_spec(ClusterSpec, data, "c.yaml")
    data["reliability"] = {"rates": {"tpu": 1e-6}}
    with pytest.raises(SpecError, match="reliability.rates"):
        parse_spec(ClusterSpec, data, "c.yaml")


def _card_components(cluster, drop_edges: set[int], drop_vertex: str | None) -> dict[str, int]:
    """Each NIC card's connected component in the network graph (NICs and switches, no GPUs
    or hubs) without the dropped edges or switch."""
    g = nx.Graph()
    for i, name in enumerate(cluster.names):
        u, v = name.split("->")
        if u.startswith(("gpu", "hub")) or v.startswith(("gpu", "hub")) or i in drop_edges:
            continue
        if drop_vertex not in (u, v):
            g.add_edge(u, v)
    cards = cluster.nics_per_node // cluster.ports_per_nic  # a NIC vertex is a card
    g.add_nodes_from(f"nic{k}.{r}" for k in range(cluster.n_nodes) for r in range(cards))
    return {x: n for n, comp in enumerate(nx.connected_components(g)) for x in comp}


def _graph_down(cluster, part, index) -> set[int]:
    """Independent blast radius: remove the part from the network graph; of the NIC cards
    that reached each other before (one fabric, or one plane of a multi-plane fabric), those
    outside the largest group that still does are cut off, and their nodes are down."""
    drop_vertex = f"{part}{index}" if part in ("leaf", "spine", "core") else None
    drop_edges = set() if drop_vertex else set(blast_radius(cluster, part, index).edges.tolist())
    before = _card_components(cluster, set(), None)
    after = _card_components(cluster, drop_edges, drop_vertex)
    groups: dict[int, dict[int, list[str]]] = {}
    for card in (x for x in before if x.startswith("nic")):
        groups.setdefault(before[card], {}).setdefault(after[card], []).append(card)
    down = set()
    for pieces in groups.values():
        largest = max(pieces.values(), key=len)
        cut = [c for piece in pieces.values() if piece is not largest for c in piece]
        down |= {int(c[3:].split(".")[0]) for c in cut}
    return down


FABRICS = {
    "2-tier": dict(nodes=8, nics=2, nodes_per_leaf=2),
    "2-tier rail": dict(nodes=8, nics=2, nodes_per_leaf=4, rail_optimized=True),
    "3-tier": dict(nodes=16, nics=1, nodes_per_leaf=2, tiers=3, leaves_per_pod=2),
    "one spine": dict(
        nodes=12, nics=1, nodes_per_leaf=2, tiers=3, leaves_per_pod=2, uplinks_per_leaf=1
    ),
    # Alibaba HPN's shape: rail-optimised, each NIC's two ports to two ToRs in two planes
    "dual-ToR": dict(nodes=8, nics=2, nodes_per_leaf=4, rail_optimized=True, nic_ports=2, planes=2),
    "multi-plane": dict(nodes=8, nics=2, nodes_per_leaf=4, rail_optimized=True, planes=2),
}


@pytest.mark.parametrize("name", FABRICS)
def test_blast_radius_is_what_the_graph_says(name):
    cluster = make_cluster(None, gpus_per_node=2, **FABRICS[name])
    kinds = set()
    for part, _, indices in fabric_parts(cluster):
        for index in indices:
            blast = blast_radius(cluster, part, index)
            down = _graph_down(cluster, part, index)
            assert set(blast.nodes.tolist()) == down, (part, index)
            kinds.add((part, blast.interrupts))
    if name == "dual-ToR":  # no single ToR or port cable stops a node: the other port runs
        assert ("leaf", False) in kinds and ("nic cable", False) in kinds
        assert not any(interrupts for _, interrupts in kinds)
        return
    assert ("leaf", True) in kinds and ("nic cable", True) in kinds
    if name == "one spine":  # a pod's only spine or a leaf's only uplink cuts nodes off
        assert ("spine", True) in kinds and ("leaf uplink", True) in kinds
    else:
        assert ("spine", False) in kinds and ("leaf uplink", False) in kinds


def test_blast_radius_by_hand():
    rail = make_cluster(
        None, gpus_per_node=2, nodes=8, nics=2, nodes_per_leaf=4, rail_optimized=True
    )
    # rail-optimised: leaf 1 is rail 1 of scalable unit 0: one NIC of each of nodes 0-3
    assert blast_radius(rail, "leaf", 1).nodes.tolist() == [0, 1, 2, 3]
    assert blast_radius(rail, "nic cable", 5).nodes.tolist() == [2]
    spine = blast_radius(rail, "spine", 0)
    assert not spine.interrupts and spine.edges.size == 2 * 4  # 4 leaves, both directions
    one = make_cluster(None, gpus_per_node=2, nodes=8, nics=1, nodes_per_leaf=2, uplinks_per_leaf=1)
    assert blast_radius(one, "leaf uplink", (1, 0)).nodes.tolist() == [2, 3]


def test_exposure_counts_by_hand():
    # 4 nodes of 8 GPUs, 2 NICs each, 2 nodes per leaf, 2-tier: 2 leaves, uplinks = ports
    cluster = make_cluster(32, nodes=4, nics=2, nodes_per_leaf=2)
    parts = {e.part: e for e in exposures(cluster, 32)}
    assert parts["gpu"].units == 32 and parts["host"].units == 4 and parts["nic"].units == 8
    assert parts["leaf"].units == 2 and parts["leaf"].nodes_out == 2
    assert parts["nic cable"].interrupting == 8
    assert parts["leaf uplink"].units == 2 * 4 and parts["leaf uplink"].interrupting == 0
    assert parts["spine"].interrupting == 0
    # the same with dual-port NICs, each port to its own ToR (HPN): 8 cards of 16 ports
    dual = make_cluster(32, nodes=4, nics=2, nodes_per_leaf=2, nic_ports=2, planes=2)
    parts = {e.part: e for e in exposures(dual, 32)}
    assert parts["nic"].units == 8 and parts["nic cable"].units == 16
    assert parts["nic cable"].interrupting == 0 and parts["leaf"].interrupting == 0
    single = {e.part for e in exposures(make_cluster(8, nodes=4), 8)}
    assert "leaf" not in single  # one node never touches the fabric


# Daly 2006, Figs. 3-5: restart R = 10 min, dump delta = 5 min; M = 24 h, 6 h, 15 min
DALY_CASES = [(24 * 60, 117), (6 * 60, 57), (15, 9.1)]


@pytest.mark.parametrize(("mtbf", "published"), DALY_CASES)
def test_daly_worked_cases(mtbf, published):
    tau = ck.daly_interval(5.0, mtbf)  # minutes in, minutes out
    assert tau == pytest.approx(published, abs=0.5 if published > 10 else 0.05)
    # the model's own optimum (a numerical search, independent of the perturbation series)
    optimum = ck.optimal_interval(5.0, 0.0, mtbf, [(1.0, 10.0)])
    assert optimum == pytest.approx(tau, rel=0.01)


def test_young_by_hand():
    assert ck.young_interval(5.0, 1440.0) == pytest.approx(120.0)  # sqrt(2 x 5 x 1440)
    assert ck.young_interval(30.0, 3 * 3600.0) == pytest.approx(math.sqrt(2 * 30 * 10800))
    assert ck.daly_interval(50.0, 20.0) == 20.0  # delta >= 2M: checkpoint every M
    # Young is Daly's first term: they agree when delta << M
    assert ck.daly_interval(1.0, 1e6) / ck.young_interval(1.0, 1e6) == pytest.approx(1, abs=1e-3)


def test_commit_time_is_dalys_complete_model():
    m, r, delta, tau = 6 * 60.0, 10.0, 5.0, 57.0
    daly = m * math.exp(r / m) * (math.exp((tau + delta) / m) - 1)  # per segment of tau
    assert ck.commit_time(tau, delta, 0.0, m, [(1.0, r)]) == pytest.approx(daly)
    # two restart classes of the same length are one class
    two = ck.commit_time(tau, delta, 0.0, m, [(0.3, r), (0.7, r)])
    assert two == pytest.approx(daly)
    # an asynchronous save's lag costs like a restart of the same length
    assert ck.commit_time(tau, delta, 4.0, m, [(1.0, r)]) == pytest.approx(
        ck.commit_time(tau, delta, 0.0, m, [(1.0, r + 4.0)])
    )
    assert np.isclose(ck.goodput(tau, delta, 0.0, 1e12, [(1.0, r)]), tau / (tau + delta))


def test_failures_too_frequent_for_any_restart_give_no_progress_not_an_error():
    # MTBF 1 ms against a 60 s restart: e^(-R/M) underflows to 0 and e^(L/M) past the largest
    # float; the expected time per checkpoint is infinite and goodput 0 (was ZeroDivisionError)
    restarts = [(1.0, 60.0)]
    assert ck.restart_factor(1e-3, restarts) == math.inf
    assert ck.commit_time(600.0, 5.0, 0.0, 1e-3, restarts) == math.inf
    assert ck.goodput(600.0, 5.0, 0.0, 1e-3, restarts) == 0.0
    # an ordinary case is unchanged: Q = M / e^(-R/M), E = Q (e^(L/M) - 1) by hand
    m, r, tau = 3600.0, 60.0, 600.0
    by_hand = m / math.exp(-r / m) * math.expm1((tau + 5.0) / m)
    assert ck.commit_time(tau, 5.0, 0.0, m, restarts) == pytest.approx(by_hand, rel=1e-15)
