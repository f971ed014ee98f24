"""gloo's reduce-scatter: a full ring all-reduce, each rank keeping its chunk."""

from __future__ import annotations

import numpy as np
import pytest

from commsim.collectives.algorithms import build_schedule
from commsim.collectives.algorithms.base import traffic
from commsim.collectives.evaluate import collective_time

pytestmark = pytest.mark.filterwarnings("error")

A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB


def test_closed_form_by_hand():
    # N=4: the ring all-reduce's 2(N-1) steps of S/N, twice the ring reduce-scatter's data
    got = float(collective_time("reduce-scatter", "allreduce-ring", 4, S, A, B))
    assert got == pytest.approx(2 * 3 * A + 2 * 3 / 4 * S / B, rel=1e-12)
    ring = float(collective_time("reduce-scatter", "ring", 4, S, A, B))
    assert got - ring == pytest.approx(3 * A + 3 / 4 * S / B, rel=1e-12)


@pytest.mark.parametrize("n", [2, 5, 8])
def test_moves_what_a_ring_all_reduce_moves(n):
    sent = traffic(build_schedule("reduce-scatter", "allreduce-ring", n, S), n)[0]
    assert sent == pytest.approx(np.full(n, 2 * (n - 1) / n * S))
