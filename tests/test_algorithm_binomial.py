"""gloo's binomial broadcast: its tree, and its time on a one-switch network by hand."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_cluster

from commsim.collectives.algorithms import build_schedule
from commsim.collectives.evaluate import collective_time, evaluate

pytestmark = pytest.mark.filterwarnings("error")


def test_binomial_broadcast_is_gloos_tree():
    steps = build_schedule("broadcast", "binomial", 8, 100.0)
    pairs = [sorted(zip(s.src.tolist(), s.dst.tolist(), strict=True)) for s in steps]
    assert pairs == [[(0, 1), (0, 2), (0, 4)], [(1, 3), (1, 5), (2, 6)], [(3, 7)]]
    # the root's three sends share its link: 3 S/B, then 2 S/B, then S/B, plus 3 alphas
    # and the overheads of extra peers (alpha_with_fanin: (k-1) alpha/2 per step)
    cluster = make_cluster(nodes=8, gpus_per_node=1, nodes_per_leaf=8)
    lat = 2e-6 + 400e-9  # NIC, then cable + switch + cable
    s, bw = 1e6, 100e9 / 8
    expect = (3 + 2 + 1) * s / bw + 3 * lat + (2 + 1 + 0) * 1e-6
    steps = build_schedule("broadcast", "binomial", 8, s)
    assert evaluate(steps, cluster, np.arange(8)) == pytest.approx(expect)
    assert build_schedule("broadcast", "binomial", 2, 1.0)[0].src.tolist() == [0]


A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB
OV = A / 2  # the default per-message overhead: alpha is all endpoint (o + o)


@pytest.mark.parametrize(
    "n,expected",
    [
        (1, 0.0),
        (2, A + S / B),  # 0 -> 1
        # 0 -> 1, 2, 4 at once (3 peers); then 1 -> 3 (rank 3 has no child below 5)
        (5, (A + 2 * OV + 3 * S / B) + (A + S / B)),
        # 0 -> 1, 2, 4; 1 -> 3, 5 (and 2 -> 6); 3 -> 7
        (8, (A + 2 * OV + 3 * S / B) + (A + OV + 2 * S / B) + (A + S / B)),
        # 0 -> 1, 2, 4, 8 (4 peers); 1 -> 3, 5 (and 2 -> 6); 3 -> 7
        (9, (A + 3 * OV + 4 * S / B) + (A + OV + 2 * S / B) + (A + S / B)),
    ],
)
def test_closed_form_by_hand(n, expected):
    got = float(collective_time("broadcast", "binomial", n, S, A, B))
    assert got == pytest.approx(expected, rel=1e-12)
