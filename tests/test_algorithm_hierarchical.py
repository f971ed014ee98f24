"""Hierarchical (rings inside nodes, rings per rail across them): two-tier closed form by
hand, bytes and the rail rings of the schedule."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.collectives.algorithms import build_schedule
from commsim.collectives.algorithms.base import traffic
from commsim.collectives.evaluate import collective_time, hierarchical_time

pytestmark = pytest.mark.filterwarnings("error")

S = 2.0**20


def test_hierarchical_by_hand():
    ia, ib, oa, ob = 1e-6, 100e9, 5e-6, 10e9
    # 2 nodes x 4 GPUs: intra RS and AG (3 steps of S/4 each), inter ring AR per rail on
    # S/4 over 2 nodes (2 steps of S/8)
    got = hierarchical_time("all-reduce", 2, 4, S, ia, ib, oa, ob)
    assert got == pytest.approx(2 * 3 * (ia + S / 4 / ib) + 2 * (oa + S / 8 / ob), rel=1e-12)
    rs = hierarchical_time("reduce-scatter", 2, 4, S, ia, ib, oa, ob)
    assert rs == pytest.approx(3 * (ia + S / 4 / ib) + (oa + S / 8 / ob), rel=1e-12)
    ag = hierarchical_time("all-gather", 2, 4, S, ia, ib, oa, ob)
    assert ag == pytest.approx(rs, rel=1e-12)
    # every phase is a ring, one peer per step: per-message overheads never show
    heavy = hierarchical_time(
        "all-reduce", 2, 4, S, ia, ib, oa, ob, intra_overhead=9 * ia, inter_overhead=9 * oa
    )
    assert heavy == got
    # one node: just the intra-node rings; one GPU per node: just the inter-node ring
    assert hierarchical_time("all-reduce", 1, 4, S, ia, ib, oa, ob) == pytest.approx(
        2 * 3 * (ia + S / 4 / ib)
    )
    assert hierarchical_time("all-reduce", 4, 1, S, ia, ib, oa, ob) == pytest.approx(
        float(collective_time("all-reduce", "ring", 4, S, oa, ob))
    )


def test_hierarchical_bytes():
    n, g = 12, 4  # 3 nodes of 4
    m = n // g
    expected = 2 * (g - 1) / g * S + 2 * (m - 1) / m * S / g
    sent = traffic(build_schedule("all-reduce", "hierarchical", n, S, gpus_per_node=g), n)[0]
    assert sent == pytest.approx(np.full(n, expected))
    steps = build_schedule("all-reduce", "hierarchical", n, S, gpus_per_node=g)
    inter = steps[1]  # the rail rings: same local index, next node
    assert np.all(inter.src % g == inter.dst % g) and np.all(inter.src // g != inter.dst // g)
