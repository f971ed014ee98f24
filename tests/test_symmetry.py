"""Solving once per orbit (topology.symmetry) gives exactly what the whole graph gives."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim.collectives.group import GroupCost
from commsim.step.groups import Groups
from commsim.topology import symmetry
from commsim.topology.placement import place
from commsim.topology.routing import maxmin_rates, routes

FABRICS = {
    "2-tier": dict(nodes=16, gpus_per_node=4, nics=2, nodes_per_leaf=2),
    "3-tier": dict(nodes=32, gpus_per_node=4, nics=4, nodes_per_leaf=2, tiers=3, leaves_per_pod=4),
    "3-tier 3:1": dict(
        nodes=32, gpus_per_node=2, nics=2, nodes_per_leaf=4, tiers=3, leaves_per_pod=2,
        oversubscription=(3.0, 2.0),
    ),
    "rail-optimised": dict(
        nodes=32, gpus_per_node=4, nics=4, nodes_per_leaf=4, tiers=3, leaves_per_pod=8,
        rail_optimized=True,
    ),
    "adaptive": dict(
        nodes=32, gpus_per_node=4, nics=4, nodes_per_leaf=2, tiers=3, leaves_per_pod=4,
        routing="adaptive",
    ),
    "8 planes": dict(nodes=16, gpus_per_node=8, nics=8, nodes_per_leaf=4, planes=8),
    "dual-plane dual-port": dict(
        nodes=16, gpus_per_node=4, nics=4, nodes_per_leaf=4, planes=2, nic_ports=2,
        rail_optimized=True,
    ),
}  # fmt: skip


@pytest.fixture
def counted(monkeypatch):
    """Symmetry on every step, however small; counts the steps it reduced."""
    monkeypatch.setattr(symmetry, "MIN_FLOWS", 0)
    seen = {"reduced": 0, "steps": 0}
    reduce = symmetry.reduce

    def spy(*args):
        out = reduce(*args)
        seen["steps"] += 1
        seen["reduced"] += out is not None and out.reps.size < args[1].size
        return out

    monkeypatch.setattr(symmetry, "reduce", spy)
    return seen


def _both(kw: dict, price) -> tuple[float, float]:
    """price(cluster) with symmetry, then on a fresh cluster without."""
    fast, whole = make_cluster(**kw), make_cluster(**kw)
    whole.symmetry = False
    return price(fast), price(whole)


@pytest.mark.parametrize("fabric", FABRICS)
@pytest.mark.parametrize("algorithm", ["ring", "hierarchical", "rhd", "tree"])
def test_collectives_equal_the_whole_graph(fabric, algorithm, counted):
    kw = FABRICS[fabric]

    def price(c):
        cost = GroupCost(c, place(c, c.n_gpus, "blocked"))
        return cost.time("all-reduce", algorithm, np.array([1e3, 2.0**20, 2.0**28]))

    fast, whole = _both(kw, price)
    assert fast == pytest.approx(whole, rel=1e-9, abs=0)
    assert counted["reduced"] > 0 or algorithm == "tree"  # a binary tree is not shift-invariant


@pytest.mark.parametrize("fabric", ["3-tier", "8 planes", "adaptive"])
@pytest.mark.parametrize("kind", ["dp", "cp", "tp"])
def test_hybrid_groups_equal_the_whole_graph(fabric, kind, counted):
    kw = FABRICS[fabric]

    def price(c):
        groups = Groups(c, c.n_gpus)
        key = (0, kind, 2, c.n_gpus // 8, 2, 1, 1, 2)  # tp 2, cp 2, pp 2
        return np.concatenate(
            [groups.time(op, "ring", np.array([2.0**20, 2.0**27]), *key) for op in
             ("all-reduce", "all-gather", "reduce-scatter")]
        )  # fmt: skip

    fast, whole = _both(kw, price)
    assert fast == pytest.approx(whole, rel=1e-9, abs=0)


def test_all_to_all_equals_the_whole_graph(counted):
    def price(c):
        return GroupCost(c, place(c, c.n_gpus, "blocked")).time("all-to-all", "direct", 2.0**24)

    fast, whole = _both(FABRICS["3-tier"], price)
    assert fast == pytest.approx(whole, rel=1e-9)
    assert counted["reduced"] > 0


def test_hashed_routes_keep_only_what_the_check_proves(counted):
    kw = dict(FABRICS["3-tier"], routing="hash")

    def price(c):
        return GroupCost(c, place(c, c.n_gpus, "blocked")).time("all-reduce", "ring", 2.0**26)

    fast, whole = _both(kw, price)
    assert fast == pytest.approx(whole, rel=1e-12)
    assert counted["steps"] > 0


def test_weighted_maxmin_is_the_quotient():
    # two identical flows on link 0 (capacity 1), one of them also on link 1 (capacity 3):
    # whole: 1/2 each; quotient: one flow standing for two on link 0
    whole = maxmin_rates(np.array([[0, -1], [0, -1]]), np.array([1.0, 3.0]))
    quotient = maxmin_rates(np.array([[0]]), np.array([1.0]), np.array([[2.0]]))
    assert whole == pytest.approx([0.5, 0.5]) and quotient == pytest.approx([0.5])


def test_orbits_of_a_pod_shift():
    # a ring over 4 pods of one 3-tier fabric: shifting by a pod maps the ring onto itself
    c = make_cluster(nodes=16, gpus_per_node=1, nodes_per_leaf=1, tiers=3, leaves_per_pod=4)
    src = np.arange(16)
    dst = np.roll(src, -1)
    paths, _ = routes(c, src, dst)
    r = symmetry.reduce(c, src, dst, np.full(16, -1), np.ones(16), paths)
    assert r is not None and r.reps.size == 4  # one pod's four flows stand for all
    assert np.bincount(r.orbit).tolist() == [4, 4, 4, 4]


def test_link_map_by_hand():
    cap = np.ones(9)
    # link 0 carried onto links 1 and 2 at once: no permutation
    assert (
        symmetry._link_map(np.array([[0, 5], [0, 6]]), np.array([[1, 7], [2, 8]]), [0, 5, 6], cap)
        is None
    )
    sigma = symmetry._link_map(
        np.array([[0, 5], [3, -1]]), np.array([[1, 7], [2, -1]]), [0, 3, 5], cap
    )
    assert sigma[[0, 3, 5]].tolist() == [1, 2, 7]
    # a route of another length has no image
    assert symmetry._link_map(np.array([[0, 5]]), np.array([[1, -1]]), [0, 5], cap) is None


def test_a_conflict_on_some_routes_refutes_all():
    # reduce refuses a move on a block of the flows before all of them: sound only if a
    # block's refusal is the whole step's (checked on hashed routes, where most moves fail)
    c = make_cluster(**dict(FABRICS["3-tier"], routing="hash"))
    src = np.arange(c.n_gpus)
    dst, rail = np.roll(src, -1), np.full(src.size, -1)
    paths, _ = routes(c, src, dst, rail)
    used = symmetry._used(paths, c.capacity.size)
    refused = 0
    for _, move in symmetry._moves(c):
        image, moved_dst, _ = move(src, dst, rail)  # flow i starts at GPU i: its image's index
        if (moved_dst != dst[image]).any():
            continue  # not onto the step's flows (a NIC turn of a ring): no link map asked
        whole = symmetry._link_map(paths, paths[image], used, c.capacity)
        for block in (slice(0, src.size // 4), slice(0, src.size // 16)):
            part = paths[block]
            mine = symmetry._used(part, c.capacity.size)
            if symmetry._link_map(part, paths[image[block]], mine, c.capacity) is None:
                refused += 1
                assert whole is None
    assert refused > 0
