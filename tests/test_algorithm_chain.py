"""NCCL's ring broadcast, a pipelined chain: hand-computed closed form and schedule."""

from __future__ import annotations

import pytest

from commsim.collectives.algorithms import build_schedule
from commsim.collectives.algorithms.base import traffic
from commsim.collectives.evaluate import collective_time

pytestmark = pytest.mark.filterwarnings("error")

A, B, S = 1e-6, 1e10, 2.0**20  # 1 us, 10 GB/s, 1 MiB


def test_closed_form_by_hand():
    # ring broadcast, N=4, 4 chunks: (k + N - 2) steps of S/k
    got = float(collective_time("broadcast", "ring", 4, S, A, B, chunks=4))
    assert got == pytest.approx((4 + 2) * (A + S / 4 / B), rel=1e-12)


@pytest.mark.parametrize("n", [2, 5, 8, 12])
def test_every_rank_but_the_last_forwards_the_buffer(n):
    sent = traffic(build_schedule("broadcast", "ring", n, S, chunks=4), n)[0]
    assert sent == pytest.approx([S] * (n - 1) + [0.0])


def test_one_pipelined_step():
    (chain,) = build_schedule("broadcast", "ring", 100, S, chunks=8)
    assert (chain.repeat, chain.stages, chain.rounds) == (8, 99, 8 + 98)
